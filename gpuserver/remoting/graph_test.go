package remoting

import (
	"fmt"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestGraphCaptureAndReplay runs testdata/graphfn through the C shim against the server on the simulated node,
// whose reference kernels compute every replay: the capture queries answer the real state, capturing runs nothing,
// each launch replays the recorded kernels, memset and copy in order (three launches carry state from one to the
// next), the same executable graph replays on another GPU after the function moved there, an update takes a new
// scale, and a capture holding a host-to-device copy is invalidated.
func TestGraphCaptureAndReplay(t *testing.T) {
	s := startServer(t, registry{"graphfn": {pool.FunctionSpec{Name: "graphfn", MemoryBytes: 256 << 20}, "tok-g"}})
	d := startFunction(t, s, "graphfn", "testdata/graphfn")
	const n = 1024
	a, b := make([]float32, n), make([]float32, n)
	for i := range a {
		a[i], b[i] = float32(i), float32(2*i)
	}
	if r := d.call(t, map[string]any{"nodes": true}); r.StatusCode != 200 || r.Body["nodes"] != float64(4) ||
		r.Body["capturing"] != float64(1) || r.Body["after"] != float64(0) {
		t.Fatalf("graph: %v", r.Body)
	}
	check := func(what string, r fnResult, wantC func(i int) float32) {
		t.Helper()
		if r.StatusCode != 200 {
			t.Fatalf("%s: %d %v", what, r.StatusCode, r.Body)
		}
		c, ga, gb := floats(t, r.Body["c"]), floats(t, r.Body["a"]), floats(t, r.Body["b"])
		for i := 0; i < n; i++ {
			if w := wantC(i); c[i] != float64(w) || gb[i] != float64(w) || ga[i] != 0 {
				t.Fatalf("%s: element %d: c %v b %v a %v, want c = b = %v and a = 0", what, i, c[i], gb[i], ga[i], w)
			}
		}
	}
	for _, gpu := range []int{0, 2} {
		s.binder.bind("graphfn", gpu)
		// One launch: c = (a + b) * 2. Three: a is 0 after the first, so c = b * 2 twice more: (a+b) * 8.
		check(fmt.Sprintf("gpu %d, one launch", gpu), d.call(t, map[string]any{"a": a, "b": b}),
			func(i int) float32 { return (a[i] + b[i]) * 2 })
		check(fmt.Sprintf("gpu %d, three launches", gpu), d.call(t, map[string]any{"a": a, "b": b, "launches": 3}),
			func(i int) float32 { return (a[i] + b[i]) * 8 })
	}
	if r := d.call(t, map[string]any{"update": -0.5}); r.Body["update"] != float64(0) || r.Body["result"] != float64(0) {
		t.Fatalf("update: %v", r.Body)
	}
	check("after the update", d.call(t, map[string]any{"a": a, "b": b}), func(i int) float32 { return (a[i] + b[i]) * -0.5 })
	// The copy is fire-and-forget: the capture's end reports it (the driver answers the copy itself).
	r := d.call(t, map[string]any{"invalid": true})
	if r.Body["copy"] != float64(0) || r.Body["end"] != float64(ResultStreamCaptureInvalidated) ||
		r.Body["graph"] != float64(0) {
		t.Fatalf("capture with a host-to-device copy: %v", r.Body)
	}
	check("after the invalid capture", d.call(t, map[string]any{"a": a, "b": b}), func(i int) float32 { return (a[i] + b[i]) * -0.5 })
}

// TestCaptureIsBounded: a capture past its node or byte budget is invalidated (its end answers
// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) and keeps no more than the budget.
func TestCaptureIsBounded(t *testing.T) {
	c := &capture{}
	for i := 0; i < maxGraphNodes+10; i++ {
		c.record(graphNode{kind: "kernel"})
	}
	if c.invalid == nil || len(c.nodes) != maxGraphNodes {
		t.Fatalf("nodes past the limit: %d kept, invalid %v", len(c.nodes), c.invalid)
	}
	c = &capture{}
	c.record(graphNode{kind: "kernel", bytes: maxGraphBytes})
	c.record(graphNode{kind: "kernel", bytes: 1})
	if c.invalid == nil || len(c.nodes) != 1 {
		t.Fatalf("bytes past the limit: %d kept, invalid %v", len(c.nodes), c.invalid)
	}
}
