package local

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

// ImageDir returns the build context name of an image reference: its last path element without tag or digest.
// "hello-gpu:latest" and "ghcr.io/x/hello-gpu:0.1" both give "hello-gpu"; "localhost:5000/y@sha256:..." gives "y".
func ImageDir(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndexByte(image, '/'); i >= 0 {
		image = image[i+1:]
	}
	if i := strings.IndexByte(image, ':'); i >= 0 {
		image = image[:i]
	}
	return image
}

// source finds where a function's code is, in this order:
//
//  1. <BuildDir>/<ImageDir(image)>/ (a shrinkwrapped build context named after the image),
//  2. <BuildDir>/<service>/ (named after the function),
//  3. <TemplatesDir>/<Template>/ with <FunctionsDir>/<service>/ as its function/ folder, assembled for the
//     replica instance names into <StateDir>/run/<service>/apps/<instance>/ (a folder per replica: replicas start,
//     restart and roll concurrently, and one replica's assembly must never clear the folder another runs from); with
//     instance "" (a deploy's checks) nothing is assembled and assembledApp's path is returned.
//
// A build context counts when it holds index.py (or anything, when the function sets envProcess). The error wraps
// provider.ErrInvalid and names the image and the folders it looked in.
func (b *Backend) source(fn recordView, instance string) (string, error) {
	var tried []string
	candidates := []string{}
	if d := ImageDir(fn.image); d != "" && d != "." && d != ".." {
		candidates = append(candidates, filepath.Join(b.cfg.BuildDir, d))
	}
	if byName := filepath.Join(b.cfg.BuildDir, fn.name); len(candidates) == 0 || candidates[0] != byName {
		candidates = append(candidates, byName) // the image and the function often share a name: look once
	}
	for _, dir := range candidates {
		if err := notALink(fn, dir); err != nil {
			return "", err
		}
		if isContext(dir, fn.envProcess != "") {
			return dir, nil
		}
		tried = append(tried, dir)
	}
	if b.cfg.TemplatesDir != "" && b.cfg.FunctionsDir != "" {
		tpl := filepath.Join(b.cfg.TemplatesDir, b.cfg.Template)
		handler := filepath.Join(b.cfg.FunctionsDir, fn.name)
		if err := notALink(fn, handler); err != nil {
			return "", err
		}
		if isDir(tpl) && isDir(handler) {
			if instance == "" {
				return b.assembledApp(fn), nil
			}
			app := filepath.Join(b.cfg.StateDir, "run", fn.key, "apps", instance)
			if err := shrinkwrap.Assemble(tpl, handler, app); err != nil {
				return "", fmt.Errorf("local backend: assembling %s: %w", app, err)
			}
			return app, nil
		}
		tried = append(tried, tpl+" + "+handler)
	}
	return "", fmt.Errorf("%w: image %q of function %q: no build context (looked in %s); "+
		"run `make functions` or `faas-cli build --shrinkwrap` (they write ./build/<function>/), or start with "+
		"--build-dir naming the folder that holds the build contexts", provider.ErrInvalid, fn.image, fn.name,
		strings.Join(tried, ", "))
}

// notALink refuses a build context (or handler folder) that is itself a symbolic link: whoever writes the build
// folder could otherwise point a function at any folder of the machine, another function's assembled context in
// the state dir say. The folders holding them (BuildDir, FunctionsDir) are the operator's and may be links.
func notALink(fn recordView, dir string) error {
	st, err := os.Lstat(dir)
	if err == nil && st.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%w: image %q of function %q: %s is a symbolic link; put the build context itself there "+
			"(a build context is read without following links out of it)", provider.ErrInvalid, fn.image, fn.name, dir)
	}
	return nil
}

// checkContext refuses, at deploy, a build context (or the template and handler folders it is assembled from)
// that holds a link out of it, a link to a folder or a special file (shrinkwrap.CheckTree), naming the entry.
func (b *Backend) checkContext(fn recordView, dir string) error {
	dirs := []string{dir}
	if dir == b.assembledApp(fn) { // the fallback: what it is assembled from (the folder may hold an older copy)
		dirs = []string{filepath.Join(b.cfg.TemplatesDir, b.cfg.Template), filepath.Join(b.cfg.FunctionsDir, fn.name)}
	}
	for _, d := range dirs {
		if err := shrinkwrap.CheckTree(d); err != nil {
			return fmt.Errorf("%w: function %q: build context %s: %w", provider.ErrInvalid, fn.name, d, err)
		}
	}
	return nil
}

// assembledApp stands for fn's template and handler folders before any replica assembled them (a deploy's checks
// read them in their own folders when source answers it); each replica assembles them into a folder of its own.
func (b *Backend) assembledApp(fn recordView) string {
	return filepath.Join(b.cfg.StateDir, "run", fn.key, "app")
}

// recordView is what source needs of a deployment (key: its function's key, namespaces.go).
type recordView struct{ name, key, image, envProcess string }

func isContext(dir string, anyEntrypoint bool) bool {
	if !isDir(dir) {
		return false
	}
	if anyEntrypoint {
		return true
	}
	st, err := os.Stat(filepath.Join(dir, "index.py"))
	return err == nil && st.Mode().IsRegular()
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}
