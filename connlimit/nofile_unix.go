//go:build unix

package connlimit

import "syscall"

// NoFile is the process's soft limit of open files; 1024 when it cannot be read.
func NoFile() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 1024
	}
	return uint64(rl.Cur)
}
