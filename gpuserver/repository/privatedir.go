package repository

import (
	"fmt"
	"os"
	"syscall"
)

// PrivateDir makes dir (and its missing parents) and checks that it is this process's alone: a directory, not a
// link, owned by this process's user, with no access for group or others (narrowed to 0700 when it is ours but
// wider). A repository directory holds every model image; where it lies in a folder everyone may write (up keeps
// it in /dev/shm on a node with GPUs, under a name derived from its state dir), another user could make it first
// and then read, replace or remove the images in it. A directory of another user is refused with an error naming it.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("repository: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: repository dir %s is not a directory (%s)", ErrInvalid, dir, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: repository dir %s belongs to uid %d, not to this process's %d: its owner could read "+
			"or replace the model images in it; remove it, or choose another", ErrInvalid, dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("repository: %w", err)
		}
	}
	return nil
}
