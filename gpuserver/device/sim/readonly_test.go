package sim_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// TestKernelWritesIntoReadOnlyMemoryFault: memory mapped read-only (SetAccessReadOnly, as a chunk shared between
// functions) refuses the writes of kernels as it refuses copies and memsets: every reference kernel whose output
// lies in it faults (ErrIllegalAddress, a context fault as on a GPU), launched directly or replayed from a captured
// graph, and leaves it unchanged; kernels that only read it compute as before. A dry launch (a kernel the sim does
// not compute, --sim-kernels=dry) cannot know what it writes: it is accepted, and changes nothing.
func TestKernelWritesIntoReadOnlyMemoryFault(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{Node: preset(t, "h100x8"), Kernels: sim.KernelsDry})
	const g = sim.DefaultGranularity
	const n = 256
	ro, rw := mapOn(t, b, 0, g), mapOn(t, b, 0, g)
	s, err := b.NewStream(0)
	must(t, err)
	defer s.Destroy()
	weights := make([]float32, n)
	for i := range weights {
		weights[i] = float32(i) + 0.5
	}
	must(t, s.CopyHtoD(ro, f32bytes(weights)))
	must(t, s.Synchronize(ctx))
	must(t, b.SetAccessReadOnly(ro, g, []int{0}))
	mod, err := b.LoadModule(0, kernels.PTX())
	must(t, err)
	fn := func(name string) device.Function {
		f, err := mod.Function(name)
		must(t, err)
		return f
	}
	launch := func(st device.Stream, name string, grid, block device.Dim3, args ...any) error {
		f := fn(name)
		a, err := device.PackArgs(f.Params(), args...)
		must(t, err)
		return st.Launch(f, grid, block, 0, a)
	}
	unchanged := func(what string) {
		t.Helper()
		out := make([]byte, 4*n)
		must(t, s.CopyDtoH(out, ro))
		must(t, s.Synchronize(ctx))
		if !bytes.Equal(out, f32bytes(weights)) {
			t.Fatalf("%s changed read-only memory", what)
		}
	}
	one, line := device.Dim3{X: 1}, device.Dim3{X: n}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"fill into it", func() error { return launch(s, "fill", one, line, ro, float32(7), uint32(n)) }},
		{"scale in place", func() error { return launch(s, "scale", one, line, ro, float32(2), uint32(n)) }},
		{"vector_add into it", func() error { return launch(s, "vector_add", one, line, rw, rw, ro, uint32(n)) }},
		{"relu into it", func() error { return launch(s, "relu", one, line, rw, ro, uint32(n)) }},
		{"matmul into it", func() error {
			return launch(s, "matmul", device.Dim3{X: 1}, device.Dim3{X: 16, Y: 16}, rw, rw, ro, uint32(16),
				uint32(16), uint32(1))
		}},
		{"linear into it", func() error {
			return launch(s, "linear", device.Dim3{X: 1}, device.Dim3{X: 16, Y: 16}, rw, rw, device.Ptr(0), ro,
				uint32(16), uint32(16), uint32(1))
		}},
	} {
		must(t, c.run())
		if err := s.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) || !device.IsContextFault(err) {
			t.Fatalf("%s: %v, want a fault (ErrIllegalAddress)", c.name, err)
		}
		unchanged(c.name)
	}

	// Reading it is fine: rw = ro + ro.
	must(t, launch(s, "vector_add", one, line, ro, ro, rw, uint32(n)))
	out := make([]byte, 4*n)
	must(t, s.CopyDtoH(out, rw))
	must(t, s.Synchronize(ctx))
	for i, v := range bytesF32(out) {
		if v != 2*weights[i] {
			t.Fatalf("rw[%d] = %v, want %v", i, v, 2*weights[i])
		}
	}

	// A captured graph's kernel is checked when the graph runs.
	capture, err := b.NewStream(0)
	must(t, err)
	defer capture.Destroy()
	gc := capture.(device.GraphCapture)
	must(t, gc.BeginCapture())
	must(t, launch(capture, "fill", one, line, ro, float32(9), uint32(n)))
	graph, err := gc.EndCapture()
	must(t, err)
	defer graph.Destroy()
	must(t, s.(device.GraphCapture).LaunchGraph(graph))
	if err := s.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("a replayed fill into read-only memory: %v, want ErrIllegalAddress", err)
	}
	unchanged("a replayed fill")

	// A dry launch computes nothing: it cannot know what it writes, so it is accepted.
	dry, err := b.LoadModule(0, []byte(".version 8.0\n.target sm_90\n.address_size 64\n"+
		".visible .entry opaque(.param .u64 out, .param .u32 n)\n{\n\tret;\n}\n"))
	must(t, err)
	f, err := dry.Function("opaque")
	must(t, err)
	a, err := device.PackArgs(f.Params(), ro, uint32(n))
	must(t, err)
	must(t, s.Launch(f, one, line, 0, a))
	must(t, s.Synchronize(ctx))
	unchanged("a dry launch")
}
