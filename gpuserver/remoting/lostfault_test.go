package remoting

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// A fault of work queued under the implicit binding may be found by a wait that no call answers: the idle
// release, the switch to a request's binding, the end of a long implicit hold. The function's next call answers
// it (CUDA_ERROR_ILLEGAL_ADDRESS), never success. Each of these waits discarded the fault: the next
// cuCtxSynchronize answered CUDA_SUCCESS after the kernel faulted (seen in a full `make test` run, when the
// session went idle between a launch and its synchronisation), or the next call ran on a fresh copy restored from
// the image as if nothing had happened.

// launchOnly queues vector_add over n floats (c = a + b) and fails the test unless the launch is accepted.
func (w *wireClient) launchOnly(t *testing.T, f, a, b, c uint64, n uint32) {
	t.Helper()
	args := make([]byte, 28)
	binary.LittleEndian.PutUint64(args, a)
	binary.LittleEndian.PutUint64(args[8:], b)
	binary.LittleEndian.PutUint64(args[16:], c)
	binary.LittleEndian.PutUint32(args[24:], n)
	w.must(t, CallCuLaunchKernel, f, 1, 1, 1, 256, 1, 1, 0, uint64(0), args, uint64(len(args)))
}

func (b *binder) releases() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.released
}

func (b *binder) unbind(function string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.current, function)
}

// TestFaultFoundAtTheIdleReleaseIsAnswered: a function still initialising launches a kernel reading an unmapped
// address under its implicit binding; the session goes idle and releases the binding (waiting for the kernel,
// which faults) before the function synchronises. Its synchronisation answers the fault.
func TestFaultFoundAtTheIdleReleaseIsAnswered(t *testing.T) {
	r := startServerWith(t, tenants(pool.FunctionSpec{Name: "early.ns3", MemoryBytes: 64 << 20}), nil)
	e, err := dialWire(t, r.sock, "early.ns3", "tok-early.ns3")
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	r.binder.mu.Lock()
	r.binder.implicit = 2
	r.binder.mu.Unlock()
	add := e.vectorAdd(t)
	p := e.alloc(t, 1024)
	before := r.binder.releases()
	e.launchOnly(t, add, 0x1000, p, p, 4)
	testkit.Eventually(t, 60*time.Second, "the implicit binding released while idle",
		func() bool { return r.binder.releases() > before })
	if res, _, err := e.call(CallCuCtxSynchronize); err != nil || res != ResultIllegalAddress {
		t.Fatalf("synchronising after the idle release found the fault: %d %v, want CUDA_ERROR_ILLEGAL_ADDRESS",
			res, err)
	}
	if res, _, err := e.call(CallCuMemAlloc_v2, uint64(1024)); err != nil || res != ResultContextIsDestroyed {
		t.Fatalf("early allocating after losing its memory: %d %v, want CUDA_ERROR_CONTEXT_IS_DESTROYED", res, err)
	}
}

// initialised dials fn, loads a model of weights under an implicit binding on gpu 0 and ends its initialisation
// with a request there; the request then ends (calls run under implicit bindings again).
func initialised(t *testing.T, r *wireRig, fn string, weights []byte) (*wireClient, uint64, uint64) {
	t.Helper()
	w, err := dialWire(t, r.sock, fn, "tok-"+fn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	add := w.vectorAdd(t)
	p := w.alloc(t, uint64(len(weights)))
	w.htod(t, p, weights)
	r.binder.bind(fn, 0)
	if res, got := w.dtoh(t, p, uint64(len(weights))); res != ResultSuccess || string(got) != string(weights) {
		t.Fatalf("%s: its model after the initialisation: %d", fn, res)
	}
	if !r.node.Captured(fn) {
		t.Fatalf("%s: no image after its first request", fn)
	}
	r.binder.unbind(fn)
	return w, add, p
}

// TestFaultFoundAtTheRequestsBindingIsAnswered: a kernel launched outside a request faults; the next call comes
// under a request's binding, whose switch from the implicit binding waits for that kernel. The call answers the
// fault; the call after it reads the model restored from its image.
func TestFaultFoundAtTheRequestsBindingIsAnswered(t *testing.T) {
	r := startServerWith(t, tenants(pool.FunctionSpec{Name: "a.ns1", MemoryBytes: 64 << 20}),
		func(c *Config) { c.IdleRelease = time.Hour }) // the switch, not an idle release, finds the fault
	weights := floatBytes(1, 2, 3, 4, 5, 6, 7, 8)
	a, add, p := initialised(t, r, "a.ns1", weights)
	a.launchOnly(t, add, 0x1000, p, p, 8) // outside a request: under an implicit binding
	r.binder.bind("a.ns1", 0)
	if res, _ := a.dtoh(t, p, uint64(len(weights))); res != ResultIllegalAddress {
		t.Fatalf("the request's first call after the fault: %d, want CUDA_ERROR_ILLEGAL_ADDRESS", res)
	}
	if res, got := a.dtoh(t, p, uint64(len(weights))); res != ResultSuccess || string(got) != string(weights) {
		t.Fatalf("a's model after the fault: result %d", res)
	}
}

// TestFaultFoundAtTheEndOfAnImplicitHoldIsAnswered: the implicit binding is given up after MaxImplicitHold, at
// the next call, waiting for the work queued under it; a fault of that work is that call's answer.
func TestFaultFoundAtTheEndOfAnImplicitHoldIsAnswered(t *testing.T) {
	r := startServerWith(t, tenants(pool.FunctionSpec{Name: "a.ns1", MemoryBytes: 64 << 20}),
		func(c *Config) { c.IdleRelease, c.MaxImplicitHold = time.Hour, time.Nanosecond })
	weights := floatBytes(1, 2, 3, 4, 5, 6, 7, 8)
	a, add, p := initialised(t, r, "a.ns1", weights)
	a.launchOnly(t, add, 0x1000, p, p, 8)
	if res, _ := a.dtoh(t, p, uint64(len(weights))); res != ResultIllegalAddress {
		t.Fatalf("the call after the fault, which ends the implicit hold: %d, want CUDA_ERROR_ILLEGAL_ADDRESS", res)
	}
	if res, got := a.dtoh(t, p, uint64(len(weights))); res != ResultSuccess || string(got) != string(weights) {
		t.Fatalf("a's model after the fault: result %d", res)
	}
}
