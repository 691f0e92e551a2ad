package shrinkwrap

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// openBeneath opens rel inside the folder top (whose path is root), following links only while they stay beneath
// it: openat2 with RESOLVE_BENEATH (EXDEV for a link that leaves), or the portable check where the kernel lacks it.
func openBeneath(top *os.File, rel, root string) (*os.File, error) {
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(int(top.Fd()), rel, how)
		switch {
		case err == unix.EINTR || err == unix.EAGAIN:
			continue
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM): // no openat2 (or a seccomp filter refusing it)
			return openBeneathPortable(top, rel, root)
		case err != nil:
			return nil, &os.PathError{Op: "open", Path: rel, Err: err}
		}
		return os.NewFile(uintptr(fd), rel), nil
	}
}
