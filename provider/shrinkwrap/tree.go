package shrinkwrap

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A build context is untrusted input: whoever wrote it chooses its entries, and the platform copies it (as root,
// or as the user whose state dir holds the keys) and shows it to the function. So a context is read without ever
// following a link out of it:
//
//   - a symbolic link is followed only when it resolves, every link on the way included, to a regular file inside
//     the context; it is copied as that file. A link that leaves the context (an absolute target, `..` above the
//     context, or a chain of links that ends outside) is refused, as is a link to a folder (copy the folder);
//   - devices, fifos and sockets are refused;
//   - a hard link to a file that another user than the context's owner owns is refused (only possible where the
//     kernel's fs.protected_hardlinks is off: elsewhere nobody can link a file they could not write).
//
// Every entry is opened relative to its folder's descriptor with O_NOFOLLOW, and a link's target is opened with
// openat2's RESOLVE_BENEATH from the context's own descriptor where the kernel has it (Linux 5.6), so that a
// folder swapped for a link while the copy runs is refused, not followed. Errors wrap ErrUnsafeEntry and name the
// entry by its path inside the context, never by what it holds.

// ErrUnsafeEntry: a build context holds an entry the platform does not copy or run (see above).
var ErrUnsafeEntry = errors.New("build context entry refused")

// CheckTree walks the build context root as CopyTree would copy it and returns the first refused entry
// (ErrUnsafeEntry), or an error reading it.
func CheckTree(root string) error {
	return walkTree(root, nil)
}

// Open opens rel (a slash-separated path inside the build context root) for reading, following links only where
// they stay inside root; a missing file's error wraps fs.ErrNotExist, a link that leaves, ErrUnsafeEntry.
func Open(root, rel string) (*os.File, error) {
	dir, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	f, err := openBeneath(dir, rel, root)
	if err != nil {
		return nil, refusal(rel, err)
	}
	return f, nil
}

// entry is what the walker hands a visitor: a folder (f nil) or an open regular file.
type entry struct {
	rel  string // slash-separated path inside the context
	dir  bool
	mode fs.FileMode
	f    *os.File
}

// walkTree visits root's folders (before their contents) and regular files, refusing what a context may not hold.
// Python bytecode caches (__pycache__) are skipped.
func walkTree(root string, visit func(entry) error) error {
	top, err := os.Open(root)
	if err != nil {
		return err
	}
	defer top.Close()
	st, err := top.Stat()
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a folder", root)
	}
	owner := ownerOf(st)
	if visit != nil {
		if err := visit(entry{rel: ".", dir: true, mode: st.Mode().Perm()}); err != nil {
			return err
		}
	}
	w := &walker{root: root, top: top, owner: owner, visit: visit}
	return w.folder(top, ".")
}

type walker struct {
	root  string
	top   *os.File
	owner uint32
	visit func(entry) error
}

func (w *walker) folder(dir *os.File, rel string) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("reading %s: %w", w.name(rel), err)
	}
	for _, name := range names {
		child := path.Join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: %w", w.name(child), err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if name == "__pycache__" {
				continue
			}
			sub, err := openAt(dir, name, unix.O_DIRECTORY)
			if err != nil {
				return refusal(child, err)
			}
			err = w.sub(sub, child, fs.FileMode(st.Mode&0o7777).Perm())
			sub.Close()
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			if st.Nlink > 1 && st.Uid != w.owner {
				return fmt.Errorf("%w: %s: a hard link to a file of uid %d, not of the build context's owner (uid %d)",
					ErrUnsafeEntry, child, st.Uid, w.owner)
			}
			f, err := openAt(dir, name, 0)
			if err != nil {
				return refusal(child, err)
			}
			err = w.file(f, child)
			f.Close()
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			if err := w.link(dir, name, child); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: %s: a %s, not a file or folder", ErrUnsafeEntry, child, kind(st.Mode))
		}
	}
	return nil
}

func (w *walker) sub(sub *os.File, rel string, perm fs.FileMode) error {
	if w.visit != nil {
		if err := w.visit(entry{rel: rel, dir: true, mode: perm}); err != nil {
			return err
		}
	}
	return w.folder(sub, rel)
}

// file checks an opened entry (O_NOFOLLOW: what was looked at, or a refusal) and hands it to the visitor.
func (w *walker) file(f *os.File, rel string) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", w.name(rel), err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s: not a regular file", ErrUnsafeEntry, rel)
	}
	if w.visit == nil {
		return nil
	}
	return w.visit(entry{rel: rel, mode: st.Mode().Perm(), f: f})
}

// link follows a symbolic link only to a regular file inside the context.
func (w *walker) link(dir *os.File, name, rel string) error {
	target, err := readlinkAt(dir, name)
	if err != nil {
		return fmt.Errorf("%s: %w", w.name(rel), err)
	}
	if filepath.IsAbs(target) {
		return fmt.Errorf("%w: %s: a symbolic link to %s, outside the build context", ErrUnsafeEntry, rel, target)
	}
	if lexical := path.Join(path.Dir(rel), filepath.ToSlash(target)); lexical == ".." ||
		strings.HasPrefix(lexical, "../") {
		return fmt.Errorf("%w: %s: a symbolic link to %s, outside the build context", ErrUnsafeEntry, rel, target)
	}
	f, err := openBeneath(w.top, rel, w.root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s: a symbolic link to %s, which does not exist", ErrUnsafeEntry, rel, target)
		}
		return refusal(rel, fmt.Errorf("a symbolic link to %s: %w", target, err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", w.name(rel), err)
	}
	if st.IsDir() {
		return fmt.Errorf("%w: %s: a symbolic link to the folder %s: put the folder itself in the build context",
			ErrUnsafeEntry, rel, target)
	}
	return w.file(f, rel)
}

func (w *walker) name(rel string) string { return filepath.Join(w.root, filepath.FromSlash(rel)) }

// refusal turns what the kernel said about an entry opened without following links out of the context into an
// error naming it.
func refusal(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: %s: a symbolic link that leaves the build context: %v", ErrUnsafeEntry, rel, err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %s: changed while it was read: %v", ErrUnsafeEntry, rel, err)
	}
	return fmt.Errorf("%s: %w", rel, err)
}

func kind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	}
	return fmt.Sprintf("special file (mode %o)", mode&unix.S_IFMT)
}

func ownerOf(st fs.FileInfo) uint32 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Uid
	}
	return uint32(os.Getuid())
}

// openAt opens name in dir without following a link (and without blocking on a fifo swapped in).
func openAt(dir *os.File, name string, flags int) (*os.File, error) {
	for {
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|flags, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
		return os.NewFile(uintptr(fd), name), nil
	}
}

func readlinkAt(dir *os.File, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// copyEntry writes one entry into dst (which exists for ".").
func copyEntry(dst string, e entry) error {
	target := filepath.Join(dst, filepath.FromSlash(e.rel))
	if e.dir {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("copying %s: %w", e.rel, err)
		}
		return nil
	}
	// Whatever is at target (a link an earlier copy left, say) is replaced, never written through.
	if st, err := os.Lstat(target); err == nil && !st.Mode().IsRegular() {
		if err := os.RemoveAll(target); err != nil {
			return fmt.Errorf("copying %s: %w", e.rel, err)
		}
	}
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, e.mode)
	if err != nil {
		return fmt.Errorf("copying %s: %w", e.rel, err)
	}
	_, err = io.Copy(out, e.f)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(target, e.mode) // an existing file keeps its mode on O_TRUNC
	}
	if err != nil {
		return fmt.Errorf("copying %s: %w", e.rel, err)
	}
	return nil
}
