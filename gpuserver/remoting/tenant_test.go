package remoting

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// must calls and fails the test unless the call succeeds.
func (w *wireClient) must(t *testing.T, id CallID, args ...any) []byte {
	t.Helper()
	r, out, err := w.call(id, args...)
	if err != nil || r != ResultSuccess {
		t.Fatalf("%s: result %d, %v", id, r, err)
	}
	return out
}

func (w *wireClient) alloc(t *testing.T, n uint64) uint64 {
	t.Helper()
	return leU64(w.must(t, CallCuMemAlloc_v2, n))
}

func (w *wireClient) htod(t *testing.T, p uint64, b []byte) {
	t.Helper()
	w.must(t, CallCuMemcpyHtoD_v2, p, b, uint64(len(b)))
}

// dtoh reads n bytes at p; the result tells whether the call was allowed.
func (w *wireClient) dtoh(t *testing.T, p, n uint64) (Result, []byte) {
	t.Helper()
	r, out, err := w.call(CallCuMemcpyDtoH_v2, n, p, n)
	if err != nil {
		t.Fatal(err)
	}
	if r != ResultSuccess {
		return r, nil
	}
	return r, out[8 : 8+n]
}

// vectorAdd loads the reference kernels and returns vector_add's handle.
func (w *wireClient) vectorAdd(t *testing.T) uint64 {
	t.Helper()
	img := kernels.PTX()
	mod := leU64(w.must(t, CallCuModuleLoadData, img, uint64(len(img))))
	return leU64(w.must(t, CallCuModuleGetFunction, uint64(1028), mod, "vector_add"))
}

