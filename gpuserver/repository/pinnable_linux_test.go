package repository

import (
	"strings"
	"syscall"
	"testing"
)

func TestPinnableHintNamesAFilesystemOffTmpfs(t *testing.T) {
	if hint := pinnableHint("/dev/shm"); hint != "" {
		var st syscall.Statfs_t
		if err := syscall.Statfs("/dev/shm", &st); err == nil && st.Type == tmpfsMagic {
			t.Errorf("/dev/shm is a tmpfs, got hint %q", hint)
		}
	}
	dir := t.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	hint := pinnableHint(dir)
	switch uint64(st.Type) {
	case tmpfsMagic, hugetlbfsMagic:
		if hint != "" {
			t.Errorf("%s is on a tmpfs, got hint %q", dir, hint)
		}
	default:
		if !strings.Contains(hint, dir) || !strings.Contains(hint, "/dev/shm") {
			t.Errorf("%s is not on a tmpfs (type %#x): hint %q should name it and the remedy", dir, st.Type, hint)
		}
	}
}
