package sim_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/ptx"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func newSim(t *testing.T, opts sim.Options) *sim.Backend {
	t.Helper()
	if opts.Node.Name == "" {
		n, err := topology.Preset("v100x4")
		if err != nil {
			t.Fatal(err)
		}
		opts.Node = n
	}
	b, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return b
}

// mapOn reserves size bytes and maps fresh physical memory of gpu there, accessible from access.
func mapOn(t *testing.T, b device.Backend, gpu int, size uint64, access ...int) device.Ptr {
	t.Helper()
	p, err := b.ReserveAddress(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	phys, err := b.CreatePhysical(gpu, size)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Map(p, phys); err != nil {
		t.Fatal(err)
	}
	if err := b.SetAccess(p, size, append([]int{gpu}, access...)); err != nil {
		t.Fatal(err)
	}
	return p
}

func f32bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func bytesF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func TestReferencePTXEntries(t *testing.T) {
	entries, err := ptx.Entries(kernels.PTX())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]device.Param{
		"vector_add": {{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 8}, {Offset: 24, Size: 4}},
		"matmul":     {{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 8}, {Offset: 24, Size: 4}, {Offset: 28, Size: 4}, {Offset: 32, Size: 4}},
		"linear":     {{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 8}, {Offset: 24, Size: 8}, {Offset: 32, Size: 4}, {Offset: 36, Size: 4}, {Offset: 40, Size: 4}},
		"relu":       {{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 4}},
		"fill":       {{Offset: 0, Size: 8}, {Offset: 8, Size: 4}, {Offset: 12, Size: 4}},
		"scale":      {{Offset: 0, Size: 8}, {Offset: 8, Size: 4}, {Offset: 12, Size: 4}},
		"busy":       {{Offset: 0, Size: 8}},
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
		w, ok := want[e.Name]
		if !ok {
			t.Errorf("unexpected entry %s", e.Name)
			continue
		}
		if len(w) != len(e.Params) {
			t.Errorf("%s: params %v, want %v", e.Name, e.Params, w)
			continue
		}
		for i := range w {
			if w[i] != e.Params[i] {
				t.Errorf("%s: params %v, want %v", e.Name, e.Params, w)
				break
			}
		}
	}
	if len(names) != len(kernels.Names()) {
		t.Fatalf("entries %v, want %v", names, kernels.Names())
	}
	for i, n := range kernels.Names() {
		if names[i] != n {
			t.Fatalf("entries %v, want %v", names, kernels.Names())
		}
	}
}

