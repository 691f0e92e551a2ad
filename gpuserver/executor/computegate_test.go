package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// A function holding a compute share gets its stream through its gate (its launches are counted against its
// tokens and give right answers); a function bound exclusively gets the executor's stream itself, untouched.
func TestComputeGateWrapsSharedFunctionsOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node, err := topology.Preset("v100x4")
	must(t, err)
	node, err = node.WithGPUMemory(64 << 20)
	must(t, err)
	dev, err := sim.New(sim.Options{Node: node})
	must(t, err)
	reg, err := compute.NewRegistry(ctx, len(node.GPUs), compute.Config{Clock: sim.WallClock{}})
	must(t, err)
	ran := make(chan error, 1)
	go func() { ran <- reg.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	mem, err := memory.New(dev, memory.Config{Share: 1, MaxBytesPerGPU: 256 << 20})
	must(t, err)
	repo, err := repository.Open(repository.Config{Dir: shmDir(t), Registrar: dev})
	must(t, err)
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, ComputeGate: reg.Wrap})
	must(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		if err := n.Close(cctx); err != nil {
			t.Error(err)
		}
		_ = repo.Close()
		_ = dev.Close(cctx)
	})
	r := &rig{dev: dev, mem: mem, repo: repo, node: n}
	shared := initModel(t, r, "shared", 0, 1000, 4000, 4000)
	initModel(t, r, "alone", 0, 1000)

	g, err := reg.Bind("shared", 0, 0.5, 1)
	must(t, err)
	defer reg.Unbind("shared", 0)
	b, err := n.Acquire(ctx, "shared", 0, executor.Host)
	must(t, err)
	defer b.Release()
	s, err := n.Stream("shared")
	must(t, err)
	if _, plain := s.(*executor.Stream); plain {
		t.Fatal("the shared function's stream is not gated")
	}
	if _, ok := s.(device.ExtendedLauncher); !ok {
		t.Fatal("the gated stream lost the executor's extended launches")
	}
	scratch, err := n.Alloc(ctx, "shared", 4000)
	must(t, err)
	checkVectorAdd(t, ctx, r, "shared", 0, shared, scratch)
	if sh := reg.Arbiter(0).Shares(); len(sh) != 1 || sh[0].Binding != g.Binding() || sh[0].Launches != 1 || sh[0].Used <= 0 {
		t.Fatalf("arbiter after one gated launch: %+v, want one launch with its GPU time measured", sh)
	}

	ba, err := n.Acquire(ctx, "alone", 0, executor.Host)
	must(t, err)
	defer ba.Release()
	sa, err := n.Stream("alone")
	must(t, err)
	if _, plain := sa.(*executor.Stream); !plain {
		t.Fatalf("the exclusive function's stream is a %T, want the executor's own (no gate)", sa)
	}
}
