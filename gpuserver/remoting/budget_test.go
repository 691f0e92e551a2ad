package remoting

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// captureGraph records nodes memsets of buf on a new stream of w and returns the graph.
func captureGraph(t *testing.T, w *wireClient, buf uint64, nodes int) (graph uint64, res Result) {
	t.Helper()
	r, out, err := w.call(CallCuStreamCreate, uint64(1))
	if err != nil || r != ResultSuccess {
		t.Fatalf("cuStreamCreate: %d %v", r, err)
	}
	st := leU64(out)
	if r, _, err := w.call(CallStreamBeginCapture, st, uint64(captureRelaxed)); err != nil || r != ResultSuccess {
		t.Fatalf("begin capture: %d %v", r, err)
	}
	for range nodes {
		w.seq++
		if _, _, err := w.send(record(CallCuMemsetD8Async, 0, w.seq, buf, uint64(1), uint64(16), st), false); err != nil {
			t.Fatal(err)
		}
	}
	r, out, err = w.call(CallStreamEndCapture, st)
	if err != nil {
		t.Fatal(err)
	}
	if r != ResultSuccess {
		return 0, r
	}
	return leU64(out), r
}

// TestGraphsBoundedPerFunction: executable graphs copy their graph's nodes, so one capture of many nodes
// instantiated again and again grew the process that runs the function's sessions (the gpuserver, or its tenant's
// executor) by about 2.7 MB per call, 11 GB per session of 4,096 calls and 64 sessions per function: a function
// took the node down within seconds (measured against faas-gpu up: 100 instantiations, 0.3 s, +272 MB). Now
// captures, graphs and executable graphs are charged to the function, all its sessions together, and the call past
// MaxGraphBytesPerFunction answers CUDA_ERROR_OUT_OF_MEMORY; a session's end gives its share back, and another
// function is not affected.
func TestGraphsBoundedPerFunction(t *testing.T) {
	funcs := tenants(pool.FunctionSpec{Name: "bomb.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "other.ns2", MemoryBytes: 64 << 20})
	r := startServerWith(t, funcs, nil) // the default bound
	r.binder.bind("bomb.ns1", 0)
	r.binder.bind("other.ns2", 1)
	budgets := r.srv.cfg.budgets
	const nodes = 16384
	perExec := uint64(nodes) * graphNodeOverhead
	var sessions []*wireClient
	var made int
	for s := range 2 {
		w, err := dialWire(t, r.sock, "bomb.ns1", "tok-bomb.ns1")
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, w)
		g, res := captureGraph(t, w, mustAlloc(t, w, 1<<20), nodes)
		if res != ResultSuccess {
			if s == 0 {
				t.Fatalf("the first capture: %d", res)
			}
			break // the second session's capture is already beyond the bound
		}
		for range 160 {
			res, _, err := w.call(CallCuGraphInstantiateWithFlags, g, uint64(0))
			if err != nil {
				t.Fatal(err)
			}
			if res == ResultOutOfMemory {
				break
			}
			if res != ResultSuccess {
				t.Fatalf("instantiate: %d", res)
			}
			made++
		}
	}
	const bound = 256 << 20 // the documented default
	if limit := int(bound / perExec); made > limit {
		t.Fatalf("%d executable graphs of %d nodes instantiated by two sessions, want at most %d "+
			"(MaxGraphBytesPerFunction %d)", made, nodes, limit, bound)
	}
	if b := budgets.fns["bomb.ns1"].graph; b > bound {
		t.Fatalf("the function's graphs are charged %d bytes, bound %d", b, bound)
	}
	// Another function captures and instantiates beside it.
	o, err := dialWire(t, r.sock, "other.ns2", "tok-other.ns2")
	if err != nil {
		t.Fatal(err)
	}
	defer o.close()
	g, res := captureGraph(t, o, mustAlloc(t, o, 1<<20), 16)
	if res != ResultSuccess {
		t.Fatalf("another function's capture: %d", res)
	}
	if res, _, err := o.call(CallCuGraphInstantiateWithFlags, g, uint64(0)); err != nil || res != ResultSuccess {
		t.Fatalf("another function's instantiation: %d %v", res, err)
	}
	// The bomb's sessions end: what they held is given back.
	for _, w := range sessions {
		w.close()
	}
	eventually(t, "the function's graph budget given back", func() bool {
		budgets.mu.Lock()
		defer budgets.mu.Unlock()
		f := budgets.fns["bomb.ns1"]
		return f == nil || f.graph == 0
	})
}
