package remoting

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
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
	budgets.mu.Lock() // the sessions' goroutines charge the budgets (records reach them through shared memory)
	charged := budgets.fns["bomb.ns1"].graph
	budgets.mu.Unlock()
	if b := charged; b > bound {
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
	testkit.Eventually(t, 60*time.Second, "the function's graph budget given back", func() bool {
		budgets.mu.Lock()
		defer budgets.mu.Unlock()
		f := budgets.fns["bomb.ns1"]
		return f == nil || f.graph == 0
	})
}

// TestQuotaHoldsAcrossSessions: a function's GPU memory quota was counted per session, so a function that started
// several processes (each its own CUDA session, up to MaxSessionsPerFunction) held its quota once per process:
// against faas-gpu up, six processes of a function with a 64 MiB quota allocated 64 MiB each. Now every session of
// the function draws on one quota: allocations (and physical allocations) past it answer
// CUDA_ERROR_OUT_OF_MEMORY, cuMemGetInfo says what the function has left, and what a session held is given back
// when it ends.
func TestQuotaHoldsAcrossSessions(t *testing.T) {
	const quota = 8 << 20
	funcs := tenants(pool.FunctionSpec{Name: "greedy.ns1", MemoryBytes: quota},
		pool.FunctionSpec{Name: "other.ns2", MemoryBytes: quota})
	r := startServerWith(t, funcs, nil)
	r.binder.bind("greedy.ns1", 0)
	r.binder.bind("other.ns2", 0)
	first, err := dialWire(t, r.sock, "greedy.ns1", "tok-greedy.ns1")
	if err != nil {
		t.Fatal(err)
	}
	mustAlloc(t, first, 6<<20)
	second, err := dialWire(t, r.sock, "greedy.ns1", "tok-greedy.ns1")
	if err != nil {
		t.Fatal(err)
	}
	defer second.close()
	if res, _, err := second.call(CallCuMemAlloc_v2, uint64(4<<20)); err != nil || res != ResultOutOfMemory {
		t.Fatalf("a second session allocating 4 MiB beside the first's 6 MiB of an 8 MiB quota: %d %v, want "+
			"CUDA_ERROR_OUT_OF_MEMORY", res, err)
	}
	res, out, err := second.call(CallCuMemGetInfo_v2)
	if err != nil || res != ResultSuccess || leU64(out) != 2<<20 || leU64(out[8:]) != quota {
		t.Fatalf("cuMemGetInfo in the second session: %d %v free %d total %d, want 2 MiB of 8", res, err,
			leU64(out), leU64(out[8:]))
	}
	prop := make([]byte, 32)
	prop[0], prop[8] = memAllocationTypePinned, memLocationTypeDevice
	if res, _, err := second.call(CallCuMemCreate, uint64(4<<20), prop, uint64(0)); err != nil ||
		res != ResultOutOfMemory {
		t.Fatalf("a physical allocation of 4 MiB in the second session: %d %v, want CUDA_ERROR_OUT_OF_MEMORY", res, err)
	}
	// Another function has its own quota.
	o, err := dialWire(t, r.sock, "other.ns2", "tok-other.ns2")
	if err != nil {
		t.Fatal(err)
	}
	defer o.close()
	mustAlloc(t, o, 6<<20)
	// The first session ends: its memory is the function's again.
	first.close()
	testkit.Eventually(t, 60*time.Second, "the first session's quota given back", func() bool {
		res, _, err := second.call(CallCuMemAlloc_v2, uint64(6<<20))
		return err == nil && res == ResultSuccess
	})
}

// ptxGlobal is a PTX module declaring one global of size bytes (initialised, so that the device writes it).
func ptxGlobal(name string, size uint64) []byte {
	return []byte(fmt.Sprintf(".version 7.0\n.target sm_50\n.address_size 64\n"+
		".visible .global .align 8 .b8 %s[%d] = {1};\n", name, size))
}