func TestPTXAlignedAndCommentedParams(t *testing.T) {
	src := []byte(`.version 7.0
.target sm_80
// .entry commented_out(.param .u64 x)
.visible .entry _Z3fooPfi( /* a comment */
	.param .u32 _Z3fooPfi_param_0,
	.param .u64 .ptr .global .align 4 _Z3fooPfi_param_1,
	.param .align 8 .b8 _Z3fooPfi_param_2[12]
)
{ ret; }
.entry noparams()
{ ret; }`)
	entries, err := ptx.Entries(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Name != "_Z3fooPfi" || entries[1].Name != "noparams" {
		t.Fatalf("entries %+v", entries)
	}
	want := []device.Param{{Offset: 0, Size: 4}, {Offset: 8, Size: 8}, {Offset: 16, Size: 12}}
	for i, p := range entries[0].Params {
		if p != want[i] {
			t.Fatalf("params %v, want %v", entries[0].Params, want)
		}
	}
	if _, err := ptx.Entries([]byte(".entry bad(.param .q99 x)")); !errors.Is(err, ptx.ErrSyntax) {
		t.Fatalf("bad type: err %v, want ErrSyntax", err)
	}
}

func TestVectorAddAndMLPOnSim(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	mod, err := b.LoadModule(1, kernels.PTX())
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStream(1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	mem := mapOn(t, b, 1, 2<<20)
	a, bb, c := mem, mem+4*n, mem+8*n
	av, bv := make([]float32, n), make([]float32, n)
	for i := range av {
		av[i], bv[i] = float32(i), float32(2*i)-500
	}
	must(t, s.CopyHtoD(a, f32bytes(av)))
	must(t, s.CopyHtoD(bb, f32bytes(bv)))
	va, _ := mod.Function("vector_add")
	args, err := device.PackArgs(va.Params(), a, bb, c, uint32(n))
	must(t, err)
	must(t, s.Launch(va, device.Dim3{X: (n + 255) / 256}, device.Dim3{X: 256}, 0, args))
	rl, _ := mod.Function("relu")
	args, _ = device.PackArgs(rl.Params(), c, c, uint32(n))
	must(t, s.Launch(rl, device.Dim3{X: (n + 255) / 256}, device.Dim3{X: 256}, 0, args))
	out := make([]byte, 4*n)
	must(t, s.CopyDtoH(out, c))
	must(t, s.Synchronize(ctx))
	for i, v := range bytesF32(out) {
		if want := max(av[i]+bv[i], 0); v != want {
			t.Fatalf("c[%d] = %v, want %v", i, v, want)
		}
	}

	// y = x W + b for a 2x3 x 3x2 layer
	x := []float32{1, 2, 3, 4, 5, 6}
	w := []float32{1, 0, 0, 1, 1, 1}
	bias := []float32{0.5, -100}
	px, pw, pb, py := mem, mem+64, mem+128, mem+192
	must(t, s.CopyHtoD(px, f32bytes(x)))
	must(t, s.CopyHtoD(pw, f32bytes(w)))
	must(t, s.CopyHtoD(pb, f32bytes(bias)))
	lin, _ := mod.Function("linear")
	args, _ = device.PackArgs(lin.Params(), px, pw, pb, py, uint32(2), uint32(2), uint32(3))
	must(t, s.Launch(lin, device.Dim3{X: 1, Y: 1}, device.Dim3{X: 16, Y: 16}, 0, args))
	y := make([]byte, 16)
	must(t, s.CopyDtoH(y, py))
	must(t, s.Synchronize(ctx))
	want := []float32{1 + 3 + 0.5, 2 + 3 - 100, 4 + 6 + 0.5, 5 + 6 - 100}
	for i, v := range bytesF32(y) {
		if v != want[i] {
			t.Fatalf("y = %v, want %v", bytesF32(y), want)
		}
	}
}

func TestGridBoundsRespected(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	mod, _ := b.LoadModule(0, kernels.PTX())
	s, _ := b.NewStream(0)
	p := mapOn(t, b, 0, 2<<20)
	fl, _ := mod.Function("fill")
	args, _ := device.PackArgs(fl.Params(), p, float32(7), uint32(100))
	must(t, s.Launch(fl, device.Dim3{X: 1}, device.Dim3{X: 32}, 0, args)) // only 32 threads
	out := make([]byte, 400)
	must(t, s.CopyDtoH(out, p))
	must(t, s.Synchronize(ctx))
	v := bytesF32(out)
	if v[31] != 7 || v[32] != 0 {
		t.Fatalf("fill with 32 threads wrote v[31]=%v v[32]=%v", v[31], v[32])
	}
}

func TestPeerCopyNeedsAccessAndKeepsBytes(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	const size = 4 << 20
	src := mapOn(t, b, 0, size) // on GPU 0, only GPU 0 may touch it
	dst := mapOn(t, b, 3, size)
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, size/7)
	s0, _ := b.NewStream(0)
	must(t, s0.CopyHtoD(src, data))
	must(t, s0.Synchronize(ctx))

	s3, _ := b.NewStream(3)
	must(t, s3.CopyDtoD(dst, src, uint64(len(data))))
	if err := s3.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("peer copy without access: err %v, want ErrIllegalAddress", err)
	}
	must(t, b.SetAccess(src, size, []int{0, 3}))
	must(t, s3.CopyDtoD(dst, src, uint64(len(data))))
	out := make([]byte, len(data))
	must(t, s3.CopyDtoH(out, dst))
	must(t, s3.Synchronize(ctx))
	if !bytes.Equal(out, data) {
		t.Fatal("peer copy changed bytes")
	}
}

func TestVMMRules(t *testing.T) {
	b := newSim(t, sim.Options{})
	gran := b.GPUs()[0].Granularity
	p, err := b.ReserveAddress(4*gran, 0)
	must(t, err)
	phys, err := b.CreatePhysical(0, 2*gran)
	must(t, err)
	if _, err := b.CreatePhysical(0, gran+1); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("unaligned physical: %v", err)
	}
	must(t, b.Map(p+device.Ptr(gran), phys))
	if err := b.Map(p+device.Ptr(2*gran), phys); err == nil {
		// the same physical memory may be mapped twice only where nothing is mapped yet
		must(t, b.Unmap(p+device.Ptr(2*gran), 2*gran))
	}
	if err := b.Map(p+device.Ptr(3*gran), phys); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("mapping past the reservation: %v", err)
	}
	if err := phys.Release(); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("release while mapped: %v", err)
	}
	if err := b.FreeAddress(p, 4*gran); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("free reservation with mappings: %v", err)
	}
	must(t, b.Unmap(p+device.Ptr(gran), 2*gran))
	must(t, phys.Release())
	must(t, b.FreeAddress(p, 4*gran))
	free, total, err := b.MemoryInfo(0)
	must(t, err)
	if free != total {
		t.Fatalf("free %d of %d after releasing everything", free, total)
	}
	if _, err := b.CreatePhysical(0, alignUp(total+1, gran)); !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("over-allocation: %v", err)
	}
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) / a * a }

