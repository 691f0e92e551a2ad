package shrinkwrap

import (
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// openBeneathPortable resolves rel inside root with filepath.EvalSymlinks, refuses a result outside root (EXDEV, as
// openat2 would), and opens the resolved path component by component from top without following links, so a
// folder or file swapped for a link meanwhile is refused (ELOOP), not followed.
func openBeneathPortable(top *os.File, rel, root string) (*os.File, error) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	resolved, err := filepath.EvalSymlinks(filepath.Join(realRoot, filepath.FromSlash(rel)))
	if err != nil {
		return nil, err
	}
	inside, err := filepath.Rel(realRoot, resolved)
	if err != nil || inside == ".." || strings.HasPrefix(inside, ".."+string(filepath.Separator)) ||
		filepath.IsAbs(inside) {
		return nil, &os.PathError{Op: "open", Path: rel, Err: unix.EXDEV}
	}
	dir := top
	parts := strings.Split(filepath.ToSlash(inside), "/")
	for i, p := range parts {
		flags := unix.O_DIRECTORY
		if i == len(parts)-1 {
			flags = 0
		}
		next, err := openAt(dir, p, flags)
		if dir != top {
			dir.Close()
		}
		if err != nil {
			return nil, err
		}
		dir = next
	}
	return dir, nil
}
