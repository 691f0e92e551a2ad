// Package shrinkwrap lays out build contexts the way `faas-cli build --shrinkwrap` does: for each function of a
// stack file, <out>/<name>/ holds the template's files with the function's handler copied over function/. faas-gpu's
// local backend runs functions from these folders; a cluster builds images from them.
package shrinkwrap

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"sigs.k8s.io/yaml"

	"github.com/faas-gpu/faas-gpu/provider/names"
)

// Stack is the part of an OpenFaaS stack file (stack.yml) that a build needs.
type Stack struct {
	Version   string              `json:"version"`
	Provider  StackProvider       `json:"provider"`
	Functions map[string]Function `json:"functions"`
}

// StackProvider is the provider section of a stack file.
type StackProvider struct {
	Name    string `json:"name"`
	Gateway string `json:"gateway"`
}

// Function is one function of a stack file.
type Function struct {
	Lang        string            `json:"lang"`
	Handler     string            `json:"handler"`
	Image       string            `json:"image"`
	Environment map[string]string `json:"environment,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Secrets     []string          `json:"secrets,omitempty"`
}

// ReadStack reads and checks a stack file: every function needs a valid name, a lang and a handler.
func ReadStack(path string) (Stack, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Stack{}, fmt.Errorf("reading stack file: %w", err)
	}
	var s Stack
	if err := yaml.Unmarshal(data, &s); err != nil {
		return Stack{}, fmt.Errorf("stack file %s: %w", path, err)
	}
	for _, name := range s.Names() {
		fn := s.Functions[name]
		if err := names.Function("function name", name); err != nil {
			return Stack{}, fmt.Errorf("stack file %s: %w", path, err)
		}
		if fn.Lang == "" {
			return Stack{}, fmt.Errorf("stack file %s: function %s: lang is required", path, name)
		}
		if fn.Handler == "" {
			return Stack{}, fmt.Errorf("stack file %s: function %s: handler is required", path, name)
		}
	}
	return s, nil
}

// Names returns the stack's function names, sorted.
func (s Stack) Names() []string {
	out := make([]string, 0, len(s.Functions))
	for n := range s.Functions {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Build lays out <outDir>/<name>/ for every function of the stack read from stackFile. Handler paths are relative
// to the stack file's folder; templates are <templatesDir>/<lang>/.
func Build(stackFile, templatesDir, outDir string) ([]string, error) {
	s, err := ReadStack(stackFile)
	if err != nil {
		return nil, err
	}
	base := filepath.Dir(stackFile)
	var built []string
	for _, name := range s.Names() {
		fn := s.Functions[name]
		handler := fn.Handler
		if !filepath.IsAbs(handler) {
			handler = filepath.Join(base, handler)
		}
		dst := filepath.Join(outDir, name)
		if err := Assemble(filepath.Join(templatesDir, fn.Lang), handler, dst); err != nil {
			return built, fmt.Errorf("function %s: %w", name, err)
		}
		built = append(built, dst)
	}
	return built, nil
}

// Assemble replaces dst with a copy of templateDir whose function/ folder has handlerDir's files copied over it,
// as faas-cli does.
func Assemble(templateDir, handlerDir, dst string) error {
	for _, d := range []struct{ what, path string }{{"template", templateDir}, {"handler", handlerDir}} {
		st, err := os.Stat(d.path)
		if err != nil {
			return fmt.Errorf("%s folder: %w", d.what, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("%s folder %s is not a folder", d.what, d.path)
		}
	}
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("clearing %s: %w", dst, err)
	}
	if err := CopyTree(templateDir, dst); err != nil {
		return fmt.Errorf("template %s: %w", templateDir, err)
	}
	if err := CopyTree(handlerDir, filepath.Join(dst, "function")); err != nil {
		return fmt.Errorf("handler %s: %w", handlerDir, err)
	}
	return nil
}

// CopyTree copies the folders and regular files under src into dst (created when missing), keeping file modes and
// overwriting files that exist. src is an untrusted build context (tree.go): a symbolic link is copied as the file
// it names only when that file is inside src; a link that leaves src, a link to a folder, a device, fifo or socket is
// refused with an error that wraps ErrUnsafeEntry and names the entry. Python bytecode caches are skipped.
func CopyTree(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return walkTree(src, func(e entry) error { return copyEntry(dst, e) })
}
