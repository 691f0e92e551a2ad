package shrinkwrap

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// treeSecret stands for the platform's key, a password or /etc/shadow: what a hostile context links to.
const treeSecret = "faas-gpu-tree-test-secret-9c2e"

// hostileContexts are build contexts that each hold one entry the platform must refuse, and the entry's path
// inside the context that the error must name. secret is a file outside every context.
func hostileContexts(t *testing.T, secret string) map[string]struct {
	make func(dir string) error
	name string
} {
	t.Helper()
	secretDir := filepath.Dir(secret)
	return map[string]struct {
		make func(dir string) error
		name string
	}{
		"absolute link": {func(d string) error { return os.Symlink(secret, filepath.Join(d, "key")) }, "key"},
		"link to /etc/shadow": {func(d string) error {
			return os.Symlink("/etc/shadow", filepath.Join(d, "sub", "shadow"))
		}, "sub/shadow"},
		"dot-dot link": {func(d string) error {
			rel, err := filepath.Rel(filepath.Join(d, "sub"), secret)
			if err != nil {
				return err
			}
			return os.Symlink(rel, filepath.Join(d, "sub", "password"))
		}, "sub/password"},
		// Each link lexically inside, the chain outside: sub/up is "..", so sub/up/../x is the context's parent.
		"chain of links": {func(d string) error {
			if err := os.Symlink("..", filepath.Join(d, "sub", "up")); err != nil {
				return err
			}
			rel, err := filepath.Rel(filepath.Dir(d), secret)
			if err != nil {
				return err
			}
			return os.Symlink(filepath.Join("up", "..", rel), filepath.Join(d, "sub", "chained"))
		}, "sub/chained"},
		"link to a folder outside": {func(d string) error {
			return os.Symlink(secretDir, filepath.Join(d, "state"))
		}, "state"},
		"fifo": {func(d string) error { return syscall.Mkfifo(filepath.Join(d, "sub", "pipe"), 0o644) }, "sub/pipe"},
		"socket": {func(d string) error {
			l, err := net.Listen("unix", filepath.Join(d, "sock"))
			if err != nil {
				return err
			}
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			return l.Close()
		}, "sock"},
	}
}

