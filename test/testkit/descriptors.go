package testkit

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// ExhaustDescriptors lowers the process's descriptor limit to 64 above the descriptors open now and opens
// os.DevNull until an open fails with EMFILE, so that every descriptor of the process is in use. It skips the test
// where the limit cannot be lowered (or is too low already, or /proc/self/fd is missing). The returned release
// closes the descriptors it opened and restores the limit; it may be called more than once, and is called when the
// test ends.
func ExhaustDescriptors(t testing.TB) (release func()) {
	t.Helper()
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	lim := orig
	if lim.Cur = uint64(len(entries)) + 64; lim.Cur > orig.Cur {
		t.Skipf("descriptor limit %d too low to test", orig.Cur)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skipf("cannot lower the descriptor limit: %v", err)
	}
	var hogs []*os.File
	release = func() {
		for _, f := range hogs {
			f.Close()
		}
		hogs = nil
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig)
	}
	t.Cleanup(release)
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				release()
				t.Fatalf("filling the descriptor table: %v", err)
			}
			return release
		}
		hogs = append(hogs, f)
	}
}
