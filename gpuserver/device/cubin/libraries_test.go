package cubin_test

import (
	"debug/elf"
	"slices"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// fatbins returns the fat binary containers of a shared library's .nv_fatbin section, as __cudaRegisterFatBinary
// receives them one by one (each 8-byte aligned after the previous).
func fatbins(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sec := f.Section(".nv_fatbin")
	if sec == nil {
		t.Fatalf("%s has no .nv_fatbin section", path)
	}
	data, err := sec.Data()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for off := 0; off < len(data); {
		if !fatbin.IsFatbin(data[off:]) {
			off += 8 // padding between containers
			continue
		}
		_, size, err := fatbin.Parse(data[off:])
		if err != nil {
			t.Fatalf("%s: container at %d: %v", path, off, err)
		}
		out = append(out, data[off:off+int(size)])
		off = (off + int(size) + 7) &^ 7
	}
	return out
}

// knownKernels are PyTorch kernels whose parameter layouts follow from their public C++ signatures:
// (int, FillFunctor<float> {float value}, std::array<char*, 1>) and
// (int, CUDAFunctor_add<float> {float alpha}, std::array<char*, 3>).
var knownKernels = map[string][]device.Param{
	"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_": {
		{Offset: 0, Size: 4}, {Offset: 4, Size: 4}, {Offset: 8, Size: 8}},
	"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_": {
		{Offset: 0, Size: 4}, {Offset: 4, Size: 4}, {Offset: 8, Size: 24}},
}

// TestLibraryModules reads the modules of NVIDIA's libraries and PyTorch as they ship in the pinned wheels: every
// fat binary container parses, every entry is stored, LZ4 or Zstandard, and the entry the driver would load on
// an H100 (compute capability 9.0) decompresses and parses as a cubin whose kernels have consistent layouts.
// libtorch_cuda is read completely (its two best-known kernels are checked against their C++ signatures); of the
// others every stride-th container, which bounds the test's time.
func TestLibraryModules(t *testing.T) {
	libs := []struct {
		path   string
		stride int
	}{
		{"torch/lib/libtorch_cuda.so", 1},
		{"nvidia/cu13/lib/libcublas.so.13", 1},
		{"nvidia/cu13/lib/libcublasLt.so.13", 16},
		{"nvidia/cudnn/lib/libcudnn_ops.so.9", 1},
		{"nvidia/cudnn/lib/libcudnn_cnn.so.9", 1},
		{"nvidia/cudnn/lib/libcudnn_adv.so.9", 4},
		{"nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9", 16},
	}
	found := map[string]bool{}
	for _, lib := range libs {
		path := pyenv.Library(t, lib.path)
		containers := fatbins(t, path)
		var entries, kernels, globals int
		compression := map[string]int{}
		for i, c := range containers {
			es, _, err := fatbin.Parse(c)
			if err != nil {
				t.Fatalf("%s: container %d: %v", lib.path, i, err)
			}
			entries += len(es)
			for _, e := range es {
				compression[e.Compression()]++
			}
			if i%lib.stride != 0 {
				continue
			}
			e, err := fatbin.Select(es, 90)
			if err != nil {
				continue // a container without code for 9.0 (the driver would not load it on an H100 either)
			}
			data, err := e.Data(256 << 20)
			if err != nil {
				t.Fatalf("%s: container %d: %v", lib.path, i, err)
			}
			if e.Kind != fatbin.KindELF {
				continue
			}
			f, err := cubin.Parse(data)
			if err != nil {
				t.Fatalf("%s: container %d, %s: %v", lib.path, i, e, err)
			}
			if f.Arch != e.Arch {
				t.Errorf("%s: container %d: cubin for sm_%d in a %s entry", lib.path, i, f.Arch, e.Target())
			}
			kernels += len(f.Kernels)
			globals += len(f.Globals)
			for _, k := range f.Kernels {
				if device.ArgsSize(k.Params) != k.ParamBytes {
					t.Errorf("%s: %s: parameters %v end before its %d-byte argument buffer", lib.path, k.Name,
						k.Params, k.ParamBytes)
				}
				if want, ok := knownKernels[k.Name]; ok {
					found[k.Name] = true
					if !slices.Equal(k.Params, want) {
						t.Errorf("%s: %s params %v, want %v", lib.path, k.Name, k.Params, want)
					}
				}
			}
		}
		if len(containers) == 0 || kernels == 0 || len(compression) == 0 {
			t.Errorf("%s: %d containers, %d kernels", lib.path, len(containers), kernels)
		}
		t.Logf("%s: %d containers, %d entries %v; sm_90 cubins read (1 container in %d): %d kernels, %d globals",
			lib.path, len(containers), entries, compression, lib.stride, kernels, globals)
	}
	for name := range knownKernels {
		if !found[name] {
			t.Errorf("PyTorch kernel %s not found in libtorch_cuda", name)
		}
	}
}