// benignContext is a context with a folder and two files, the handler's requirements readable.
func benignContext(t *testing.T, dir string) {
	t.Helper()
	for p, text := range map[string]string{"index.py": "print('hi')\n", "sub/handler.py": "X = 1\n"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A hostile build context (a link to the key by absolute path, by `..`, through a chain of links each inside it,
// to a folder outside, a fifo, a socket) is refused by CheckTree, CopyTree and Assemble with an error that wraps
// ErrUnsafeEntry and names the entry; no copy holds the secret; the error does not quote it.
func TestCopyTreeRefusesEntriesThatLeaveTheContext(t *testing.T) {
	base := t.TempDir()
	secret := filepath.Join(base, "state", "gpuserver.key")
	if err := os.MkdirAll(filepath.Dir(secret), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(treeSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	tpl := filepath.Join(base, "template")
	benignContext(t, tpl)
	for what, c := range hostileContexts(t, secret) {
		t.Run(what, func(t *testing.T) {
			dir := filepath.Join(base, "ctx-"+strings.ReplaceAll(what, " ", "-"))
			benignContext(t, dir)
			if err := c.make(dir); err != nil {
				t.Fatal(err)
			}
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, ErrUnsafeEntry) || !strings.Contains(err.Error(), c.name+":") {
					t.Errorf("%s = %v, want ErrUnsafeEntry naming %s", op, err, c.name)
				}
				if err != nil && strings.Contains(err.Error(), treeSecret) {
					t.Errorf("%s's error quotes the secret: %v", op, err)
				}
			}
			check("CheckTree", CheckTree(dir))
			dst := filepath.Join(base, "copy-"+strings.ReplaceAll(what, " ", "-"))
			check("CopyTree", CopyTree(dir, dst))
			asm := filepath.Join(base, "assembled-"+strings.ReplaceAll(what, " ", "-"))
			check("Assemble", Assemble(tpl, dir, asm))
			for _, d := range []string{dst, asm} {
				_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
					if err == nil && e.Type().IsRegular() {
						if data, _ := os.ReadFile(p); strings.Contains(string(data), treeSecret) {
							t.Errorf("the copy %s holds the secret", p)
						}
					}
					if err == nil && e.Type()&fs.ModeSymlink != 0 {
						t.Errorf("the copy holds a link: %s", p)
					}
					return nil
				})
			}
		})
	}
}

// A link that stays inside the context (to a file beside it, or up and down again) is copied as the file it names;
// the copy holds no link.
func TestCopyTreeCopiesLinksInsideTheContextAsFiles(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "ctx")
	benignContext(t, src)
	for link, target := range map[string]string{"alias.py": "index.py", "sub/back.py": "../index.py",
		"sub/round.py": "../sub/handler.py"} {
		if err := os.Symlink(target, filepath.Join(src, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := CheckTree(src); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "copy")
	if err := CopyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"alias.py": "print('hi')\n", "sub/back.py": "print('hi')\n",
		"sub/round.py": "X = 1\n", "sub/handler.py": "X = 1\n"} {
		st, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || !st.Mode().IsRegular() {
			t.Fatalf("%s in the copy: %v %v, want a regular file", p, st, err)
		}
		if data, _ := os.ReadFile(filepath.Join(dst, p)); string(data) != want {
			t.Errorf("%s = %q, want %q", p, data, want)
		}
	}
}

// Open reads a file of the context through links that stay inside, and refuses one that leaves, naming it.
func TestOpenFollowsOnlyLinksInsideTheContext(t *testing.T) {
	base := t.TempDir()
	secret := filepath.Join(base, "basic-auth-password")
	if err := os.WriteFile(secret, []byte(treeSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(base, "ctx")
	benignContext(t, src)
	if err := os.Symlink("sub/handler.py", filepath.Join(src, "inside.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(src, "requirements.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(base, filepath.Join(src, "function")); err != nil {
		t.Fatal(err)
	}
	f, err := Open(src, "inside.txt")
	if err != nil {
		t.Fatalf("Open(inside.txt): %v", err)
	}
	f.Close()
	for _, rel := range []string{"requirements.txt", "function/basic-auth-password"} {
		f, err := Open(src, rel)
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, ErrUnsafeEntry) || !strings.Contains(err.Error(), rel) {
			t.Errorf("Open(%s) = %v, want ErrUnsafeEntry naming it", rel, err)
		}
	}
	if _, err := Open(src, "missing.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open(missing.txt) = %v, want fs.ErrNotExist", err)
	}
}

// The check for kernels without openat2 refuses the same links (EXDEV) and follows the same links inside.
func TestPortableOpenBeneath(t *testing.T) {
	base := t.TempDir()
	secret := filepath.Join(base, "state", "gpuserver.key")
	if err := os.MkdirAll(filepath.Dir(secret), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte(treeSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(base, "ctx")
	benignContext(t, src)
	if err := os.Symlink("../index.py", filepath.Join(src, "sub", "back.py")); err != nil {
		t.Fatal(err)
	}
	top, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	f, err := openBeneathPortable(top, "sub/back.py", src)
	if err != nil {
		t.Fatalf("a link inside: %v", err)
	}
	f.Close()
	for what, c := range hostileContexts(t, secret) {
		if what == "fifo" || what == "socket" {
			continue
		}
		dir := filepath.Join(base, "p-"+strings.ReplaceAll(what, " ", "-"))
		benignContext(t, dir)
		if err := c.make(dir); err != nil {
			t.Fatal(err)
		}
		d, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		f, err := openBeneathPortable(d, c.name, dir)
		d.Close()
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: openBeneathPortable(%s) = %v, want EXDEV", what, c.name, err)
		}
	}
}
