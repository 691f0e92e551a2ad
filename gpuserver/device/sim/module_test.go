package sim_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/cudaimage"
)

func preset(t *testing.T, name string) topology.Node {
	t.Helper()
	n, err := topology.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func cp(offset, size uint32) cudaimage.Param { return cudaimage.Param{Offset: offset, Size: size} }

// nvccLikeCubin is a synthetic sm_90 cubin of what nvcc builds from
//
//	__device__ float counter;
//	__device__ float table[2] = {1.5f, 2.5f};
//	__device__ float *ptr = &table[1];
//	extern "C" __global__ void vector_add(const float*, const float*, float*, unsigned);
//	extern "C" __global__ void set_counter(float v);
//	__global__ void scale(float*, float, unsigned)    // a C++ kernel: _Z5scalePfjf, not computed
//	extern "C" __global__ void fill(float*, unsigned)  // named like a reference kernel, another layout
func nvccLikeCubin(arch int) []byte {
	c := cudaimage.NewCubin(arch)
	c.Kernel("vector_add", []cudaimage.Param{cp(0, 8), cp(8, 8), cp(16, 8), cp(24, 4)})
	c.Kernel("set_counter", []cudaimage.Param{cp(0, 4)})
	c.Kernel("_Z5scalePffj", []cudaimage.Param{cp(0, 8), cp(8, 4), cp(12, 4)},
		cudaimage.Record(0x05, cudaimage.LE32(128), cudaimage.LE32(1), cudaimage.LE32(1)))
	c.Kernel("fill", []cudaimage.Param{cp(0, 8), cp(8, 4)})
	c.Section(cudaimage.Section{Name: ".nv.global", Type: 8, Size: 4, Align: 4})
	init := make([]byte, 16)
	binary.LittleEndian.PutUint32(init[0:], 0x3fc00000) // 1.5
	binary.LittleEndian.PutUint32(init[4:], 0x40200000) // 2.5
	c.Section(cudaimage.Section{Name: ".nv.global.init", Type: 1, Data: init, Align: 8})
	c.Symbol(cudaimage.Symbol{Name: "counter", Info: 1, Section: ".nv.global", Size: 4})
	c.Symbol(cudaimage.Symbol{Name: "table", Info: 1, Section: ".nv.global.init", Size: 8})
	c.Symbol(cudaimage.Symbol{Name: "ptr", Info: 1, Section: ".nv.global.init", Value: 8, Size: 8})
	c.Section(cudaimage.Section{Name: ".rela.nv.global.init", Type: 4, Data: c.Rela(8, 4, "table", 4),
		LinkSymtab: true, InfoSection: ".nv.global.init", Align: 8})
	return c.Bytes()
}

func fatbinOf(t *testing.T, entries ...cudaimage.Entry) []byte {
	t.Helper()
	b, err := cudaimage.Fatbin(entries...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run launches a kernel by name on a new stream of gpu and synchronises.
func run(t *testing.T, b *sim.Backend, m device.Module, name string, values ...any) error {
	t.Helper()
	f, err := m.Function(name)
	if err != nil {
		t.Fatal(err)
	}
	args, err := device.PackArgs(f.Params(), values...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.NewStream(m.GPU())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if err := s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 64}, 0, args); err != nil {
		return err
	}
	return s.Synchronize(context.Background())
}

func read(t *testing.T, b *sim.Backend, gpu int, p device.Ptr, n int) []byte {
	t.Helper()
	s, err := b.NewStream(gpu)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	out := make([]byte, n)
	must(t, s.CopyDtoH(out, p))
	must(t, s.Synchronize(context.Background()))
	return out
}

func write(t *testing.T, b *sim.Backend, gpu int, p device.Ptr, data []byte) {
	t.Helper()
	s, err := b.NewStream(gpu)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	must(t, s.CopyHtoD(p, data))
	must(t, s.Synchronize(context.Background()))
}

// TestCubinModules: a cubin, alone or as the chosen entry of a Zstandard-compressed fat binary, loads on a
// simulated H100 with its kernels' layouts and attributes and its globals' initial values and relocated
// addresses; vector_add and set_counter are computed by the matching rule, the C++ kernel and the name-alike are
// refused at launch naming them.
func TestCubinModules(t *testing.T) {
	b := newSim(t, sim.Options{Node: preset(t, "h100x8")})
	if cc := b.GPUs()[0].ComputeCapability; cc != 90 {
		t.Fatalf("simulated H100 has compute capability %d", cc)
	}
	images := map[string][]byte{
		"cubin": nvccLikeCubin(90),
		"fatbin": fatbinOf(t,
			cudaimage.Entry{Kind: cudaimage.KindELF, Arch: 80, Flags: cudaimage.FlagZstd, Data: []byte("not loaded")},
			cudaimage.Entry{Kind: cudaimage.KindELF, Arch: 90, Flags: cudaimage.FlagZstd, Data: nvccLikeCubin(90)},
			cudaimage.Entry{Kind: cudaimage.KindPTX, Arch: 90, Data: []byte(".version 9.0\nnot loaded\n")}),
	}
	for kind, img := range images {
		m, err := b.LoadModule(1, img)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		va, err := m.Function("vector_add")
		must(t, err)
		if got := va.Params(); len(got) != 4 || got[3] != (device.Param{Offset: 24, Size: 4}) {
			t.Errorf("%s: vector_add params %v", kind, got)
		}
		cxx, err := m.Function("_Z5scalePffj")
		must(t, err)
		if a := cxx.(device.AttributedFunction).Attributes(); a.MaxThreadsPerBlock != 128 || a.BinaryVersion != 90 {
			t.Errorf("%s: attributes %+v", kind, a)
		}
		// globals: initial values, and ptr = &table[1] on this GPU
		table, size, err := m.Global("table")
		must(t, err)
		if size != 8 || !bytes.Equal(read(t, b, 1, table, 8), []byte{0, 0, 0xc0, 0x3f, 0, 0, 0x20, 0x40}) {
			t.Errorf("%s: table (%d bytes) = %v", kind, size, read(t, b, 1, table, 8))
		}
		ptr, _, err := m.Global("ptr")
		must(t, err)
		if got := binary.LittleEndian.Uint64(read(t, b, 1, ptr, 8)); got != uint64(table)+4 {
			t.Errorf("%s: ptr holds %#x, want &table[1] = %#x", kind, got, uint64(table)+4)
		}
		counter, _, err := m.Global("counter")
		must(t, err)
		if err := run(t, b, m, "set_counter", float32(7.5)); err != nil {
			t.Fatalf("%s: set_counter: %v", kind, err)
		}
		if v := bytesF32(read(t, b, 1, counter, 4)); v[0] != 7.5 {
			t.Errorf("%s: counter = %v after set_counter(7.5)", kind, v)
		}
		// vector_add over module globals: counter[0] = table[0] + table[0]
		if err := run(t, b, m, "vector_add", table, table, counter, uint32(1)); err != nil {
			t.Fatalf("%s: vector_add: %v", kind, err)
		}
		if v := bytesF32(read(t, b, 1, counter, 4)); v[0] != 3 {
			t.Errorf("%s: vector_add wrote %v, want 3", kind, v)
		}
		err = run(t, b, m, "_Z5scalePffj", table, float32(2), uint32(2))
		if !errors.Is(err, sim.ErrKernelNotSimulated) || !errors.Is(err, device.ErrNotSupported) ||
			!strings.Contains(err.Error(), "_Z5scalePffj") || !strings.Contains(err.Error(), "--sim-kernels=dry") {
			t.Errorf("%s: C++ kernel: %v", kind, err)
		}
		err = run(t, b, m, "fill", table, uint32(2))
		if !errors.Is(err, sim.ErrKernelNotSimulated) || !strings.Contains(err.Error(), "reference kernel's") {
			t.Errorf("%s: fill with another layout: %v", kind, err)
		}
		must(t, m.Unload())
	}
	if free, total, _ := b.MemoryInfo(1); free != total {
		t.Errorf("after unloading, gpu 1 has %d of %d bytes free", free, total)
	}
}

// TestArchitectureSelection: the entry is chosen as the driver chooses it, and images without code for the GPU
// fail with ErrNoBinaryForGPU.
func TestArchitectureSelection(t *testing.T) {
	h100 := newSim(t, sim.Options{Node: preset(t, "h100x8")})
	v100 := newSim(t, sim.Options{Node: preset(t, "v100x4")})
	a100 := newSim(t, sim.Options{Node: preset(t, "a100x8")})
	ptxText := []byte(".version 9.0\n.target sm_80\n.address_size 64\n.global .align 4 .f32 counter = 0f3FC00000;\n" +
		".visible .entry vector_add(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)\n{\n\tret;\n}\n")
	fat := fatbinOf(t,
		cudaimage.Entry{Kind: cudaimage.KindELF, Arch: 80, Flags: cudaimage.FlagZstd, Data: nvccLikeCubin(80)},
		cudaimage.Entry{Kind: cudaimage.KindPTX, Arch: 80, Flags: cudaimage.FlagZstd, Data: ptxText})
	// 9.0: no 9.x cubin, so the compute_80 PTX ("compiled" by reading it)
	m, err := h100.LoadModule(0, fat)
	must(t, err)
	if _, err := m.Function("set_counter"); !errors.Is(err, device.ErrNotFound) {
		t.Errorf("the H100 loaded the sm_80 cubin (set_counter found: %v)", err)
	}
	if g, size, err := m.Global("counter"); err != nil || size != 4 || bytesF32(read(t, h100, 0, g, 4))[0] != 1.5 {
		t.Errorf("PTX global counter: %v %d", err, size)
	}
	// 8.0: the sm_80 cubin
	m, err = a100.LoadModule(0, fat)
	must(t, err)
	if _, err := m.Function("set_counter"); err != nil {
		t.Errorf("the A100 did not load the sm_80 cubin: %v", err)
	}
	// 7.0: nothing
	if _, err := v100.LoadModule(0, fat); !errors.Is(err, device.ErrNoBinaryForGPU) ||
		!strings.Contains(err.Error(), "sm_80") {
		t.Errorf("V100: %v, want ErrNoBinaryForGPU naming the targets", err)
	}
	// a cubin alone: same major, minor not above the GPU's
	if _, err := h100.LoadModule(0, nvccLikeCubin(80)); !errors.Is(err, device.ErrNoBinaryForGPU) {
		t.Errorf("sm_80 cubin on 9.0: %v", err)
	}
	if _, err := a100.LoadModule(0, nvccLikeCubin(86)); !errors.Is(err, device.ErrNoBinaryForGPU) {
		t.Errorf("sm_86 cubin on 8.0: %v", err)
	}
	if _, err := h100.LoadModule(0, []byte{0xb1, 0x43, 0x62, 0x46, 1, 0, 0, 0, 0, 0, 0, 0}); !errors.Is(err,
		device.ErrInvalidImage) || !strings.Contains(err.Error(), "host pointers") {
		t.Errorf("fat binary wrapper: %v", err)
	}
	if _, err := h100.LoadModule(0, []byte("garbage")); !errors.Is(err, device.ErrInvalidImage) {
		t.Errorf("garbage: %v", err)
	}
}

// TestDryKernels: with KernelsDry a kernel the sim cannot compute is accepted, changes nothing and is counted;
// reference kernels are still computed.
func TestDryKernels(t *testing.T) {
	b := newSim(t, sim.Options{Node: preset(t, "h200x1"), Kernels: sim.KernelsDry})
	if b.KernelMode() != sim.KernelsDry || b.KernelMode().String() != "dry" {
		t.Fatalf("mode %v", b.KernelMode())
	}
	m, err := b.LoadModule(0, nvccLikeCubin(90))
	must(t, err)
	table, _, _ := m.Global("table")
	counter, _, _ := m.Global("counter")
	before := read(t, b, 0, table, 8)
	for range 3 {
		if err := run(t, b, m, "_Z5scalePffj", table, float32(2), uint32(2)); err != nil {
			t.Fatalf("dry launch: %v", err)
		}
	}
	if got := read(t, b, 0, table, 8); !bytes.Equal(got, before) {
		t.Errorf("a dry kernel changed memory: %v -> %v", before, got)
	}
	if n := b.DryLaunches(); n != 3 {
		t.Errorf("%d dry launches counted, want 3", n)
	}
	must(t, run(t, b, m, "vector_add", table, table, counter, uint32(2)))
	if v := bytesF32(read(t, b, 0, counter, 4)); v[0] != 3 || b.DryLaunches() != 3 {
		t.Errorf("vector_add in dry mode: %v (dry launches %d)", v, b.DryLaunches())
	}
	// the argument buffer is still checked
	f, _ := m.Function("_Z5scalePffj")
	s, _ := b.NewStream(0)
	defer s.Destroy()
	if err := s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, make([]byte, 8)); !errors.Is(err,
		device.ErrInvalidValue) {
		t.Errorf("short arguments in dry mode: %v", err)
	}
	if _, err := sim.ParseKernelMode("wet"); err == nil {
		t.Error("ParseKernelMode accepted wet")
	}
	if k, err := sim.ParseKernelMode("dry"); err != nil || k != sim.KernelsDry {
		t.Errorf("ParseKernelMode(dry) = %v %v", k, err)
	}
}

// TestPTXGlobalsOnTheSim: PTX module variables get their initial bytes and relocated addresses.
func TestPTXGlobalsOnTheSim(t *testing.T) {
	b := newSim(t, sim.Options{})
	src := ".version 7.0\n.target sm_50\n.address_size 64\n" +
		".global .align 4 .b8 table[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n" +
		".const .align 4 .u32 cvals[2] = {9, 10};\n" +
		".global .align 8 .u64 p = generic(table)+4;\n" +
		".global .align 4 .u32 counter;\n" +
		".visible .entry set_counter(.param .u32 v)\n{\n\tret;\n}\n"
	m, err := b.LoadModule(2, []byte(src))
	must(t, err)
	table, _, _ := m.Global("table")
	cvals, _, _ := m.Global("cvals")
	p, _, _ := m.Global("p")
	counter, _, _ := m.Global("counter")
	if got := read(t, b, 2, table, 8); !bytes.Equal(got, []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("table = %v", got)
	}
	if got := read(t, b, 2, cvals, 8); !bytes.Equal(got, []byte{9, 0, 0, 0, 10, 0, 0, 0}) {
		t.Errorf("cvals = %v", got)
	}
	if got := binary.LittleEndian.Uint64(read(t, b, 2, p, 8)); got != uint64(table)+4 {
		t.Errorf("p = %#x, want %#x", got, uint64(table)+4)
	}
	write(t, b, 2, counter, []byte{0, 0, 0, 0})
	must(t, run(t, b, m, "set_counter", uint32(0xdeadbeef)))
	if got := binary.LittleEndian.Uint32(read(t, b, 2, counter, 4)); got != 0xdeadbeef {
		t.Errorf("counter = %#x", got)
	}
}

// FuzzLoadModule: no image makes LoadModule panic, and a loaded module unloads and frees its memory.
func FuzzLoadModule(f *testing.F) {
	f.Add(nvccLikeCubin(70))
	fat, err := cudaimage.Fatbin(cudaimage.Entry{Kind: cudaimage.KindELF, Arch: 70, Flags: cudaimage.FlagZstd,
		Data: nvccLikeCubin(70)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fat)
	f.Add([]byte(".version 7.0\n.global .u64 p[2] = {generic(p), 3};\n.entry set_p(.param .b8 v[16]) { ret; }"))
	n, err := topology.Preset("v100x4")
	if err != nil {
		f.Fatal(err)
	}
	n.GPUs = n.GPUs[:1]
	n.NVLinkBytesPerSec = nil
	b, err := sim.New(sim.Options{Node: n})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = b.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, img []byte) {
		m, err := b.LoadModule(0, img)
		if err != nil {
			return
		}
		if err := m.Unload(); err != nil {
			t.Fatal(err)
		}
		if free, total, _ := b.MemoryInfo(0); free != total {
			t.Fatalf("%d of %d bytes free after unloading", free, total)
		}
	})
}
