package remoting

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// h100Handler is a device handler of function "f" on a simulated h100x8 node (compute capability 9.0, which
// CUDA 13's modules have code for) in the given kernel mode.
func h100Handler(t *testing.T, mode sim.KernelMode) *deviceHandler {
	t.Helper()
	ctx := context.Background()
	dev, xn := simNodeOf(t, "h100x8", mode, 64<<20)
	h, err := newDeviceHandler(ctx, Config{Device: dev, Node: xn, Binder: &binder{current: map[string]int{}}},
		SessionInfo{Function: "f", Spec: pool.FunctionSpec{Name: "f", MemoryBytes: 16 << 20}}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() }) // before the node's cleanups
	return h
}

func f32le(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// TestNVCCModuleThroughTheHandler: a fat binary nvcc builds (sm_90 cubin and compute_90 PTX) goes through
// cuLibraryLoadData, cuModuleGetFunction (the layout the shim packs arguments by), cuModuleGetGlobal,
// cuLaunchKernel and copies exactly as a program's calls arrive from the shim: the kernels the sim computes give
// exact results, the C++ kernel is CUDA_ERROR_NOT_SUPPORTED.
func TestNVCCModuleThroughTheHandler(t *testing.T) {
	dir := pyenv.Require(t)
	out := filepath.Join(t.TempDir(), "module.fatbin")
	if b, err := exec.Command(pyenv.NVCC(dir), "-fatbin", "-arch=sm_90", "-o", out, "testdata/module.cu").
		CombinedOutput(); err != nil {
		t.Fatalf("nvcc: %v\n%s", err, b)
	}
	img, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h := h100Handler(t, sim.KernelsReference)
	lib, r := h.CuLibraryLoadData(ctx, img, uint64(len(img)))
	if r != ResultSuccess {
		t.Fatalf("cuLibraryLoadData: %v", r)
	}
	layout := make([]byte, 4+8*wireParamMax)
	va, r := h.CuModuleGetFunction(ctx, layout, lib, "vector_add")
	if r != ResultSuccess || binary.LittleEndian.Uint32(layout) != 4 || binary.LittleEndian.Uint32(layout[28:]) != 24 {
		t.Fatalf("vector_add: %v, layout % x", r, layout[:36])
	}
	setResult, r := h.CuModuleGetFunction(ctx, layout, lib, "set_result")
	if r != ResultSuccess {
		t.Fatalf("set_result: %v", r)
	}
	bias, size, r := h.CuModuleGetGlobal_v2(ctx, lib, "bias")
	if r != ResultSuccess || size != 16 {
		t.Fatalf("bias: %v %d", r, size)
	}
	result, _, r := h.CuModuleGetGlobal_v2(ctx, lib, "result")
	if r != ResultSuccess {
		t.Fatalf("result: %v", r)
	}
	c, r := h.CuMemAlloc_v2(ctx, 16)
	if r != ResultSuccess {
		t.Fatalf("alloc: %v", r)
	}
	if r := h.CuMemcpyHtoD_v2(ctx, bias, f32le(1, 2, 3, 4), 16); r != ResultSuccess { // cudaMemcpyToSymbol
		t.Fatalf("to the global: %v", r)
	}
	args := binary.LittleEndian.AppendUint64(nil, bias)
	args = binary.LittleEndian.AppendUint64(args, bias)
	args = binary.LittleEndian.AppendUint64(args, c)
	args = binary.LittleEndian.AppendUint32(args, 4)
	if r := h.CuLaunchKernel(ctx, va, 1, 1, 1, 32, 1, 1, 0, 0, args, 0); r != ResultSuccess {
		t.Fatalf("vector_add launch: %v", r)
	}
	if r := h.CuLaunchKernel(ctx, setResult, 1, 1, 1, 1, 1, 1, 0, 0, f32le(6.5), 0); r != ResultSuccess {
		t.Fatalf("set_result launch: %v", r)
	}
	got := make([]byte, 16)
	if r := h.CuMemcpyDtoH_v2(ctx, got, c, 16); r != ResultSuccess || string(got) != string(f32le(2, 4, 6, 8)) {
		t.Errorf("vector_add over the global: % x (%v)", got, r)
	}
	if r := h.CuMemcpyDtoH_v2(ctx, got[:4], result, 4); r != ResultSuccess || string(got[:4]) != string(f32le(6.5)) {
		t.Errorf("result after set_result(6.5): % x (%v)", got[:4], r)
	}
	addBias, r := h.CuModuleGetFunction(ctx, layout, lib, "_Z8add_biasPfj")
	if r != ResultSuccess {
		t.Fatalf("add_bias: %v", r)
	}
	if r := h.CuLaunchKernel(ctx, addBias, 1, 1, 1, 32, 1, 1, 0, 0, args[:12], 0); r != ResultKernelNotSimulated {
		t.Errorf("C++ kernel launch: %v, want ResultKernelNotSimulated (CUDA_ERROR_NOT_SUPPORTED from the shim)", r)
	}
}

// TestLibraryModuleThroughTheHandler: the first module of libtorch_cuda with code for 9.0 loads through
// cuLibraryLoadData; its kernel launches are refused by default and run dry with --sim-kernels=dry.
func TestLibraryModuleThroughTheHandler(t *testing.T) {
	path := pyenv.Library(t, "torch/lib/libtorch_cuda.so")
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := f.Section(".nv_fatbin").Data()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	entries, size, err := fatbin.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fatbin.Select(entries, 90); err != nil {
		t.Fatalf("libtorch_cuda's first module: %v", err)
	}
	img := data[:size]
	ctx := context.Background()
	for mode, want := range map[sim.KernelMode]Result{sim.KernelsReference: ResultKernelNotSimulated,
		sim.KernelsDry: ResultSuccess} {
		h := h100Handler(t, mode)
		lib, r := h.CuLibraryLoadData(ctx, img, uint64(len(img)))
		if r != ResultSuccess {
			t.Fatalf("%v: cuLibraryLoadData: %v", mode, r)
		}
		m, err := h.loadOn(h.modules[lib], h.gpu)
		if err != nil {
			t.Fatal(err)
		}
		name := firstKernel(t, img)
		layout := make([]byte, 4+8*wireParamMax)
		fn, r := h.CuModuleGetFunction(ctx, layout, lib, name)
		if r != ResultSuccess {
			t.Fatalf("%v: %s: %v", mode, name, r)
		}
		df, _ := m.Function(name)
		var end uint32
		for _, p := range df.Params() {
			end = max(end, p.Offset+p.Size)
		}
		if r := h.CuLaunchKernel(ctx, fn, 1, 1, 1, 128, 1, 1, 0, 0, make([]byte, end), 0); r != want {
			t.Errorf("%v: launch of %s: %v, want %v", mode, name, r, want)
		}
		if r := h.CuCtxSynchronize(ctx); r != ResultSuccess {
			t.Errorf("%v: synchronize: %v", mode, r)
		}
	}
}

// firstKernel is the name of the first kernel of the cubin a 9.0 GPU loads from a fat binary.
func firstKernel(t *testing.T, img []byte) string {
	t.Helper()
	entries, _, err := fatbin.Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	e, err := fatbin.Select(entries, 90)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Data(256 << 20)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cubin.Parse(b)
	if err != nil || len(c.Kernels) == 0 {
		t.Fatalf("%s: %v, %d kernels", e, err, len(c.Kernels))
	}
	return c.Kernels[0].Name
}
