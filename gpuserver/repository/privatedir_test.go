package repository

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRepositoryDirIsPrivate: up keeps the model images in /dev/shm on a node with GPUs, under a name derived from
// its state dir, so another local user could make that directory first (mode 0777) and then read, replace or remove
// every model image written into it. Open (and the tenants' plane) now refuses a directory of another user and a
// link, and narrows a directory of its own that others may enter to 0700.
func TestRepositoryDirIsPrivate(t *testing.T) {
	base := t.TempDir()
	wide := filepath.Join(base, "wide")
	if err := os.Mkdir(wide, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(wide, 0o777); err != nil {
		t.Fatal(err)
	}
	r, err := Open(Config{Dir: wide})
	if err != nil {
		t.Fatalf("a directory of its own, mode 0777: %v", err)
	}
	r.Close()
	if fi, _ := os.Stat(wide); fi.Mode().Perm() != 0o700 {
		t.Fatalf("the directory's mode after Open: %v, want 0700", fi.Mode().Perm())
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(wide, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: link}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a link: %v, want ErrInvalid", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: a directory of another user cannot be made here")
	}
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: theirs}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a directory of another user: %v, want ErrInvalid", err)
	}
	if err := PrivateDir(theirs); err == nil {
		t.Fatal("PrivateDir accepted a directory of another user")
	}
}
