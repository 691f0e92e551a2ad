package local

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

// A sandboxed function runs as a user of its own (isolation.go), which must be able to read its build context.
// faas-cli creates a new function's folder with mode 0700 and `faas-cli build --shrinkwrap` keeps that mode, so
// `faas-cli new` + `build --shrinkwrap` + `deploy` (the README's "a function of your own") gave a build context the
// function's user cannot enter: every start failed in chdir, reported as "fork/exec python3: permission denied".
// Such a context is run from a copy that its user can read, per replica (replicas start concurrently), in the
// function's run folder; contexts that others can read are run in place.

// readableContext returns the folder a sandboxed replica runs from: dir itself when others can read it, else a
// fresh copy of it under the function's run folder with every folder and file readable. Either way the context is
// untrusted input (shrinkwrap's tree.go): one that holds a link out of it, a link to a folder or a special file is
// refused (the error wraps shrinkwrap.ErrUnsafeEntry and names the entry), so that neither the copy, made as up's
// user, nor the function reads what such a link names.
func (b *Backend) readableContext(name, instance, dir string) (string, error) {
	if err := shrinkwrap.CheckTree(dir); err != nil {
		return "", fmt.Errorf("local backend: build context %s: %w", dir, err)
	}
	if !b.isolated() || othersCanRead(dir) {
		return dir, nil
	}
	copyDir := filepath.Join(b.absState, "run", name, "context", instance)
	if err := readableCopy(dir, copyDir); err != nil {
		return "", err
	}
	return copyDir, nil
}

// readableCopy copies dir to copyDir (replacing it) with every folder and file readable by others.
func readableCopy(dir, copyDir string) error {
	if err := os.RemoveAll(copyDir); err != nil {
		return fmt.Errorf("local backend: %w", err)
	}
	if err := shrinkwrap.CopyTree(dir, copyDir); err != nil {
		return fmt.Errorf("local backend: a readable copy of %s: %w", dir, err)
	}
	err := filepath.WalkDir(copyDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Lstat(path)
		if err != nil || st.Mode()&fs.ModeSymlink != 0 {
			return err
		}
		mode := st.Mode().Perm() | 0o444
		if st.IsDir() || st.Mode().Perm()&0o100 != 0 {
			mode |= 0o111
		}
		return os.Chmod(path, mode)
	})
	if err != nil {
		return fmt.Errorf("local backend: a readable copy of %s: %w", dir, err)
	}
	return nil
}

// othersCanRead reports whether every folder of dir can be entered and listed, and every file read, by others.
func othersCanRead(dir string) bool {
	ok := true
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			ok = false
			return filepath.SkipAll
		}
		st, err := os.Stat(path) // a link: CheckTree let it through, so it names a file inside dir
		switch {
		case err != nil:
			return nil // gone meanwhile: the function finds out itself
		case st.IsDir() && st.Mode().Perm()&0o005 != 0o005, st.Mode().IsRegular() && st.Mode().Perm()&0o004 == 0:
			ok = false
			return filepath.SkipAll
		}
		return nil
	})
	return ok
}
