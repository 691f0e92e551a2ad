package remoting

import (
	"context"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// simNode builds a simulated v100x4 node with its memory manager (bytesPerGPU reserved per GPU), host repository
// and executors, all closed when the test ends (after any cleanup registered later, such as a server's).
func simNode(t *testing.T, bytesPerGPU uint64) (*sim.Backend, *executor.Node) {
	t.Helper()
	return simNodeOf(t, "v100x4", sim.KernelsReference, bytesPerGPU)
}

// simNodeOf is simNode on the topology preset with kernels in the given mode.
func simNodeOf(t *testing.T, preset string, kernels sim.KernelMode, bytesPerGPU uint64) (*sim.Backend, *executor.Node) {
	t.Helper()
	node, err := topology.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: node, Kernels: kernels})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the executors built on it (cleanups run last first)
		if err := dev.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return dev, simNodeOn(t, dev, bytesPerGPU)
}

// simNodeOn builds the executors on dev (a simulated node, or a test's wrapper of one); closing dev is the caller's.
func simNodeOn(t *testing.T, dev device.Backend, bytesPerGPU uint64) *executor.Node {
	t.Helper()
	mem, err := memory.New(dev, memory.Config{MaxBytesPerGPU: bytesPerGPU})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := repository.Open(repository.Config{Dir: t.TempDir(), Registrar: dev})
	if err != nil {
		t.Fatal(err)
	}
	xn, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, err := range []error{xn.Close(ctx), repo.Close(), mem.Close(ctx)} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	return xn
}