// launchAdd runs c = a + b over n floats and returns the result of the next synchronisation: a fault of the
// kernel is reported there, as by the driver.
func (w *wireClient) launchAdd(t *testing.T, f, a, b, c uint64, n uint32) Result {
	t.Helper()
	args := make([]byte, 28)
	binary.LittleEndian.PutUint64(args, a)
	binary.LittleEndian.PutUint64(args[8:], b)
	binary.LittleEndian.PutUint64(args[16:], c)
	binary.LittleEndian.PutUint32(args[24:], n)
	if r, _, err := w.call(CallCuLaunchKernel, f, 1, 1, 1, 256, 1, 1, 0, uint64(0), args, uint64(len(args))); err != nil ||
		r != ResultSuccess {
		t.Fatalf("launch: %d %v", r, err)
	}
	r, _, err := w.call(CallCuCtxSynchronize)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func floatBytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func tenants(specs ...pool.FunctionSpec) registry {
	r := registry{}
	for _, s := range specs {
		_ = s.Validate()
		r[s.Name] = struct {
			spec  pool.FunctionSpec
			token string
		}{s, "tok-" + s.Name}
	}
	return r
}

// TestKernelsCannotReachAnotherTenant on the simulated device: only copies and memsets were
// checked, so a kernel of one function read and wrote another's memory on the same GPU. Functions of different
// namespaces now never have their memory accessible on a GPU at the same time: a kernel of namespace 2 that
// follows a pointer into namespace 1's memory faults (in its own context: its GPU and namespace 1 go on), and the
// secret stays where it was, unchanged. Within a namespace functions share the GPU's address space (runtime
// sharing) unless isolated.
func TestKernelsCannotReachAnotherTenant(t *testing.T) {
	funcs := tenants(pool.FunctionSpec{Name: "a.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "b.ns2", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "c.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "i.ns1", MemoryBytes: 64 << 20, Isolation: pool.IsolationIsolated})
	r := startServerWith(t, funcs, nil)
	dial := func(fn string) *wireClient {
		w, err := dialWire(t, r.sock, fn, "tok-"+fn)
		if err != nil {
			t.Fatal(err)
		}
		r.binder.bind(fn, 0) // every request on GPU 0
		return w
	}
	secret := []byte("secret of namespace one, function a")
	a := dial("a.ns1")
	pa := a.alloc(t, 4096)
	a.htod(t, pa, secret)

	b := dial("b.ns2")
	add := b.vectorAdd(t)
	pb := b.alloc(t, 4096)
	if res, _ := b.dtoh(t, pa, 16); res != ResultInvalidValue {
		t.Fatalf("b copying from a's memory: result %d", res)
	}
	// Read: c = a's secret + 0 into b's own buffer.
	defer func() {
		if t.Failed() {
			dumpLogs(t, r)
		}
	}()
	if res := b.launchAdd(t, add, pa, pb, pb, 16); res != ResultIllegalAddress {
		t.Fatalf("b's kernel reading a's memory: result %d, want CUDA_ERROR_ILLEGAL_ADDRESS", res)
	}
	if _, got := b.dtoh(t, pb, uint64(len(secret))); strings.Contains(string(got), "secret") {
		t.Fatalf("b's buffer holds a's secret: %q", got)
	}
	// Write: into a's buffer.
	b.htod(t, pb, floatBytes(1, 2, 3, 4))
	if res := b.launchAdd(t, add, pb, pb, pa, 4); res != ResultIllegalAddress {
		t.Fatalf("b's kernel writing a's memory: result %d", res)
	}
	if _, got := a.dtoh(t, pa, uint64(len(secret))); string(got) != string(secret) {
		t.Fatalf("a's memory after b's attempts: %q", got)
	}
	if !r.node.Healthy(0) {
		t.Fatal("gpu 0 taken out of service by b's faults")
	}
	if n := r.node.Status()[0].ContextFaults; n != 2 {
		t.Fatalf("%d context faults on gpu 0, want b's 2", n)
	}

	// Within namespace 1, functions share: c's kernel reads a's buffer.
	c := dial("c.ns1")
	cadd := c.vectorAdd(t)
	pc := c.alloc(t, 4096)
	if res := c.launchAdd(t, cadd, pa, pc, pc, 4); res != ResultSuccess {
		t.Fatalf("c (a's namespace) reading a's memory: result %d", res)
	}
	// An isolated function of namespace 1 shares with nobody.
	i := dial("i.ns1")
	iadd := i.vectorAdd(t)
	pi := i.alloc(t, 4096)
	if res := i.launchAdd(t, iadd, pa, pi, pi, 4); res != ResultIllegalAddress {
		t.Fatalf("an isolated function reading a's memory: result %d", res)
	}
	if _, got := a.dtoh(t, pa, uint64(len(secret))); string(got) != string(secret) {
		t.Fatalf("a's memory at the end: %q", got)
	}
}

func dumpLogs(t *testing.T, r *wireRig) { t.Log(r.logs.String()) }

// TestKernelFaultPoisonsOnlyItsContext on the simulated device: one kernel with a bad pointer
// marked its GPU unhealthy for good. Now the fault poisons the context of the function's tenant on that GPU only:
// the faulting request gets CUDA_ERROR_ILLEGAL_ADDRESS, the gpuserver tears the context down and restores the
// tenant's functions from their host images, the GPU stays in service for every tenant, and the faulting
// function itself works again with its model intact. A function that faults before its initialisation ended has
// no image: it is refused until its process starts again.
func TestKernelFaultPoisonsOnlyItsContext(t *testing.T) {
	funcs := tenants(pool.FunctionSpec{Name: "a.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "c.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "b.ns2", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "early.ns3", MemoryBytes: 64 << 20})
	r := startServerWith(t, funcs, nil)
	defer func() {
		if t.Failed() {
			dumpLogs(t, r)
		}
	}()
	weights := func(seed float32) []byte {
		v := make([]float32, 256)
		for i := range v {
			v[i] = seed + float32(i)
		}
		return floatBytes(v...)
	}
	// initialise loads a model under an implicit binding on gpu, then ends the initialisation with a request on
	// gpu (its model becomes its image).
	initialise := func(fn string, gpu int, seed float32) (*wireClient, uint64, uint64) {
		w, err := dialWire(t, r.sock, fn, "tok-"+fn)
		if err != nil {
			t.Fatal(err)
		}
		r.binder.mu.Lock()
		r.binder.implicit = gpu
		r.binder.mu.Unlock()
		add := w.vectorAdd(t)
		p := w.alloc(t, 1024)
		w.htod(t, p, weights(seed))
		r.binder.bind(fn, gpu)
		if res, got := w.dtoh(t, p, 1024); res != ResultSuccess || string(got) != string(weights(seed)) {
			t.Fatalf("%s: its model after the initialisation: %d", fn, res)
		}
		if !r.node.Captured(fn) {
			t.Fatalf("%s: no image after its first request", fn)
		}
		return w, add, p
	}
	b, _, pb := initialise("b.ns2", 1, 3000)
	a, add, pa := initialise("a.ns1", 0, 1000)
	c, _, pc := initialise("c.ns1", 0, 2000) // a's namespace, active on gpu 0 beside a

	if res := a.launchAdd(t, add, 0x1000, pa, pa, 256); res != ResultIllegalAddress {
		t.Fatalf("a kernel reading address 0x1000: result %d, want CUDA_ERROR_ILLEGAL_ADDRESS", res)
	}
	st := r.node.Status()
	if !st[0].Healthy || st[0].ContextFaults != 1 {
		t.Fatalf("gpu 0 after the fault: healthy %v, %d context faults", st[0].Healthy, st[0].ContextFaults)
	}
	// a works again, its model restored from its image, and computes.
	if res, got := a.dtoh(t, pa, 1024); res != ResultSuccess || string(got) != string(weights(1000)) {
		t.Fatalf("a's model after the fault: result %d", res)
	}
	out := a.alloc(t, 1024)
	if res := a.launchAdd(t, add, pa, pa, out, 256); res != ResultSuccess {
		t.Fatalf("a's next kernel: %d", res)
	}
	if _, got := a.dtoh(t, out, 8); math.Float32frombits(binary.LittleEndian.Uint32(got[4:])) != 2002 {
		t.Fatalf("a computes 2*1001 = %v", math.Float32frombits(binary.LittleEndian.Uint32(got[4:])))
	}
	// c shared a's context: its next call reports the fault once (what it had queued there is lost, as on the
	// driver), then its model is back from its image.
	if res, _ := c.dtoh(t, pc, 1024); res != ResultIllegalAddress {
		t.Fatalf("c's first call after its namespace's fault: result %d, want CUDA_ERROR_ILLEGAL_ADDRESS", res)
	}
	if res, got := c.dtoh(t, pc, 1024); res != ResultSuccess || string(got) != string(weights(2000)) {
		t.Fatalf("c's model after its namespace's fault: result %d", res)
	}
	// Another namespace was never touched, and moves onto the GPU that saw the fault.
	if res, got := b.dtoh(t, pb, 1024); res != ResultSuccess || string(got) != string(weights(3000)) {
		t.Fatalf("b on gpu 1: result %d", res)
	}
	r.binder.bind("b.ns2", 0)
	if res, got := b.dtoh(t, pb, 1024); res != ResultSuccess || string(got) != string(weights(3000)) {
		t.Fatalf("b moved to gpu 0: result %d", res)
	}
	if !r.node.Healthy(0) || !r.node.Healthy(1) {
		t.Fatal("a gpu was taken out of service")
	}

	// A fault during initialisation: there is no image to restore, so the function is refused until its process
	// starts again (its session ends and the node forgets it).
	e, err := dialWire(t, r.sock, "early.ns3", "tok-early.ns3")
	if err != nil {
		t.Fatal(err)
	}
	r.binder.mu.Lock()
	r.binder.implicit = 2
	r.binder.mu.Unlock()
	eadd := e.vectorAdd(t)
	pe := e.alloc(t, 1024)
	if res := e.launchAdd(t, eadd, 0x1000, pe, pe, 4); res != ResultIllegalAddress {
		t.Fatalf("early's bad kernel: %d", res)
	}
	if res, _, err := e.call(CallCuMemAlloc_v2, uint64(1024)); err != nil || res != ResultContextIsDestroyed {
		t.Fatalf("early allocating after losing its memory: %d %v, want CUDA_ERROR_CONTEXT_IS_DESTROYED", res, err)
	}
	e.close()
	testkit.Eventually(t, 60*time.Second, "early forgotten when its process ended", func() bool {
		w, err := dialWire(t, r.sock, "early.ns3", "tok-early.ns3")
		if err != nil {
			t.Fatal(err)
		}
		defer w.close()
		res, _, err := w.call(CallCuMemAlloc_v2, uint64(1024))
		return err == nil && res == ResultSuccess
	})
}

// TestFreedMemoryIsZeroedForTheNextTenant: chunks go back to the GPU's pool when a block is freed and serve the
// next allocation, of any function; they are zeroed before they are mapped for it, so a function never reads
// what another left behind.
func TestFreedMemoryIsZeroedForTheNextTenant(t *testing.T) {
	funcs := tenants(pool.FunctionSpec{Name: "a.ns1", MemoryBytes: 64 << 20},
		pool.FunctionSpec{Name: "b.ns2", MemoryBytes: 64 << 20})
	r := startServerWith(t, funcs, nil)
	const size = 8 << 20 // segments of their own: their chunks go back at free
	a, err := dialWire(t, r.sock, "a.ns1", "tok-a.ns1")
	if err != nil {
		t.Fatal(err)
	}
	r.binder.bind("a.ns1", 0)
	pa := a.alloc(t, size)
	secret := []byte(strings.Repeat("secret of a ", 1000))
	for off := uint64(0); off < size; off += uint64(len(secret)) {
		n := min(uint64(len(secret)), size-off)
		a.htod(t, pa+off, secret[:n])
	}
	a.must(t, CallCuMemFree_v2, pa)
	free := r.node.Status()[0].FreeBytes

	b, err := dialWire(t, r.sock, "b.ns2", "tok-b.ns2")
	if err != nil {
		t.Fatal(err)
	}
	r.binder.bind("b.ns2", 0)
	pb := b.alloc(t, size)
	if after := r.node.Status()[0].FreeBytes; after != free-size {
		t.Fatalf("b's block did not take the chunks a freed (free %d -> %d)", free, after)
	}
	for off := uint64(0); off < size; off += 256 << 10 {
		res, got := b.dtoh(t, pb+off, 256<<10)
		if res != ResultSuccess {
			t.Fatalf("b reading its block: %d", res)
		}
		for i, v := range got {
			if v != 0 {
				t.Fatalf("b's fresh block holds %q at offset %d", got[i:min(i+12, len(got))], off+uint64(i))
			}
		}
	}
}
