package cubin_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/ptx"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// nvcc compiles testdata/kernels.cu with the pinned wheel's nvcc and returns the output and what ptxas printed.
func nvcc(t *testing.T, args ...string) ([]byte, string) {
	t.Helper()
	dir := pyenv.Require(t)
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(pyenv.NVCC(dir), append(args, "-o", out, "testdata/kernels.cu")...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("nvcc %v: %v\n%s", args, err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b, stderr.String()
}

// kernelsCU are the layouts of testdata/kernels.cu's kernels as the C++ ABI lays their parameter types out: each
// parameter at the next multiple of its alignment.
var kernelsCU = map[string][]device.Param{
	"vector_add":  {{Offset: 0, Size: 8}, {Offset: 8, Size: 8}, {Offset: 16, Size: 8}, {Offset: 24, Size: 4}},
	"set_counter": {{Offset: 0, Size: 4}},
	// char, short, int, long long, float, double, S3 (3 bytes, align 1), V4 (16 bytes, align 16), void*
	"_Z5mixedcsixfd2S32V4Pv": {dp(0, 1), dp(2, 2), dp(4, 4), dp(8, 8), dp(16, 4), dp(24, 8), dp(32, 3), dp(48, 16), dp(64, 8)},
	"_Z4tmplIfEvPT_S0_":      {dp(0, 8), dp(8, 4)},
	"_Z4tmplIdEvPT_S0_":      {dp(0, 8), dp(8, 8)},
	"_Z3big3BigPi":           {dp(0, 4000), dp(4000, 8)},
	"noparams":               nil,
	"shared_user":            {dp(0, 8)},
	"local_user":             {dp(0, 8), dp(8, 4)},
}

// ptxasInfo is what ptxas -v printed for one function.
type ptxasInfo struct{ registers, smem, stack int }

var (
	ptxasEntry = regexp.MustCompile(`Compiling entry function '([^']+)'`)
	ptxasStack = regexp.MustCompile(`(\d+) bytes stack frame`)
	ptxasUsed  = regexp.MustCompile(`Used (\d+) registers(?:.*?(\d+) bytes smem)?`)
)

func parsePtxas(t *testing.T, out string) map[string]ptxasInfo {
	t.Helper()
	m := map[string]ptxasInfo{}
	var cur string
	for _, line := range bytes.Split([]byte(out), []byte("\n")) {
		if s := ptxasEntry.FindSubmatch(line); s != nil {
			cur = string(s[1])
			m[cur] = ptxasInfo{}
		} else if s := ptxasStack.FindSubmatch(line); s != nil && cur != "" {
			i := m[cur]
			i.stack, _ = strconv.Atoi(string(s[1]))
			m[cur] = i
		} else if s := ptxasUsed.FindSubmatch(line); s != nil && cur != "" {
			i := m[cur]
			i.registers, _ = strconv.Atoi(string(s[1]))
			if len(s[2]) > 0 {
				i.smem, _ = strconv.Atoi(string(s[2]))
			}
			m[cur] = i
		}
	}
	return m
}

// TestNVCCCubins: for every architecture CUDA 13 compiles, the kernels, parameter layouts, registers, shared and
// local memory read from the cubin are exactly what the C++ types and ptxas -v say, and the module globals have
// their sizes, initial values and the relocation of the pointer initialised with &counter.
func TestNVCCCubins(t *testing.T) {
	for _, arch := range []int{75, 80, 86, 89, 90, 100, 120} {
		img, log := nvcc(t, "-cubin", "-arch=sm_"+strconv.Itoa(arch), "-Xptxas", "-v")
		f, err := cubin.Parse(img)
		if err != nil {
			t.Fatalf("sm_%d: %v", arch, err)
		}
		if f.Arch != arch {
			t.Errorf("sm_%d: arch %d", arch, f.Arch)
		}
		ptxas := parsePtxas(t, log)
		if len(f.Kernels) != len(kernelsCU) || len(ptxas) != len(kernelsCU) {
			t.Errorf("sm_%d: %d kernels, ptxas compiled %d, the source has %d", arch, len(f.Kernels), len(ptxas),
				len(kernelsCU))
		}
		for _, k := range f.Kernels {
			want, ok := kernelsCU[k.Name]
			if !ok {
				t.Errorf("sm_%d: unexpected kernel %s", arch, k.Name)
				continue
			}
			if !slices.Equal(k.Params, want) || k.ParamBytes != device.ArgsSize(want) {
				t.Errorf("sm_%d: %s params %v (%d bytes), want %v", arch, k.Name, k.Params, k.ParamBytes, want)
			}
			p := ptxas[k.Name]
			if k.Registers != p.registers || int(k.SharedBytes) != p.smem || int(k.LocalBytes) != p.stack {
				t.Errorf("sm_%d: %s registers %d smem %d local %d, ptxas -v says %+v", arch, k.Name, k.Registers,
					k.SharedBytes, k.LocalBytes, p)
			}
		}
		if k, _ := f.Kernel("shared_user"); k.MaxThreads != 128 {
			t.Errorf("sm_%d: shared_user max threads %d, __launch_bounds__(128)", arch, k.MaxThreads)
		}
		checkGlobals(t, arch, f)
		// ptxas writes the program headers after the section headers; an image cut after the section headers
		// (what a loader that sizes an ELF by its section headers reads) parses the same
		end := binary.LittleEndian.Uint64(img[0x28:]) + 64*uint64(binary.LittleEndian.Uint16(img[0x3c:]))
		if phoff := binary.LittleEndian.Uint64(img[0x20:]); phoff < end || end >= uint64(len(img)) {
			t.Logf("sm_%d: program headers at %d, section headers end at %d of %d bytes", arch, phoff, end, len(img))
		}
		if cut, err := cubin.Parse(img[:end]); err != nil || !reflect.DeepEqual(cut.Kernels, f.Kernels) ||
			len(cut.Globals) != len(f.Globals) {
			t.Errorf("sm_%d: the image cut after its section headers: %v", arch, err)
		}
	}
}

func checkGlobals(t *testing.T, arch int, f *cubin.File) {
	t.Helper()
	init := func(name string) []byte {
		g, ok := f.Global(name)
		if !ok {
			t.Fatalf("sm_%d: no global %s in %+v", arch, name, f.Globals)
		}
		d := f.Data[g.Data]
		if d.Init == nil {
			return make([]byte, g.Size)
		}
		return d.Init[g.Offset : g.Offset+g.Size]
	}
	f32s := func(b []byte) []float32 {
		var out []float32
		for i := 0; i+4 <= len(b); i += 4 {
			out = append(out, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
		}
		return out
	}
	if v := f32s(init("table")); !slices.Equal(v, []float32{1.5, 2.5, 3.5, 4.5, 5.5}) {
		t.Errorf("sm_%d: table = %v", arch, v)
	}
	if v := math.Float64frombits(binary.LittleEndian.Uint64(init("dscalar"))); v != 3.25 {
		t.Errorf("sm_%d: dscalar = %v", arch, v)
	}
	if v := init("cvals"); !bytes.Equal(v, []byte{7, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0, 10, 0, 0, 0}) {
		t.Errorf("sm_%d: cvals = %v", arch, v)
	}
	if g, _ := f.Global("cvals"); !g.Constant {
		t.Errorf("sm_%d: cvals is not a __constant__", arch)
	}
	if g, _ := f.Global("managed_v"); !g.Managed || binary.LittleEndian.Uint32(init("managed_v")) != 42 {
		t.Errorf("sm_%d: managed_v %+v = %v", arch, g, init("managed_v"))
	}
	if c := init("counter"); !bytes.Equal(c, make([]byte, 4)) {
		t.Errorf("sm_%d: counter = %v", arch, c)
	}
	// ptr_to_counter = &counter: a relocation at its place, to counter's place
	p, _ := f.Global("ptr_to_counter")
	c, _ := f.Global("counter")
	found := false
	for _, r := range f.Data[p.Data].Relocs {
		if r.Offset == p.Offset {
			found = r.Size == 8 && r.Data == c.Data && r.Target == c.Offset && r.Symbol == "counter"
		}
	}
	if !found {
		t.Errorf("sm_%d: no relocation of ptr_to_counter to counter in %+v", arch, f.Data[p.Data].Relocs)
	}
}

// TestPTXAndCubinAgree: the PTX nvcc writes for the same source declares the same parameter layouts and module
// globals (sizes, initial bytes, the address in ptr_to_counter) as the cubin ptxas builds from it: package ptx and
// package cubin read the two independently.
func TestPTXAndCubinAgree(t *testing.T) {
	src, _ := nvcc(t, "-ptx", "-arch=sm_90")
	img, _ := nvcc(t, "-cubin", "-arch=sm_90")
	f, err := cubin.Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	globals, err := ptx.Globals(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(globals) != len(f.Globals) {
		t.Errorf("%d PTX globals, %d in the cubin", len(globals), len(f.Globals))
	}
	for _, g := range globals {
		c, ok := f.Global(g.Name)
		if !ok {
			t.Errorf("PTX global %s is not in the cubin", g.Name)
			continue
		}
		var cinit []byte
		if d := f.Data[c.Data]; d.Init != nil {
			cinit = d.Init[c.Offset : c.Offset+c.Size]
		}
		pinit := append(append([]byte(nil), g.Init...), make([]byte, g.Size-uint64(len(g.Init)))...)
		if c.Size != g.Size || c.Constant != g.Const || c.Managed != g.Managed ||
			cinit != nil && !bytes.Equal(cinit, pinit) || cinit == nil && g.Init != nil && len(bytes.Trim(pinit, "\x00")) != 0 {
			t.Errorf("global %s: PTX %+v, cubin %+v %v", g.Name, g, c, cinit)
		}
		if g.Name == "ptr_to_counter" && (len(g.Relocs) != 1 || g.Relocs[0].Symbol != "counter") {
			t.Errorf("PTX ptr_to_counter relocations %+v", g.Relocs)
		}
	}
	entries, err := ptx.Entries(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(kernelsCU) {
		t.Errorf("%d PTX entries, want %d", len(entries), len(kernelsCU))
	}
	for _, e := range entries {
		if want := kernelsCU[e.Name]; !slices.Equal(e.Params, want) {
			t.Errorf("PTX %s params %v, want %v", e.Name, e.Params, want)
		}
	}
}
