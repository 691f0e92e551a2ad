package handoff

import (
	"context"
	"errors"
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

// TestComputeSharesAnswerOnTheNode: OpComputeShares over a control socket reaches the executor's Node: a function
// granted a share gets its stream through its gate (an exclusive one does not), a period's grant is answered with
// what the gate saw, and a grant beyond the GPU is refused with the Node's error.
func TestComputeSharesAnswerOnTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: spec})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(dev, memory.Config{Share: 1, MaxBytesPerGPU: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := repository.Open(repository.Config{Dir: t.TempDir(), Registrar: dev})
	if err != nil {
		t.Fatal(err)
	}
	node, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = node.Close(ctx)
		_ = repo.Close()
		_ = mem.Close(ctx)
		_ = dev.Close(ctx)
	}()
	mine, theirs, err := Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	other, err := FileConn(theirs)
	theirs.Close()
	if err != nil {
		t.Fatal(err)
	}
	exec := NewPeer(other, Routes(ToExecutor, PlaneRoutes(func() executor.DataPlane { return node })...), Codes, nil)
	go func() { _ = exec.Serve(ctx) }()
	gpuserver := NewPeer(mine, nil, Codes, nil)
	go func() { _ = gpuserver.Serve(ctx) }()
	defer func() { _ = gpuserver.Close(); <-exec.Done(); <-gpuserver.Done() }()

	grant := compute.Grant{Binding: "shared", Request: 0.5, Limit: 0.5, Share: 0.5, State: compute.StateIdle}
	if _, err := OpComputeShares.Call(ctx, gpuserver, compute.Allotment{GPU: 0, Period: time.Hour,
		Grants: []compute.Grant{grant}}); err != nil {
		t.Fatal(err)
	}
	stream := func(fn string) device.Stream {
		t.Helper()
		if err := node.Register(fn); err != nil {
			t.Fatal(err)
		}
		b, err := node.Acquire(ctx, fn, 0, executor.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		st, err := node.Stream(fn)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if _, plain := stream("shared").(*executor.Stream); plain {
		t.Fatal("the function granted a share got its stream ungated")
	}
	if _, plain := stream("alone").(*executor.Stream); !plain {
		t.Fatal("a function granted nothing got a gated stream")
	}
	rep, err := OpComputeShares.Call(ctx, gpuserver, compute.Allotment{GPU: 0, Period: time.Hour, Issue: true,
		Grants: []compute.Grant{grant}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Usage) != 1 || rep.Usage[0].Binding != "shared" {
		t.Fatalf("a period's grant answered %+v, want the shared binding's usage", rep)
	}
	over := grant
	over.Binding, over.Request, over.Limit, over.Share = "more", 0.6, 0.6, 0.6
	if _, err := OpComputeShares.Call(ctx, gpuserver, compute.Allotment{GPU: 0, Issue: true,
		Grants: []compute.Grant{grant, over}}); !errors.Is(err, executor.ErrInvalid) {
		t.Fatalf("grants summing to 1.1 of the GPU: %v, want executor.ErrInvalid", err)
	}
}
