package cuda_test

import (
	"context"
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
	"unsafe"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// addIn loads vector_add in dc and runs c = a + b over n floats on a stream of dc; it returns the error of the
// launch or of the synchronisation.
func addIn(t *testing.T, dc device.Context, a, b, c device.Ptr, n uint32) error {
	t.Helper()
	mod, err := dc.LoadModule(kernels.PTX())
	must(t, err)
	f, err := mod.Function("vector_add")
	must(t, err)
	s, err := dc.NewStream()
	must(t, err)
	args, err := device.PackArgs(f.Params(), a, b, c, n)
	must(t, err)
	if err := s.Launch(f, device.Dim3{X: (n + 255) / 256}, device.Dim3{X: 256}, 0, args); err != nil {
		return err
	}
	return s.Synchronize(context.Background())
}

// TestCUDAContextsIsolate checks on the real driver what docs/security.md claims contexts of one process do and do
// not isolate, since the executors' design rests on it:
//   - memory mapped through the virtual memory management calls is reachable from every context of a GPU it is
//     accessible on (so the executors keep one tenant's memory mapped on a GPU at a time);
//   - a module global of one context is not reachable from a kernel of another context;
//   - a kernel fault is sticky for its context only: another context and the primary context go on, and a new
//     context on the same GPU works;
//   - registered host memory (the model repository: registered without DEVICEMAP) is not readable by kernels, and
//     pageable host memory is readable exactly when the device reports pageable memory access (HMM), which the
//     gpuserver warns about at start.
func TestCUDAContextsIsolate(t *testing.T) {
	b := openCUDA(t)
	ctx := context.Background()
	g := b.GPUs()[0]
	buf := mapOn(t, b, 0, g.Granularity)
	own, err := b.NewStream(0)
	must(t, err)
	init := make([]byte, 4096)
	for i := 0; i < 1024; i++ {
		binary.LittleEndian.PutUint32(init[4*i:], 0x3f800000) // 1.0
	}
	must(t, own.CopyHtoD(buf, init))
	must(t, own.Synchronize(ctx))

	ca, err := b.NewContext(0)
	must(t, err)
	defer ca.Destroy()
	cb, err := b.NewContext(0)
	must(t, err)
	defer cb.Destroy()

	// Mapped memory: any context of the GPU reaches it.
	if err := addIn(t, ca, buf, buf, buf+2048, 256); err != nil {
		t.Fatalf("context A on memory mapped for gpu 0: %v (docs/security.md assumes the driver's VMM mappings "+
			"are the process's)", err)
	}

	// A module global of context A, read by a kernel of context B.
	src := []byte(".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 secret[4096];\n")
	ma, err := ca.LoadModule(src)
	must(t, err)
	gp, _, err := ma.Global("secret")
	must(t, err)
	if err := addIn(t, cb, gp, buf, buf, 256); !device.IsContextFault(err) {
		t.Errorf("a kernel of context B reading a module global of context A: %v; want a fault. If it succeeded, "+
			"module globals are NOT private to their context on this driver and docs/security.md must say so", err)
	}
	if ca.Err() != nil {
		t.Fatalf("context A poisoned by B's fault: %v", ca.Err())
	}
	if err := addIn(t, ca, gp, gp, gp, 256); err != nil {
		t.Fatalf("context A after B's fault: %v", err)
	}
	must(t, own.CopyHtoD(buf, init)) // the primary context too
	must(t, own.Synchronize(ctx))
	cc, err := b.NewContext(0)
	must(t, err)
	if err := addIn(t, cc, buf, buf, buf+2048, 256); err != nil {
		t.Fatalf("a new context after a fault: %v", err)
	}
	must(t, cc.Destroy())

	// Host memory.
	reg, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_SHARED)
	must(t, err)
	defer syscall.Munmap(reg)
	if err := b.RegisterHost(reg); err != nil {
		t.Fatalf("register host memory: %v", err)
	}
	defer b.UnregisterHost(reg)
	cd, err := b.NewContext(0)
	must(t, err)
	defer cd.Destroy()
	hostPtr := device.Ptr(uintptr(unsafe.Pointer(&reg[0])))
	if err := addIn(t, cd, hostPtr, buf, buf, 256); !device.IsContextFault(err) {
		t.Errorf("a kernel reading registered host memory (the model repository) by its host address: %v; want a "+
			"fault (registered without DEVICEMAP)", err)
	}
	pageable := b.PageableMemoryAccess(0)
	heap := make([]byte, 1<<20)
	ce, err := b.NewContext(0)
	must(t, err)
	defer ce.Destroy()
	err = addIn(t, ce, device.Ptr(uintptr(unsafe.Pointer(&heap[0]))), buf, buf, 256)
	switch {
	case pageable && err != nil:
		t.Errorf("the device reports pageable memory access, yet a kernel could not read the heap: %v", err)
	case !pageable && !device.IsContextFault(err):
		t.Errorf("the device reports no pageable memory access, yet reading the heap gave %v", err)
	}
	t.Logf("pageable host memory access (HMM/ATS): %v: functions are isolated only when this is false", pageable)
	if errors.Is(err, device.ErrKernelFault) {
		t.Logf("the heap read faulted as a kernel fault: %v", err)
	}
}
