package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

func (b *Backend) secretPath(name string) string {
	return filepath.Join(b.absState, "secrets", name)
}

// linkSecrets makes <StateDir>/run/<function>/secrets/ hold one link per secret the function names, pointing at the
// secret's file, so that an updated secret is seen at once and a deleted one disappears.
func (b *Backend) linkSecrets(function string, secrets []string) error {
	dir := b.secretsDir(function)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("local backend: secrets of %q: %w", function, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("local backend: secrets of %q: %w", function, err)
	}
	for _, s := range secrets {
		if err := names.Secret("secrets", s); err != nil {
			return err
		}
		if err := os.Symlink(b.secretPath(s), filepath.Join(dir, s)); err != nil {
			return fmt.Errorf("local backend: secrets of %q: %w", function, err)
		}
	}
	return nil
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
	return names.Namespace(s.Namespace, []string{provider.DefaultNamespace})
}

// ListSecrets returns the names of the secrets, sorted; values are never listed.
func (b *Backend) ListSecrets(ctx context.Context, namespace string) ([]types.Secret, error) {
	ns, err := names.Namespace(namespace, []string{provider.DefaultNamespace})
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(b.absState, "secrets"))
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
	if _, err := os.Lstat(b.secretPath(s.Name)); err == nil {
		return fmt.Errorf("%w: secret %q in namespace %s", provider.ErrExists, s.Name, ns)
	}
	return b.writeSecret(s)
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
	if _, err := os.Lstat(b.secretPath(s.Name)); err != nil {
		return fmt.Errorf("%w: secret %q in namespace %s", provider.ErrNotFound, s.Name, ns)
	}
	return b.writeSecret(s)
}

func (b *Backend) writeSecret(s types.Secret) error {
	if err := writeFileAtomic(b.secretPath(s.Name), secretValue(s), 0o600); err != nil {
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
	if err := os.Remove(b.secretPath(name)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: secret %q in namespace %s", provider.ErrNotFound, name, ns)
		}
		return fmt.Errorf("local backend: deleting secret %q: %w", name, err)
	}
	return nil
}
