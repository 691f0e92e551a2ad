package sim_test

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// TestNVCCModuleOnTheSim: fat binaries nvcc builds from testdata/module.cu - for sm_90 (an sm_90 cubin and
// compute_90 PTX) and for nvcc's default target (an sm_75 cubin and compute_75 PTX, which a 9.0 GPU JIT-compiles)
// - load on a simulated H100 and compute vector_add and set_result exactly, with the global's initial values; the
// C++ kernel is refused naming it; a simulated V100 has no binary for either.
func TestNVCCModuleOnTheSim(t *testing.T) {
	dir := pyenv.Require(t)
	h100 := newSim(t, sim.Options{Node: preset(t, "h100x8")})
	v100 := newSim(t, sim.Options{Node: preset(t, "v100x4")})
	for _, c := range []struct {
		arch   []string
		binary int // the code loaded: the sm_90 cubin, or PTX (0)
	}{{[]string{"-arch=sm_90"}, 90}, {nil, 0}} {
		arch := c.arch
		out := filepath.Join(t.TempDir(), "module.fatbin")
		cmd := exec.Command(pyenv.NVCC(dir), append(append([]string{"-fatbin", "-o", out}, arch...),
			"testdata/module.cu")...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nvcc %v: %v\n%s", arch, err, b)
		}
		img, err := os.ReadFile(out)
		must(t, err)
		m, err := h100.LoadModule(3, img)
		if err != nil {
			t.Fatalf("nvcc %v: %v", arch, err)
		}
		va, err := m.Function("vector_add")
		must(t, err)
		if v := va.(device.AttributedFunction).Attributes().BinaryVersion; v != c.binary {
			t.Errorf("nvcc %v: loaded code for %d, want %d", arch, v, c.binary)
		}
		bias, size, err := m.Global("bias")
		must(t, err)
		if v := bytesF32(read(t, h100, 3, bias, 16)); size != 16 || v[0] != 0.5 || v[3] != 3.5 {
			t.Errorf("nvcc %v: bias (%d bytes) = %v", arch, size, v)
		}
		result, _, err := m.Global("result")
		must(t, err)
		must(t, run(t, h100, m, "set_result", float32(42.25)))
		if v := bytesF32(read(t, h100, 3, result, 4)); v[0] != 42.25 {
			t.Errorf("nvcc %v: result = %v after set_result(42.25)", arch, v)
		}
		must(t, run(t, h100, m, "vector_add", bias, bias, bias, uint32(4)))
		if v := bytesF32(read(t, h100, 3, bias, 16)); v[0] != 1 || v[1] != 3 || v[2] != 5 || v[3] != 7 {
			t.Errorf("nvcc %v: vector_add(bias, bias) = %v", arch, v)
		}
		if err := run(t, h100, m, "_Z8add_biasPfj", bias, uint32(4)); !errors.Is(err, sim.ErrKernelNotSimulated) {
			t.Errorf("nvcc %v: add_bias: %v", arch, err)
		}
		if _, err := v100.LoadModule(0, img); !errors.Is(err, device.ErrNoBinaryForGPU) {
			t.Errorf("nvcc %v on a V100: %v", arch, err)
		}
	}
}

// TestLibraryKernelsReachTheSim: modules of libtorch_cuda and cuBLAS as they ship load on a simulated H100; their
// kernels are found with their layouts, refused at launch by default and accepted (not executed) in dry mode.
func TestLibraryKernelsReachTheSim(t *testing.T) {
	strict := newSim(t, sim.Options{Node: preset(t, "h100x8")})
	dry := newSim(t, sim.Options{Node: preset(t, "h100x8"), Kernels: sim.KernelsDry})
	for _, lib := range []string{"torch/lib/libtorch_cuda.so", "nvidia/cu13/lib/libcublas.so.13"} {
		path := pyenv.Library(t, lib)
		f, err := elf.Open(path)
		must(t, err)
		data, err := f.Section(".nv_fatbin").Data()
		f.Close()
		must(t, err)
		loaded := 0
		for off := 0; off < len(data) && loaded < 3; {
			_, size, err := fatbin.Parse(data[off:])
			if err != nil {
				t.Fatalf("%s at %d: %v", lib, off, err)
			}
			img := data[off : off+int(size)]
			off = (off + int(size) + 7) &^ 7
			for _, b := range []*sim.Backend{strict, dry} {
				m, err := b.LoadModule(0, img)
				if errors.Is(err, device.ErrNoBinaryForGPU) {
					break // a container without 9.0 code
				}
				if err != nil {
					t.Fatalf("%s: %v", lib, err)
				}
				fn := anyFunction(t, m, img)
				if fn == nil {
					break
				}
				s, err := b.NewStream(0)
				must(t, err)
				args := make([]byte, device.ArgsSize(fn.Params()))
				err = s.Launch(fn, device.Dim3{X: 1}, device.Dim3{X: 32}, 0, args)
				if b == strict && !errors.Is(err, sim.ErrKernelNotSimulated) {
					t.Errorf("%s: %s launched on the strict sim: %v", lib, fn.Name(), err)
				}
				if b == dry && err != nil {
					t.Errorf("%s: %s in dry mode: %v", lib, fn.Name(), err)
				}
				must(t, s.Synchronize(t.Context()))
				must(t, s.Destroy())
				must(t, m.Unload())
				if b == dry {
					loaded++
				}
			}
		}
		if loaded == 0 {
			t.Errorf("%s: no module loaded", lib)
		}
	}
	if dry.DryLaunches() == 0 {
		t.Error("no dry launch counted")
	}
}

// anyFunction returns a kernel of the module: the first of the cubin the sim chose.
func anyFunction(t *testing.T, m device.Module, img []byte) device.Function {
	t.Helper()
	entries, _, err := fatbin.Parse(img)
	must(t, err)
	e, err := fatbin.Select(entries, 90)
	must(t, err)
	data, err := e.Data(256 << 20)
	must(t, err)
	names := cubinKernelNames(t, data)
	if len(names) == 0 {
		return nil
	}
	f, err := m.Function(names[0])
	must(t, err)
	return f
}

func cubinKernelNames(t *testing.T, data []byte) []string {
	t.Helper()
	f, err := cubin.Parse(data)
	must(t, err)
	var names []string
	for _, k := range f.Kernels {
		names = append(names, k.Name)
	}
	return names
}
