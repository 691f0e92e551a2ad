package cuda_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// openCUDA opens the real driver, or skips: the GPU suite runs under FAAS_GPU_TEST_CUDA=1 (make gpu-test).
func openCUDA(t *testing.T) *cuda.Backend {
	t.Helper()
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	b, err := cuda.Open("")
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CUDA=1 but the driver cannot be opened: %v", err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

func TestOpenWithoutDriverIsUnavailable(t *testing.T) {
	if _, err := cuda.Open("/nonexistent/libcuda.so.1"); !errors.Is(err, device.ErrUnavailable) {
		t.Fatalf("opening a missing driver: %v, want ErrUnavailable", err)
	}
}

func mapOn(t *testing.T, b device.Backend, gpu int, size uint64) device.Ptr {
	t.Helper()
	p, err := b.ReserveAddress(size, 0)
	must(t, err)
	ph, err := b.CreatePhysical(gpu, size)
	must(t, err)
	must(t, b.Map(p, ph))
	must(t, b.SetAccess(p, size, []int{gpu}))
	t.Cleanup(func() {
		_ = b.Unmap(p, size)
		_ = ph.Release()
		_ = b.FreeAddress(p, size)
	})
	return p
}

// TestCUDAVMMCopiesAndKernels: fixed-address mappings, async copies, a device-to-device copy (the GPU-to-GPU swap
// path on a single GPU), memsets, events and the reference kernels from the checked-in PTX.
func TestCUDAVMMCopiesAndKernels(t *testing.T) {
	b := openCUDA(t)
	ctx := context.Background()
	g := b.GPUs()[0]
	t.Logf("gpu 0: %s, %d MiB, granularity %d, cc %d", g.Name, g.MemoryBytes>>20, g.Granularity,
		g.ComputeCapability)
	size := 4 * g.Granularity
	a := mapOn(t, b, 0, size)
	c := mapOn(t, b, 0, size)
	s, err := b.NewStream(0)
	must(t, err)
	defer s.Destroy()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i/4096)
	}
	must(t, s.CopyHtoD(a, data))
	must(t, s.CopyDtoD(c, a, size))
	out := make([]byte, size)
	must(t, s.CopyDtoH(out, c))
	must(t, s.Synchronize(ctx))
	if !bytes.Equal(out, data) {
		t.Fatal("host -> device -> device -> host changed bytes")
	}

	mod, err := b.LoadModule(0, kernels.PTX())
	must(t, err)
	defer mod.Unload()
	const n = 1 << 16
	x := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(x[4*i:], math.Float32bits(float32(i)-1000))
	}
	must(t, s.CopyHtoD(a, x))
	fill, err := mod.Function("fill")
	must(t, err)
	args, err := device.PackArgs(fill.Params(), c, float32(2), uint32(n))
	must(t, err)
	must(t, s.Launch(fill, device.Dim3{X: n / 256}, device.Dim3{X: 256}, 0, args))
	va, _ := mod.Function("vector_add")
	args, _ = device.PackArgs(va.Params(), a, c, c, uint32(n))
	must(t, s.Launch(va, device.Dim3{X: n / 256}, device.Dim3{X: 256}, 0, args))
	relu, _ := mod.Function("relu")
	args, _ = device.PackArgs(relu.Params(), c, c, uint32(n))
	must(t, s.Launch(relu, device.Dim3{X: n / 256}, device.Dim3{X: 256}, 0, args))
	ev, err := b.NewEvent(0)
	must(t, err)
	defer ev.Destroy()
	must(t, s.Record(ev))
	res := make([]byte, 4*n)
	must(t, s.CopyDtoH(res, c))
	must(t, ev.Synchronize(ctx))
	must(t, s.Synchronize(ctx))
	for i := range n {
		got := math.Float32frombits(binary.LittleEndian.Uint32(res[4*i:]))
		if want := max(float32(i)-1000+2, 0); got != want {
			t.Fatalf("relu(x + 2)[%d] = %v, want %v", i, got, want)
		}
	}
	if _, err := mod.Function("nope"); !errors.Is(err, device.ErrNotFound) {
		t.Fatalf("missing kernel: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReserveAddressAtOnTheDriver frees a reservation and takes the same range back at its address (what a
// restarted gpuserver does for a model image's segments), and refuses a range that is taken.
func TestReserveAddressAtOnTheDriver(t *testing.T) {
	b := openCUDA(t)
	g := b.GPUs()[0].Granularity
	p, err := b.ReserveAddress(8*g, 0)
	must(t, err)
	must(t, b.FreeAddress(p, 8*g))
	got, err := b.ReserveAddressAt(p, 8*g)
	if err != nil || got != p {
		t.Fatalf("ReserveAddressAt(%#x) = %#x, %v", uint64(p), uint64(got), err)
	}
	if _, err := b.ReserveAddressAt(p+device.Ptr(2*g), g); err == nil {
		t.Fatal("reserving a range inside a reservation succeeded")
	}
	must(t, b.FreeAddress(p, 8*g))
}
