package sim

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestWholeGranuleWriteIntoLentChunkTakesNoPageFaults: a write that covers a granule of memory lent by descriptor
// (a swap's copy into an imported chunk) backs the granule in one go instead of taking a page fault per 4 KiB page
// (the cost that kept the first swap onto a GPU a tenant never ran on at a third of the one-process figure); a
// partial write still faults in only the pages it touches (a lent chunk costs host memory for what is written into
// it); the bytes read back are the bytes written, and a granule given back by zeroing is backed again by the next
// whole write. Counted with the kernel's page-fault counter of the writing thread (skipped where perf events are
// not allowed).
func TestWholeGranuleWriteIntoLentChunkTakesNoPageFaults(t *testing.T) {
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	newBackend := func() *Backend {
		b, err := New(Options{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		return b
	}
	a, b := newBackend(), newBackend()
	gran := a.gran
	size := 2 * gran
	phys, err := a.CreatePhysical(1, size)
	if err != nil {
		t.Fatal(err)
	}
	f, err := a.ExportPhysical(phys)
	if err != nil {
		t.Fatal(err)
	}
	imp, err := b.ImportPhysical(1, size, f)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	ptr, err := b.ReserveAddress(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Map(ptr, imp); err != nil {
		t.Fatal(err)
	}
	if err := b.SetAccess(ptr, size, []int{1}); err != nil {
		t.Fatal(err)
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_PAGE_FAULTS,
		Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{})), Bits: unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		t.Skipf("perf events of this thread are not allowed here (%v): page faults cannot be counted", err)
	}
	defer unix.Close(fd)
	faults := func(write func()) uint64 {
		t.Helper()
		var before, after [8]byte
		if _, err := unix.Read(fd, before[:]); err != nil {
			t.Fatal(err)
		}
		write()
		if _, err := unix.Read(fd, after[:]); err != nil {
			t.Fatal(err)
		}
		return *(*uint64)(unsafe.Pointer(&after)) - *(*uint64)(unsafe.Pointer(&before))
	}
	src := bytes.Repeat([]byte("model bytes "), int(size)/12+1)[:size]
	write := func(at, n uint64) func() {
		return func() {
			if err := b.writeDevice(1, ptr+device.Ptr(at), src[at:at+n]); err != nil {
				t.Fatal(err)
			}
		}
	}
	pages := gran / uint64(unix.Getpagesize())
	// Part of granule 1 first: its pages fault in one by one (and only those).
	if n := faults(write(gran, 16<<10)); n == 0 || n > 16 {
		t.Errorf("a 16 KiB write into an untouched granule took %d page faults, want 1 to 16 (its own pages)", n)
	}
	if n := faults(write(0, size)); n > pages/8 {
		t.Errorf("a write of two whole granules of lent memory took %d page faults; want it backed in one go "+
			"(at most %d, a granule has %d pages)", n, pages/8, pages)
	}
	got := make([]byte, size)
	if err := b.readDevice(1, got, ptr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("the lent chunk reads other bytes than were written into it")
	}
	if err := b.zeroDevice(1, ptr, size); err != nil { // gives the pages back
		t.Fatal(err)
	}
	if err := b.readDevice(1, got, ptr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, size)) {
		t.Fatal("the lent chunk reads other bytes than zeros after zeroing")
	}
	if n := faults(write(0, size)); n > pages/8 {
		t.Errorf("a whole write after zeroing took %d page faults, want at most %d", n, pages/8)
	}
	if err := b.Unmap(ptr, size); err != nil {
		t.Fatal(err)
	}
	if err := imp.Release(); err != nil {
		t.Fatal(err)
	}
	if err := phys.Release(); err != nil {
		t.Fatal(err)
	}
}