func TestModuleGlobalsDifferPerGPU(t *testing.T) {
	src := []byte(".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 table[64];\n" +
		".global .f32 bias;\n")
	b := newSim(t, sim.Options{})
	m0, err := b.LoadModule(0, src)
	must(t, err)
	m1, err := b.LoadModule(1, src)
	must(t, err)
	p0, size, err := m0.Global("table")
	must(t, err)
	p1, _, err := m1.Global("table")
	must(t, err)
	if size != 64 || p0 == p1 {
		t.Fatalf("table: size %d, addresses %#x and %#x (must differ per GPU)", size, p0, p1)
	}
	if _, _, err := m0.Global("nope"); !errors.Is(err, device.ErrNotFound) {
		t.Fatalf("unknown global: %v", err)
	}
	s, _ := b.NewStream(0)
	must(t, s.Memset32(p0, 0x3f800000, 16))
	out := make([]byte, 64)
	must(t, s.CopyDtoH(out, p0))
	must(t, s.Synchronize(context.Background()))
	if bytesF32(out)[15] != 1 {
		t.Fatal("memset32 into a global")
	}
	must(t, m0.Unload())
	must(t, m1.Unload())
}

// fakeClock advances only when slept on, and records the sleeps.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	return ctx.Err()
}

func TestCopyTakesModelledTime(t *testing.T) {
	node, _ := topology.Preset("v100x4")
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := newSim(t, sim.Options{Node: node, Clock: clk, TimeScale: 1})
	p := mapOn(t, b, 2, 12<<20)
	s, _ := b.NewStream(2)
	start := clk.Now()
	must(t, s.CopyHtoD(p, make([]byte, 12<<20)))
	must(t, s.Synchronize(context.Background()))
	got := clk.Now().Sub(start)
	want := node.TransferTime(12<<20, topology.HostPath(2), nil)
	if got != want {
		t.Fatalf("12 MiB host-to-device took %v on the clock, link model says %v", got, want)
	}
}

func TestEventsOrderStreams(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	p := mapOn(t, b, 0, 2<<20)
	copyS, _ := b.NewStream(0)
	compS, _ := b.NewStream(0)
	ev, _ := b.NewEvent(0)
	if done, err := ev.Query(); !done || err != nil {
		t.Fatal("a never recorded event is complete")
	}
	mod, _ := b.LoadModule(0, kernels.PTX())
	sc, _ := mod.Function("scale")
	data := f32bytes([]float32{1, 2, 3, 4})
	must(t, copyS.CopyHtoD(p, data))
	must(t, copyS.Record(ev))
	must(t, compS.Wait(ev))
	args, _ := device.PackArgs(sc.Params(), p, float32(10), uint32(4))
	must(t, compS.Launch(sc, device.Dim3{X: 1}, device.Dim3{X: 4}, 0, args))
	out := make([]byte, 16)
	must(t, compS.CopyDtoH(out, p))
	must(t, compS.Synchronize(ctx))
	must(t, ev.Synchronize(ctx))
	if v := bytesF32(out); v[3] != 40 {
		t.Fatalf("scale after the copy: %v", v)
	}
	must(t, copyS.Destroy())
	must(t, compS.Destroy())
}

func TestLaunchErrors(t *testing.T) {
	b := newSim(t, sim.Options{})
	src := append(kernels.PTX(), []byte("\n.visible .entry other(.param .u64 p)\n{ ret; }\n")...)
	mod, err := b.LoadModule(0, src)
	must(t, err)
	other, err := mod.Function("other")
	must(t, err)
	s, _ := b.NewStream(0)
	if err := s.Launch(other, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, make([]byte, 8)); !errors.Is(err,
		device.ErrNotSupported) {
		t.Fatalf("non-reference kernel: %v", err)
	}
	va, _ := mod.Function("vector_add")
	if err := s.Launch(va, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, make([]byte, 8)); !errors.Is(err,
		device.ErrInvalidValue) {
		t.Fatalf("short argument buffer: %v", err)
	}
	if _, err := mod.Function("missing"); !errors.Is(err, device.ErrNotFound) {
		t.Fatalf("missing kernel: %v", err)
	}
	if _, err := b.LoadModule(0, []byte{0x7f, 'E', 'L', 'F'}); !errors.Is(err, device.ErrInvalidImage) {
		t.Fatalf("truncated cubin: %v", err)
	}
	// a kernel named like a reference kernel with another layout loads, and is not computed
	alike, err := b.LoadModule(0, []byte(".version 7.0\n.visible .entry vector_add(.param .u64 a)\n{ ret; }"))
	must(t, err)
	f, err := alike.Function("vector_add")
	must(t, err)
	if err := s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, make([]byte, 8)); !errors.Is(err,
		sim.ErrKernelNotSimulated) || !strings.Contains(err.Error(), "named like a reference kernel") {
		t.Fatalf("reference kernel with a wrong layout: %v", err)
	}
	// a kernel touching unmapped memory reports at synchronisation
	args, _ := device.PackArgs(va.Params(), device.Ptr(0x1000), device.Ptr(0x1000), device.Ptr(0x1000), uint32(4))
	must(t, s.Launch(va, device.Dim3{X: 1}, device.Dim3{X: 4}, 0, args))
	if err := s.Synchronize(context.Background()); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("illegal address: %v", err)
	}
	must(t, s.Synchronize(context.Background()))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
