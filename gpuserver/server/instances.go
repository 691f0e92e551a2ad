package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
)

// Instances of a function (docs/design.md, decision 10; pool.InstanceKey).
//
// A function's process names its instance (its replica's host name) in its acquires and in its shim's hello. Each
// instance is, from here down, a function of its own named by its key: the controller places it (one request at a
// time: Config.MaxInFlight 1 is per instance), the data plane holds its own address space, image and residencies,
// so several instances of one function are bound on several GPUs at once. Its image's identical chunks are held
// once in host memory (the repository's content-addressed chunks, shared within the tenant). An instance is made
// known by its first acquire or hello, and forgotten when its last session ended with nothing bound, when its
// function is deregistered, or to make room for a newer one when its function has MaxInstancesPerFunction.

// MaxInstancesPerFunction bounds the instances one function may have known at once (a function's processes name
// their instances: a bound keeps a misbehaving one from filling the controller and the data plane).
const MaxInstancesPerFunction = 256

var _ remoting.InstanceRegistry = (*trackedPool)(nil)

// Instance implements remoting.InstanceRegistry: the hello of a process naming its instance.
func (t *trackedPool) Instance(ctx context.Context, function, instance string) (string, error) {
	key := pool.InstanceKey(function, instance)
	if err := t.ensureInstance(ctx, key); err != nil {
		return "", err
	}
	return key, nil
}

// InstanceEnded implements remoting.InstanceRegistry: the instance's last session ended (its process is gone), so
// its memory is forgotten unless a binding of it is still held (then it goes once newer instances need room).
func (t *trackedPool) InstanceEnded(key string) {
	t.mu.Lock()
	st := t.instances[key]
	if st == nil {
		t.mu.Unlock()
		return
	}
	st.ended = true
	busy := len(t.bound[key]) > 0 || st.acquiring > 0
	t.mu.Unlock()
	if !busy {
		t.dropInstance(context.Background(), key) // a session's end: no request ctx
	}
}

// instanceState is what the tracked pool knows of an instance.
type instanceState struct {
	ended     bool // its last session ended
	acquiring int  // acquires in progress
}

// ensureInstance makes key's instance known to the pool and the data plane, registered with its function's spec
// (a key without an instance is the function itself, registered by Register).
func (t *trackedPool) ensureInstance(ctx context.Context, key string) error {
	fn, inst := pool.SplitInstance(key)
	if inst == "" {
		return nil
	}
	if err := pool.CheckKey(key); err != nil {
		return err
	}
	t.instMu.Lock() // one registration at a time: an instance is registered once
	defer t.instMu.Unlock()
	t.mu.Lock()
	spec, ok := t.specs[fn]
	st := t.instances[key]
	if st != nil {
		st.ended = false
		t.mu.Unlock()
		return nil
	}
	var spare []string // ended instances of fn with nothing bound: room for this one
	n := 0
	for k, s := range t.instances {
		if f, _ := pool.SplitInstance(k); f == fn {
			n++
			if s.ended && len(t.bound[k]) == 0 && s.acquiring == 0 {
				spare = append(spare, k)
			}
		}
	}
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", pool.ErrUnknownFunction, fn)
	}
	if n >= MaxInstancesPerFunction {
		if len(spare) == 0 {
			return fmt.Errorf("%w: function %q has %d instances, the most one function may have "+
				"(MaxInstancesPerFunction)", pool.ErrLimit, fn, n)
		}
		t.dropInstance(ctx, spare[0])
	}
	if err := t.registerInstance(ctx, key, spec); err != nil {
		return err
	}
	t.mu.Lock()
	if t.instances[key] == nil {
		t.instances[key] = &instanceState{}
	}
	t.mu.Unlock()
	return nil
}

// registerInstance registers key with the pool and the data plane under its function's spec.
func (t *trackedPool) registerInstance(ctx context.Context, key string, spec pool.FunctionSpec) error {
	tenant := spec.Tenant() // the function's: its instances share its tenant (and its images' chunks)
	spec.Name = key
	if err := t.healthPool.Register(ctx, spec); err != nil {
		return fmt.Errorf("register instance %q: %w", key, err)
	}
	if t.node == nil {
		return nil
	}
	if err := t.node.Register(key); err != nil {
		return errors.Join(fmt.Errorf("register instance %q: %w", key, err),
			t.healthPool.Deregister(context.WithoutCancel(ctx), key))
	}
	if err := t.node.SetTenant(ctx, key, tenant); err != nil {
		return errors.Join(fmt.Errorf("register instance %q: %w", key, err),
			t.healthPool.Deregister(context.WithoutCancel(ctx), key))
	}
	return nil
}

// dropInstance forgets an instance in the pool and the data plane.
func (t *trackedPool) dropInstance(ctx context.Context, key string) {
	t.mu.Lock()
	delete(t.instances, key)
	t.mu.Unlock()
	if err := t.healthPool.Deregister(ctx, key); err != nil && !errors.Is(err, pool.ErrUnknownFunction) {
		t.log.Warn("forget an instance", "function", key, "err", err)
	}
	if t.node != nil {
		if err := t.node.Deregister(ctx, key); err != nil && !errors.Is(err, executor.ErrUnknownFunction) {
			t.log.Warn("forget an instance's memory", "function", key, "err", err)
		}
	}
}

// instancesOf lists the keys of fn's known instances.
func (t *trackedPool) instancesOf(fn string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k := range t.instances {
		if f, _ := pool.SplitInstance(k); f == fn {
			out = append(out, k)
		}
	}
	return out
}

// beginAcquire counts an acquire of key's instance in progress (an instance is not forgotten under it).
func (t *trackedPool) beginAcquire(key string) func() {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.instances[key]
	if st == nil {
		return func() {}
	}
	st.acquiring++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		st.acquiring--
	}
}
