package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// Namespaces of the local backend (provider.NamespaceStore): faas-cli namespace create/get/update/delete and
// --namespace work as on faas-netes, so that two teams on one machine are two tenants of its GPUs (each namespace's
// GPU work runs in an executor process of its own: docs/tenants.md). provider.DefaultNamespace always exists; the
// others are kept in <StateDir>/namespaces.json. A function is known by its name and namespace: its key is its name
// in the default namespace (the state of earlier versions reads unchanged) and name.namespace in any other; its
// record, log and run folder are named by its key, and a namespace's secrets live in
// <StateDir>/namespaces/<namespace>/secrets.

var _ provider.NamespaceStore = (*Backend)(nil)

// fnKey names a function of a namespace in the backend's maps and files.
func fnKey(ns, name string) string {
	if ns == "" || ns == provider.DefaultNamespace {
		return name
	}
	return name + "." + ns
}

// recKey is a record's function key.
func recKey(rec record) string { return fnKey(rec.Deployment.Namespace, rec.Deployment.Service) }

// namespaceFile is the format of <StateDir>/namespaces.json.
type namespaceFile struct {
	Version    int                                `json:"version"`
	Namespaces map[string]types.FunctionNamespace `json:"namespaces"`
}

func (b *Backend) namespacesPath() string { return filepath.Join(b.cfg.StateDir, "namespaces.json") }

// loadNamespaces reads the namespaces file (none: only the default namespace).
func loadNamespaces(path string) (map[string]types.FunctionNamespace, error) {
	out := map[string]types.FunctionNamespace{}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local backend: namespaces: %w", err)
	}
	var f namespaceFile
	if err := json.Unmarshal(raw, &f); err != nil || f.Version != 1 {
		return nil, fmt.Errorf("local backend: %s is not a namespaces file (%v): move it aside to start with the "+
			"default namespace only", path, err)
	}
	for name, ns := range f.Namespaces {
		if names.NamespaceName("namespace", name) != nil || name == provider.DefaultNamespace {
			continue
		}
		ns.Name = name
		out[name] = ns
	}
	return out, nil
}

// saveNamespacesLocked writes the namespaces file; b.mu is held.
func (b *Backend) saveNamespacesLocked() error {
	raw, err := json.MarshalIndent(namespaceFile{Version: 1, Namespaces: b.namespaces}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(b.namespacesPath(), raw, 0o600)
}

// namespaceListLocked is every namespace, the default one first; b.mu is held.
func (b *Backend) namespaceListLocked() []string {
	out := make([]string, 0, len(b.namespaces)+1)
	for name := range b.namespaces {
		out = append(out, name)
	}
	sort.Strings(out)
	return append([]string{provider.DefaultNamespace}, out...)
}

// namespace checks a request's namespace: ns (the default one when empty), if it exists.
func (b *Backend) namespace(ns string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return names.Namespace(ns, b.namespaceListLocked())
}

// Namespaces returns every namespace functions may be deployed to, provider.DefaultNamespace first.
func (b *Backend) Namespaces(context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.namespaceListLocked(), nil
}

func defaultNamespace() types.FunctionNamespace {
	return types.FunctionNamespace{Name: provider.DefaultNamespace,
		Labels: map[string]string{provider.LabelOpenFaaS: "1"}, Annotations: map[string]string{provider.LabelOpenFaaS: "1"}}
}

// GetNamespace returns a namespace with its labels and annotations.
func (b *Backend) GetNamespace(_ context.Context, name string) (types.FunctionNamespace, error) {
	if name == provider.DefaultNamespace {
		return defaultNamespace(), nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ns, ok := b.namespaces[name]
	if !ok {
		return types.FunctionNamespace{}, fmt.Errorf("%w: namespace %q", provider.ErrNotFound, name)
	}
	return ns, nil
}

// labelled returns ns labelled and annotated for OpenFaaS (openfaas=1), as faas-netes keeps its namespaces.
func labelled(ns types.FunctionNamespace) types.FunctionNamespace {
	out := types.FunctionNamespace{Name: ns.Name, Labels: map[string]string{}, Annotations: map[string]string{}}
	for k, v := range ns.Labels {
		out.Labels[k] = v
	}
	for k, v := range ns.Annotations {
		out.Annotations[k] = v
	}
	out.Labels[provider.LabelOpenFaaS] = "1"
	out.Annotations[provider.LabelOpenFaaS] = "1"
	return out
}

// CreateNamespace adds a namespace (labelled and annotated openfaas=1).
func (b *Backend) CreateNamespace(_ context.Context, ns types.FunctionNamespace) error {
	if err := names.NamespaceName("name", ns.Name); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if _, ok := b.namespaces[ns.Name]; ok || ns.Name == provider.DefaultNamespace {
		return fmt.Errorf("%w: namespace %q", provider.ErrExists, ns.Name)
	}
	if len(b.namespaces) >= MaxNamespaces {
		return fmt.Errorf("%w: %d namespaces exist, the most the local backend keeps", provider.ErrInvalid,
			len(b.namespaces)+1)
	}
	b.namespaces[ns.Name] = labelled(ns)
	if err := b.saveNamespacesLocked(); err != nil {
		delete(b.namespaces, ns.Name)
		return err
	}
	b.log.Info("namespace created", "namespace", ns.Name)
	return nil
}

// MaxNamespaces bounds the namespaces the local backend keeps besides the default one.
const MaxNamespaces = 256

// UpdateNamespace replaces a namespace's labels and annotations (it stays labelled openfaas=1).
func (b *Backend) UpdateNamespace(_ context.Context, ns types.FunctionNamespace) error {
	if ns.Name == provider.DefaultNamespace {
		return fmt.Errorf("%w: namespace %q is the default one, which keeps its labels", provider.ErrInvalid, ns.Name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.namespaces[ns.Name]
	if !ok {
		return fmt.Errorf("%w: namespace %q", provider.ErrNotFound, ns.Name)
	}
	b.namespaces[ns.Name] = labelled(ns)
	if err := b.saveNamespacesLocked(); err != nil {
		b.namespaces[ns.Name] = old
		return err
	}
	return nil
}

// DeleteNamespace removes an empty namespace (no function) and its secrets; the default namespace stays.
func (b *Backend) DeleteNamespace(_ context.Context, name string) error {
	if name == provider.DefaultNamespace {
		return fmt.Errorf("%w: namespace %q is the default one and cannot be deleted", provider.ErrInvalid, name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.namespaces[name]
	if !ok {
		return fmt.Errorf("%w: namespace %q", provider.ErrNotFound, name)
	}
	n := 0
	for _, fn := range b.fns {
		if fn.ns == name {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("%w: namespace %q has %d functions: delete them first", provider.ErrInvalid, name, n)
	}
	delete(b.namespaces, name)
	if err := b.saveNamespacesLocked(); err != nil {
		b.namespaces[name] = old
		return err
	}
	if err := os.RemoveAll(filepath.Join(b.absState, "namespaces", name)); err != nil {
		return fmt.Errorf("local backend: removing the secrets of namespace %q: %w", name, err)
	}
	b.log.Info("namespace deleted", "namespace", name)
	return nil
}
