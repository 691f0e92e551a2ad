package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// secretsRoot is the folder of a namespace's secrets: <StateDir>/secrets for the default namespace,
// <StateDir>/namespaces/<namespace>/secrets for the others.
func (b *Backend) secretsRoot(ns string) string {
	if ns == "" || ns == provider.DefaultNamespace {
		return filepath.Join(b.absState, "secrets")
	}
	return filepath.Join(b.absState, "namespaces", ns, "secrets")
}

func (b *Backend) secretPath(ns, name string) string {
	return filepath.Join(b.secretsRoot(ns), name)
}

// syncSecrets makes <StateDir>/run/<function key>/secrets/ hold a copy of each secret of namespace ns the function
// names and nothing else: mode 0400, owned by the function's own user when it has one (the platform runs as root and sandboxes
// functions). The folder itself is kept and each copy replaced by a rename, so that a running replica (whose
// sandbox shows this one folder, never the secrets of other functions) sees an updated secret at once and a deleted
// one disappear.
func (b *Backend) syncSecrets(function, ns string, secrets []string) error {
	dir := b.secretsDir(function)
	uid, gid := b.secretsOwner(function)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("local backend: secrets of %q: %w", function, err)
	}
	if uid >= 0 {
		if err := os.Chown(dir, uid, gid); err != nil {
			return fmt.Errorf("local backend: secrets of %q: %w", function, err)
		}
		if err := os.Chmod(dir, 0o500); err != nil {
			return fmt.Errorf("local backend: secrets of %q: %w", function, err)
		}
	}
	want := map[string]bool{}
	for _, s := range secrets {
		if err := names.Secret("secrets", s); err != nil {
			return err
		}
		want[s] = true
		value, err := os.ReadFile(b.secretPath(ns, s))
		if errors.Is(err, os.ErrNotExist) { // deleted since the deployment named it
			if err := os.Remove(filepath.Join(dir, s)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("local backend: secrets of %q: %w", function, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("local backend: secrets of %q: %w", function, err)
		}
		if err := writeOwnedFile(filepath.Join(dir, s), value, 0o400, uid, gid); err != nil {
			return fmt.Errorf("local backend: secrets of %q: %w", function, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("local backend: secrets of %q: %w", function, err)
	}
	for _, e := range entries {
		if !want[e.Name()] {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("local backend: secrets of %q: %w", function, err)
			}
		}
	}
	return nil
}

// writeOwnedFile writes path whole (a temporary file renamed over it) with mode perm, owned by uid:gid (-1: this
// process) before it appears.
func writeOwnedFile(path string, data []byte, perm os.FileMode, uid, gid int) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // nothing left to remove after the rename
	err = f.Chmod(perm)
	if err == nil && uid >= 0 {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// refreshSecret copies secret name of namespace ns again into the folder of every function of ns that names it (it
// was updated or deleted).
func (b *Backend) refreshSecret(ns, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, fn := range b.fns {
		if fn.ns == ns && slices.Contains(fn.rec.Deployment.Secrets, name) {
			errs = append(errs, b.syncSecrets(fn.key, fn.ns, fn.rec.Deployment.Secrets))
		}
	}
	return errors.Join(errs...)
}

func secretValue(s types.Secret) []byte {
	if len(s.RawValue) > 0 {
		return s.RawValue
	}
	return []byte(s.Value)
}

func (b *Backend) checkSecret(s types.Secret) (string, error) {
	if err := names.Secret("name", s.Name); err != nil {
		return "", err
	}
	return b.namespace(s.Namespace)
}

// ListSecrets returns the names of a namespace's secrets, sorted; values are never listed.
func (b *Backend) ListSecrets(ctx context.Context, namespace string) ([]types.Secret, error) {
	ns, err := b.namespace(namespace)
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(b.secretsRoot(ns))
	if errors.Is(err, os.ErrNotExist) {
		return []types.Secret{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local backend: listing secrets: %w", err)
	}
	out := []types.Secret{}
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, types.Secret{Name: e.Name(), Namespace: ns})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// CreateSecret stores a secret (mode 0600); it fails with provider.ErrExists when it exists already.
func (b *Backend) CreateSecret(ctx context.Context, s types.Secret) error {
	ns, err := b.checkSecret(s)
	if err != nil {
		return err
	}
	b.secretsMu.Lock()
	defer b.secretsMu.Unlock()
	if _, err := os.Lstat(b.secretPath(ns, s.Name)); err == nil {
		return fmt.Errorf("%w: secret %q in namespace %s", provider.ErrExists, s.Name, ns)
	}
	return b.writeSecret(ns, s)
}

// UpdateSecret replaces a secret's value; functions see the new value at once. It fails with provider.ErrNotFound
// for an unknown secret.
func (b *Backend) UpdateSecret(ctx context.Context, s types.Secret) error {
	ns, err := b.checkSecret(s)
	if err != nil {
		return err
	}
	b.secretsMu.Lock()
	defer b.secretsMu.Unlock()
	if _, err := os.Lstat(b.secretPath(ns, s.Name)); err != nil {
		return fmt.Errorf("%w: secret %q in namespace %s", provider.ErrNotFound, s.Name, ns)
	}
	if err := b.writeSecret(ns, s); err != nil {
		return err
	}
	return b.refreshSecret(ns, s.Name)
}

func (b *Backend) writeSecret(ns string, s types.Secret) error {
	if err := os.MkdirAll(b.secretsRoot(ns), 0o700); err != nil {
		return fmt.Errorf("local backend: secret %q: %w", s.Name, err)
	}
	if err := writeFileAtomic(b.secretPath(ns, s.Name), secretValue(s), 0o600); err != nil {
		return fmt.Errorf("local backend: secret %q: %w", s.Name, err)
	}
	return nil
}

// DeleteSecret removes a secret; it fails with provider.ErrNotFound for an unknown secret.
func (b *Backend) DeleteSecret(ctx context.Context, namespace, name string) error {
	ns, err := b.checkSecret(types.Secret{Name: name, Namespace: namespace})
	if err != nil {
		return err
	}
	b.secretsMu.Lock()
	defer b.secretsMu.Unlock()
	if err := os.Remove(b.secretPath(ns, name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: secret %q in namespace %s", provider.ErrNotFound, name, ns)
		}
		return fmt.Errorf("local backend: deleting secret %q: %w", name, err)
	}
	return b.refreshSecret(ns, name)
}
