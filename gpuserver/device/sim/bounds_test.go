package sim_test

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// TestOversizedLaunchesAllocateNothing: a reference kernel's sizes come from its launch (grid and 32-bit
// arguments), so a launch can name gigabytes over a few mapped bytes. Before, one matmul launch allocated
// 4*m*k bytes of host memory before checking any address, and the process died. Now a launch whose work exceeds
// Options.MaxKernelOps is refused at once (ErrKernelTooLarge), and a launch whose ranges are not mapped faults
// (CUDA_ERROR_ILLEGAL_ADDRESS at synchronisation) before the sim allocates anything for it.
func TestOversizedLaunchesAllocateNothing(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	mod, err := b.LoadModule(0, kernels.PTX())
	must(t, err)
	s, _ := b.NewStream(0)
	p := mapOn(t, b, 0, 2<<20) // 2 MiB mapped
	mm, _ := mod.Function("matmul")
	va, _ := mod.Function("vector_add")
	lin, _ := mod.Function("linear")
	huge := device.Dim3{X: 1 << 16, Y: 1 << 16, Z: 1}
	block := device.Dim3{X: 1024, Y: 1, Z: 1}

	// m = n = k = 2^32-1 over the whole grid: 2^96 multiply-adds, refused at the launch.
	args, _ := device.PackArgs(mm.Params(), p, p, p, ^uint32(0), ^uint32(0), ^uint32(0))
	if err := s.Launch(mm, huge, device.Dim3{X: 32, Y: 32, Z: 1}, 0, args); !errors.Is(err, sim.ErrKernelTooLarge) {
		t.Fatalf("matmul of 2^96 multiply-adds: %v, want ErrKernelTooLarge", err)
	}

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// Within the work bound, but naming ranges far beyond what is mapped: each faults without a large allocation.
	cases := []struct {
		name string
		f    device.Function
		args []any
		grid device.Dim3
	}{
		// a row of 2^30 values: 4 GiB read from a 2 MiB mapping (rows = 1, n = 1, k = 2^30)
		{"matmul k=2^30", mm, []any{p, p, p, uint32(1), uint32(1), uint32(1 << 30)}, device.Dim3{X: 1, Y: 1, Z: 1}},
		// c of 1 x 2^30 values (n = 2^30, k = 1): 4 GiB written
		{"linear n=2^30", lin, []any{p, p, device.Ptr(0), p, uint32(1), uint32(1 << 30), uint32(1)}, huge},
		// 2^32-1 elements over three 16 GiB ranges
		{"vector_add n=2^32-1", va, []any{p, p, p, ^uint32(0)}, huge},
	}
	for _, c := range cases {
		args, err := device.PackArgs(c.f.Params(), c.args...)
		must(t, err)
		if err := s.Launch(c.f, c.grid, block, 0, args); err != nil {
			t.Fatalf("%s: launch refused (%v); it is within the work bound and must fault instead", c.name, err)
		}
		if err := s.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
			t.Fatalf("%s: %v, want an illegal address", c.name, err)
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("the oversized launches allocated %d MiB of host memory", grew>>20)
	}
	// The stream works on: a launch within bounds computes.
	fl, _ := mod.Function("fill")
	args, _ = device.PackArgs(fl.Params(), p, float32(3), uint32(4))
	must(t, s.Launch(fl, device.Dim3{X: 1}, device.Dim3{X: 4}, 0, args))
	out := make([]byte, 16)
	must(t, s.CopyDtoH(out, p))
	must(t, s.Synchronize(ctx))
	if v := bytesF32(out); v[3] != 3 {
		t.Fatalf("fill after the faults: %v", v)
	}
}