// TestModuleGlobalsCountAgainstTheQuota: a module's globals are GPU memory outside the function's segments, and
// were not counted: against faas-gpu up, a function with a 64 MiB quota loaded a module declaring a 64 GiB global
// and memset 256 MiB of it, which its tenant executor's simulated device backed with 256 MiB of host memory (on a
// real GPU, device memory no quota bounds). Now a module's data counts against the function's quota, all its
// sessions together: the 64 GiB global is refused with CUDA_ERROR_OUT_OF_MEMORY before anything is loaded, globals
// within the quota load, and an unload gives their bytes back.
func TestModuleGlobalsCountAgainstTheQuota(t *testing.T) {
	const quota = 8 << 20
	funcs := tenants(pool.FunctionSpec{Name: "bomb.ns1", MemoryBytes: quota})
	r := startServerWith(t, funcs, nil)
	r.binder.bind("bomb.ns1", 0)
	w, err := dialWire(t, r.sock, "bomb.ns1", "tok-bomb.ns1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	load := func(w *wireClient, img []byte) (uint64, Result) {
		t.Helper()
		res, out, err := w.call(CallCuModuleLoadData, img, uint64(len(img)))
		if err != nil {
			t.Fatal(err)
		}
		if len(out) < 8 {
			return 0, res
		}
		return leU64(out), res
	}
	if _, res := load(w, ptxGlobal("huge", 64<<30)); res != ResultOutOfMemory {
		t.Fatalf("a 64 GiB global in an 8 MiB quota: %d, want CUDA_ERROR_OUT_OF_MEMORY", res)
	}
	mod, res := load(w, ptxGlobal("a", 4<<20))
	if res != ResultSuccess {
		t.Fatalf("a 4 MiB global in an 8 MiB quota: %d", res)
	}
	// A second session of the function: 4 MiB more fit, then nothing (neither a global nor a block).
	w2, err := dialWire(t, r.sock, "bomb.ns1", "tok-bomb.ns1")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.close()
	if _, res := load(w2, ptxGlobal("b", 4<<20)); res != ResultSuccess {
		t.Fatalf("another 4 MiB global in a second session: %d", res)
	}
	if _, res := load(w2, ptxGlobal("c", 1)); res != ResultOutOfMemory {
		t.Fatalf("a global beyond the quota: %d, want CUDA_ERROR_OUT_OF_MEMORY", res)
	}
	if res, _, err := w2.call(CallCuMemAlloc_v2, uint64(1<<20)); err != nil || res != ResultOutOfMemory {
		t.Fatalf("a block beyond the quota the globals took: %d %v", res, err)
	}
	// An unload gives the global's bytes back.
	if res, _, err := w.call(CallCuModuleUnload, mod); err != nil || res != ResultSuccess {
		t.Fatalf("unload: %d %v", res, err)
	}
	mustAlloc(t, w2, 4<<20)
}

// TestSessionHandlesBounded: a session holds at most maxModules modules (each a driver object, its code loaded on
// the GPU again for every load of the same image), maxEvents events and maxStreams streams: against faas-gpu up, a
// function created 100,000 events and 100,000 streams in 14 s and its tenant executor grew by 21 MB, without a
// bound.
func TestSessionHandlesBounded(t *testing.T) {
	dev, xn := simNode(t, 256<<20)
	bd := &binder{current: map[string]int{"f": 0}}
	cfg := Config{Device: dev, Node: xn, Functions: registry{}, Binder: bd}
	ctx := context.Background()
	info := SessionInfo{Function: "f", Spec: pool.FunctionSpec{Name: "f", MemoryBytes: 64 << 20}}
	h, err := newDeviceHandler(ctx, cfg, info, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	img := []byte(".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k() { ret; }\n")
	if _, r := h.CuModuleLoadData(ctx, img, uint64(len(img))); r != ResultSuccess {
		t.Fatalf("a module: %d", r)
	}
	for len(h.modules) < maxModules {
		h.modules[h.handle()] = &module{loaded: map[int]loadedModule{}}
	}
	if _, r := h.CuModuleLoadData(ctx, img, uint64(len(img))); r != ResultOutOfMemory {
		t.Fatalf("module %d of a session: %d, want CUDA_ERROR_OUT_OF_MEMORY", maxModules+1, r)
	}
	for len(h.events) < maxEvents {
		h.events[h.handle()] = &event{}
	}
	if _, r := h.CuEventCreate(ctx, 0); r != ResultOutOfMemory {
		t.Fatalf("event %d of a session: %d, want CUDA_ERROR_OUT_OF_MEMORY", maxEvents+1, r)
	}
	for len(h.streams) < maxStreams {
		if _, r := h.CuStreamCreate(ctx, 0); r != ResultSuccess {
			t.Fatalf("stream %d: %d", len(h.streams)+1, r)
		}
	}
	if _, r := h.CuStreamCreate(ctx, 0); r != ResultOutOfMemory {
		t.Fatalf("stream %d of a session: %d, want CUDA_ERROR_OUT_OF_MEMORY", maxStreams+1, r)
	}
	clear(h.events) // placeholders without device events
}
