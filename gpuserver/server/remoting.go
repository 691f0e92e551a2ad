package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// tokenKey derives each function's remoting token: hex(HMAC-SHA256(key, function name)). The key lives in a file
// (mode 0600) so that function processes started before a gpuserver restart still authenticate after it.
type tokenKey []byte

// loadTokenKey reads the key at path, creating a random one when the file does not exist.
func loadTokenKey(path string) (tokenKey, error) {
	key, err := os.ReadFile(path)
	if err == nil && len(key) >= 32 {
		return key, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("token key %s: %w", path, err)
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("token key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("token key %s: %w", path, err)
	}
	if err := os.WriteFile(path, key, 0o600); err != nil {
		return nil, fmt.Errorf("token key %s: %w", path, err)
	}
	return key, nil
}

func (k tokenKey) token(function string) string {
	mac := hmac.New(sha256.New, k)
	mac.Write([]byte(function))
	return hex.EncodeToString(mac.Sum(nil))
}

// trackedPool wraps a pool to know which GPU each function's requests are bound to, which the remoting server
// asks for every call (remoting.Binder), and to answer the remoting server's registry (remoting.Registry).
type trackedPool struct {
	pool.Pool
	key tokenKey

	mu       sync.Mutex
	specs    map[string]pool.FunctionSpec
	bound    map[string]map[string]int // function -> binding ID -> GPU
	bindings map[string]string         // binding ID -> function
}

func newTrackedPool(p pool.Pool, key tokenKey) *trackedPool {
	return &trackedPool{Pool: p, key: key, specs: map[string]pool.FunctionSpec{},
		bound: map[string]map[string]int{}, bindings: map[string]string{}}
}

func (t *trackedPool) Register(ctx context.Context, spec pool.FunctionSpec) error {
	if err := t.Pool.Register(ctx, spec); err != nil {
		return err
	}
	if err := spec.Validate(); err != nil { // fills the defaults the pool applied
		return err
	}
	t.mu.Lock()
	t.specs[spec.Name] = spec
	t.mu.Unlock()
	return nil
}

func (t *trackedPool) Deregister(ctx context.Context, name string) error {
	err := t.Pool.Deregister(ctx, name)
	t.mu.Lock()
	delete(t.specs, name)
	t.mu.Unlock()
	return err
}

func (t *trackedPool) Acquire(ctx context.Context, function string) (pool.Binding, error) {
	b, err := t.Pool.Acquire(ctx, function)
	if err != nil {
		return b, err
	}
	t.mu.Lock()
	if t.bound[function] == nil {
		t.bound[function] = map[string]int{}
	}
	t.bound[function][b.ID] = b.GPU
	t.bindings[b.ID] = function
	t.mu.Unlock()
	return b, nil
}

func (t *trackedPool) Release(ctx context.Context, id string) error {
	t.mu.Lock()
	if fn, ok := t.bindings[id]; ok {
		delete(t.bindings, id)
		delete(t.bound[fn], id)
		if len(t.bound[fn]) == 0 {
			delete(t.bound, fn)
		}
	}
	t.mu.Unlock()
	return t.Pool.Release(ctx, id)
}

// CurrentGPU implements remoting.Binder: the GPU of one of the function's requests in flight.
func (t *trackedPool) CurrentGPU(function string) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, gpu := range t.bound[function] {
		return gpu, true
	}
	return 0, false
}

// BindImplicit implements remoting.Binder: calls outside a request (initialisation) queue like a request.
func (t *trackedPool) BindImplicit(ctx context.Context, function string) (int, func(), error) {
	b, err := t.Acquire(ctx, function)
	if err != nil {
		return 0, nil, err
	}
	var once sync.Once
	release := func() {
		once.Do(func() { _ = t.Release(context.WithoutCancel(ctx), b.ID) })
	}
	return b.GPU, release, nil
}

// Token returns a function's remoting token ("" without remoting); the API returns it at registration.
func (t *trackedPool) Token(function string) string {
	if t.key == nil {
		return ""
	}
	return t.key.token(function)
}

// Function implements remoting.Registry.
func (t *trackedPool) Function(name string) (pool.FunctionSpec, string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	spec, ok := t.specs[name]
	if !ok {
		return pool.FunctionSpec{}, "", fmt.Errorf("%w: %s", pool.ErrUnknownFunction, name)
	}
	return spec, t.key.token(name), nil
}
