package repository

import (
	"fmt"
	"syscall"
)

// Filesystems whose pages the kernel lets a driver pin for as long as it likes. Since Linux 6.5 a long-term,
// writable pin of a file-backed page (what cuMemHostRegister takes) is refused for every other filesystem.
const (
	tmpfsMagic     = 0x01021994
	hugetlbfsMagic = 0x958458f6
)

// pinnableHint explains a failed registration of image memory in dir when dir is on a filesystem whose pages cannot
// be page-locked, and returns "" otherwise.
func pinnableHint(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return ""
	}
	switch uint64(st.Type) {
	case tmpfsMagic, hugetlbfsMagic:
		return ""
	}
	return fmt.Sprintf(" (the repository dir %s is not on a tmpfs: statfs type %#x; Linux 6.5 and later refuse to "+
		"page-lock file-backed memory elsewhere, so put the repository on a tmpfs such as /dev/shm)", dir, st.Type)
}
