package executor_test

import (
	"context"
	"os"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestCUDASwapComputeEvictSwapAgain is the sim's correctness test on the real driver (make gpu-test): capture a
// model, evict it, swap it in from host, compute on it, evict, swap in again and read back equal bytes at unchanged
// addresses; with two peer-capable GPUs also swap GPU to GPU.
func TestCUDASwapComputeEvictSwapAgain(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	dev, err := cuda.Open("")
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CUDA=1 but the driver cannot be opened: %v", err)
	}
	r := newRigOn(t, dev, false)
	ctx := context.Background()
	t.Logf("GPU: %s (%d GPUs)", dev.GPUs()[0].Name, len(dev.GPUs()))
	m := initModel(t, r, "mlp", 0, 1000, 5<<20, 3<<20)
	segs, _ := r.node.Segments("mlp")
	must(t, r.node.Evict(ctx, "mlp", 0))
	must(t, r.node.SwapIn(ctx, "mlp", 0, executor.Host))
	verify(t, r, m, 0)

	b, err := r.node.Acquire(ctx, "mlp", -1, executor.Host)
	must(t, err)
	scratch, err := r.node.Alloc(ctx, "mlp", 4000)
	must(t, err)
	checkVectorAdd(t, ctx, r, "mlp", 0, m, scratch)
	b.Release()
	must(t, r.node.Evict(ctx, "mlp", 0))
	must(t, r.node.SwapIn(ctx, "mlp", 0, executor.Host))
	verify(t, r, m, 0)
	if len(dev.GPUs()) > 1 && dev.CanAccessPeer(1, 0) {
		must(t, r.node.SwapIn(ctx, "mlp", 1, 0))
		verify(t, r, m, 1)
	} else {
		t.Log("single GPU (or no peer access): the GPU-to-GPU path is covered by device-to-device copies in " +
			"gpuserver/device/cuda")
	}
	after, _ := r.node.Segments("mlp")
	for i := range segs {
		if after[i] != segs[i] {
			t.Fatalf("segment %d moved: %+v -> %+v", i, segs[i], after[i])
		}
	}
	must(t, r.node.Deregister(ctx, "mlp"))
}
