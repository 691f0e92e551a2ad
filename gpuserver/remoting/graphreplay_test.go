package remoting

import (
	"encoding/binary"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// captureOn records calls on a new stream of w that captures (the records are sent one-way, as the shim sends
// them) and returns the instantiated executable graph and the stream.
func captureOn(t *testing.T, w *wireClient, calls func(st uint64)) (exec, st uint64) {
	t.Helper()
	st = leU64(w.must(t, CallCuStreamCreate, uint64(1)))
	w.must(t, CallStreamBeginCapture, st, uint64(captureRelaxed))
	calls(st)
	g := leU64(w.must(t, CallStreamEndCapture, st))
	return leU64(w.must(t, CallCuGraphInstantiateWithFlags, g, uint64(0))), st
}

// graphLaunch launches exec on st and answers the launch's result and the next synchronisation's.
func graphLaunch(t *testing.T, w *wireClient, exec, st uint64) (launch, sync Result) {
	t.Helper()
	launch, _, err := w.call(CallCuGraphLaunch, exec, st)
	if err != nil {
		t.Fatal(err)
	}
	sync, _, err = w.call(CallCuCtxSynchronize)
	if err != nil {
		t.Fatal(err)
	}
	return launch, sync
}

// TestGraphReplayAfterFreeIsRefused: a graph's nodes were checked when they were recorded, and the device graph
// captured from them at its first launch was launched again as one operation: a function that freed a buffer its
// graph touches and launched the graph again made the GPU touch memory that was no longer its own, a fault
// (measured against faas-gpu up: CUDA_ERROR_ILLEGAL_ADDRESS, the tenant's context torn down, and before the fault
// fix its GPU out of service). Now every launch checks every node's addresses again, as the calls themselves do:
// a memset node and a kernel node whose buffer was freed answer CUDA_ERROR_INVALID_VALUE at the launch, nothing
// runs, nothing faults (no context torn down, the GPU healthy), the function's other graph and its other work go
// on, and the same graph launches again once the address is its own again.
func TestGraphReplayAfterFreeIsRefused(t *testing.T) {
	r := startServerWith(t, registry{"g.ns1": {pool.FunctionSpec{Name: "g.ns1", MemoryBytes: 256 << 20}, "tok-g"}}, nil)
	r.binder.bind("g.ns1", 1)
	w, err := dialWire(t, r.sock, "g.ns1", "tok-g")
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	add := w.vectorAdd(t)
	const n = 1024
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	a, b := w.alloc(t, 4*n), w.alloc(t, 4*n)
	w.htod(t, a, floatBytes(ones...))
	freed := w.alloc(t, 8<<20) // a block of its own: freeing it unmaps it

	memset, mst := captureOn(t, w, func(st uint64) {
		w.seq++
		if _, _, err := w.send(record(CallCuMemsetD8Async, 0, w.seq, freed, uint64(7), uint64(4096), st), false); err != nil {
			t.Fatal(err)
		}
	})
	args := make([]byte, 28)
	binary.LittleEndian.PutUint64(args, a)
	binary.LittleEndian.PutUint64(args[8:], a)
	binary.LittleEndian.PutUint64(args[16:], freed)
	binary.LittleEndian.PutUint32(args[24:], n)
	kernel, kst := captureOn(t, w, func(st uint64) {
		w.must(t, CallCuLaunchKernel, add, 4, 1, 1, 256, 1, 1, 0, st, args, uint64(len(args)))
	})
	args2 := append([]byte(nil), args...)
	binary.LittleEndian.PutUint64(args2[16:], b)
	other, ost := captureOn(t, w, func(st uint64) {
		w.must(t, CallCuLaunchKernel, add, 4, 1, 1, 256, 1, 1, 0, st, args2, uint64(len(args2)))
	})
	for _, g := range [][2]uint64{{memset, mst}, {kernel, kst}, {other, ost}} {
		if l, s := graphLaunch(t, w, g[0], g[1]); l != ResultSuccess || s != ResultSuccess {
			t.Fatalf("a launch while the buffers are the function's: %d, sync %d", l, s)
		}
	}
	w.must(t, CallCuMemFree_v2, freed)
	for _, g := range []struct {
		what       string
		exec, strm uint64
	}{{"memset", memset, mst}, {"kernel", kernel, kst}} {
		for i := 0; i < 2; i++ {
			// The launch is asynchronous: its error is the launch's answer and the next synchronisation's.
			if l, s := graphLaunch(t, w, g.exec, g.strm); l != ResultInvalidValue || s != ResultInvalidValue {
				t.Fatalf("the %s graph launched after its buffer was freed: %d, sync %d; want %d (invalid value), "+
					"not a fault", g.what, l, s, ResultInvalidValue)
			}
			if r, _, err := w.call(CallCuCtxSynchronize); err != nil || r != ResultSuccess {
				t.Fatalf("the synchronisation after the refused %s graph's: %d %v", g.what, r, err)
			}
		}
	}
	st := r.node.Status()
	for _, g := range st {
		if !g.Healthy || g.ContextFaults != 0 {
			t.Fatalf("gpu %d after the refused launches: healthy %v, %d context faults", g.GPU, g.Healthy,
				g.ContextFaults)
		}
	}
	if l, s := graphLaunch(t, w, other, ost); l != ResultSuccess || s != ResultSuccess {
		t.Fatalf("the function's other graph: %d, sync %d", l, s)
	}
	if res, out := w.dtoh(t, b, 8); res != ResultSuccess || binary.LittleEndian.Uint32(out) != 0x40000000 {
		t.Fatalf("the other graph's result: %d %x, want 2.0", res, out)
	}
}
