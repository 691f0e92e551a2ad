package cuda_test

import (
	"context"
	"encoding/binary"
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

// TestCUDAContextsIsolate checks on the real driver what the tenants' isolation rests on (docs/tenants.md). Inside
// one process contexts isolate nothing the GPU suite could rely on (an H100 let a kernel of one context read another
// context's module globals and registered host memory, and one illegal address poisoned every context of the
// process), so each tenant runs in an executor process of its own. This test is tenant A (this process) against
// tenants B (child processes, one per probe, since a fault ends what a process can do):
//   - A's memory mapped through the virtual memory management calls, A's module global and A's registered host
//     memory (a model image) are unreachable from B's kernels: each read faults in B;
//   - a kernel fault in B leaves A's contexts, its primary context and the GPU in service;
//   - pageable host memory is readable by a process's own kernels exactly when the device reports pageable memory
//     access (HMM), which the gpuserver warns about at start.
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
	if err := addIn(t, ca, buf, buf, buf+2048, 256); err != nil {
		t.Fatalf("tenant A's own kernel on its mapped memory: %v", err)
	}
	src := []byte(".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 secret[4096];\n")
	ma, err := ca.LoadModule(src)
	must(t, err)
	gp, _, err := ma.Global("secret")
	must(t, err)
	reg, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_SHARED)
	must(t, err)
	defer syscall.Munmap(reg)
	copy(reg, init)
	if err := b.RegisterHost(reg); err != nil {
		t.Fatalf("register host memory: %v", err)
	}
	defer b.UnregisterHost(reg)
	hostPtr := device.Ptr(uintptr(unsafe.Pointer(&reg[0])))

	for _, c := range []struct {
		what string
		addr device.Ptr
	}{{"mapped memory", buf}, {"a module global", gp}, {"registered host memory", hostPtr}} {
		if got := probe(t, "read", c.addr); got != "fault" {
			t.Errorf("tenant B's kernel reading tenant A's %s at %#x: %q, want a fault in B's process", c.what,
				uint64(c.addr), got)
		}
	}
	if got := probe(t, "read", 0x1000); got != "fault" {
		t.Fatalf("tenant B's kernel on a bad address: %q, want a fault", got)
	}
	if ca.Err() != nil {
		t.Fatalf("tenant A's context after B's faults: %v", ca.Err())
	}
	if err := addIn(t, ca, buf, buf, buf+2048, 256); err != nil {
		t.Fatalf("tenant A's kernel after B's faults: %v (a fault in another process must not reach this one)", err)
	}
	must(t, own.CopyHtoD(buf, init)) // the primary context too
	must(t, own.Synchronize(ctx))

	pageable := b.PageableMemoryAccess(0)
	got := probe(t, "own-heap", 0)
	switch {
	case pageable && got == "fault":
		t.Errorf("the device reports pageable memory access, yet a kernel could not read its process's heap")
	case !pageable && got != "fault":
		t.Errorf("the device reports no pageable memory access, yet reading the heap gave %q", got)
	}
	t.Logf("pageable host memory access (HMM/ATS): %v: an executor's kernels read its own heap exactly then", pageable)
}
