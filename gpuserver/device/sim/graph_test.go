package sim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// TestStreamCaptureRecordsAndReplays: a capturing stream records its launches and memsets without running them; the
// graph, launched on another stream of the GPU three times, runs them in order each time (c = a + b, then b = c by a
// vector_add with a zeroed a), computed by the reference kernels; a copy from the host cannot be captured.
func TestStreamCaptureRecordsAndReplays(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	mod, err := b.LoadModule(0, kernels.PTX())
	must(t, err)
	capture, err := b.NewStream(0)
	must(t, err)
	run, err := b.NewStream(0)
	must(t, err)
	const n = 256
	mem := mapOn(t, b, 0, 2<<20)
	a, bb, c, zero := mem, mem+4*n, mem+8*n, mem+12*n
	av := make([]float32, n)
	for i := range av {
		av[i] = float32(i)
	}
	must(t, run.CopyHtoD(a, f32bytes(av)))
	must(t, run.CopyHtoD(bb, f32bytes(av)))
	must(t, run.Memset8(zero, 0, 4*n))
	must(t, run.Synchronize(ctx))

	gc := capture.(device.GraphCapture)
	must(t, gc.BeginCapture())
	va, _ := mod.Function("vector_add")
	add, _ := device.PackArgs(va.Params(), a, bb, c, uint32(n))
	must(t, capture.Launch(va, device.Dim3{X: 1}, device.Dim3{X: n}, 0, add))
	copyBack, _ := device.PackArgs(va.Params(), zero, c, bb, uint32(n))
	must(t, capture.Launch(va, device.Dim3{X: 1}, device.Dim3{X: n}, 0, copyBack))
	if err := capture.CopyHtoD(a, f32bytes(av)); !errors.Is(err, device.ErrNotSupported) {
		t.Fatalf("a copy from the host in a capture: %v", err)
	}
	if _, err := gc.EndCapture(); err == nil {
		t.Fatal("a capture that could not hold a call ended with a graph")
	}
	must(t, gc.BeginCapture())
	must(t, capture.Launch(va, device.Dim3{X: 1}, device.Dim3{X: n}, 0, add))
	must(t, capture.Launch(va, device.Dim3{X: 1}, device.Dim3{X: n}, 0, copyBack))
	g, err := gc.EndCapture()
	must(t, err)
	out := make([]byte, 4*n)
	must(t, run.CopyDtoH(out, c))
	must(t, run.Synchronize(ctx))
	for i, v := range bytesF32(out) {
		if v != 0 {
			t.Fatalf("c[%d] = %v after the capture: the capture ran its work", i, v)
		}
	}
	for range 3 {
		must(t, run.(device.GraphCapture).LaunchGraph(g))
	}
	must(t, run.CopyDtoH(out, c))
	must(t, run.Synchronize(ctx))
	for i, v := range bytesF32(out) { // c = a + b, then b = c: i+i, i+2i, i+3i
		if want := av[i] * 4; v != want {
			t.Fatalf("c[%d] = %v after 3 launches, want %v", i, v, want)
		}
	}
	must(t, g.Destroy())
}
