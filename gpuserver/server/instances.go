package server

import (
	"context"
	"errors"
	"fmt"
	"sync"

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
// known by its first acquire or hello. When its last session ends (its process is gone) the data plane forgets its
// memory (the remoting server's Reset, as for a function) and the controller its copies; its registration with the
// data plane stays (a process of the same instance that starts again, under the same replica name, is restored
// from its image when it initialises the same way) until its function is deregistered, or until a newer instance
// needs the room when its function has MaxInstancesPerFunction.

// MaxInstancesPerFunction bounds the instances one function may have known at once (a function's processes name
// their instances: a bound keeps a misbehaving one from filling the controller and the data plane).
const MaxInstancesPerFunction = 256

var _ remoting.InstanceRegistry = (*trackedPool)(nil)

// Instance implements remoting.InstanceRegistry: the hello of a process naming its instance.
func (t *trackedPool) Instance(ctx context.Context, function, instance string) (string, error) {
	key := pool.InstanceKey(function, instance)
	done, err := t.useInstance(ctx, key)
	if err != nil {
		return "", err
	}
	done()
	return key, nil
}

// InstanceEnded implements remoting.InstanceRegistry: the instance's last session ended (its process is gone).
func (t *trackedPool) InstanceEnded(key string) {
	t.inst.mu.Lock()
	if st := t.inst.m[key]; st != nil {
		st.ended = true
	}
	t.inst.mu.Unlock()
	t.forgetCopies(context.Background(), key) // a session's end: no request ctx
}

// instanceTable is the instances known, by key.
type instanceTable struct {
	register sync.Mutex // one registration at a time: an instance is registered once

	mu sync.Mutex
	m  map[string]*instanceState
}

func newInstanceTable() *instanceTable { return &instanceTable{m: map[string]*instanceState{}} }

// ended reports whether key is an instance whose last session ended.
func (it *instanceTable) ended(key string) bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	st := it.m[key]
	return st != nil && st.ended
}

// instanceState is what the tracked pool knows of an instance.
type instanceState struct {
	ended     bool // its last session ended
	placed    bool // registered with the controller (false once its copies were forgotten: forgetCopies)
	acquiring int  // acquires in progress (useInstance)
}

// forgetCopies takes an ended instance with nothing bound or being acquired out of the controller: its copies
// were dropped with its memory (the data plane's Reset when its last session ended); its next acquire or hello
// registers it again. Otherwise it does nothing (the last release calls it again).
func (t *trackedPool) forgetCopies(ctx context.Context, key string) {
	t.inst.register.Lock()
	defer t.inst.register.Unlock()
	t.inst.mu.Lock()
	st := t.inst.m[key]
	idle := st != nil && st.ended && st.placed && st.acquiring == 0 && t.binds.Requests(key) == 0
	t.inst.mu.Unlock()
	if !idle {
		return
	}
	if err := t.healthPool.Deregister(ctx, key); err != nil && !errors.Is(err, pool.ErrUnknownFunction) {
		t.log.Warn("forget an ended instance's copies", "function", key, "err", err)
	}
	t.inst.mu.Lock()
	st.placed = false
	t.inst.mu.Unlock()
}

// useInstance makes key's instance known to the pool and the data plane, registered with its function's spec (a
// key without an instance is the function itself, registered by Register), and counts a use of it until done is
// called: an instance is not forgotten while it is acquired.
func (t *trackedPool) useInstance(ctx context.Context, key string) (done func(), err error) {
	fn, inst := pool.SplitInstance(key)
	if inst == "" {
		return func() {}, nil
	}
	if err := pool.CheckKey(key); err != nil {
		return nil, err
	}
	t.inst.register.Lock() // one registration at a time: an instance is registered once
	defer t.inst.register.Unlock()
	spec, ok, _ := t.reg.lookup(fn)
	t.inst.mu.Lock()
	st := t.inst.m[key]
	var spare []string // ended instances of fn with nothing bound: room for this one
	n := 0
	for k, s := range t.inst.m {
		if f, _ := pool.SplitInstance(k); f == fn {
			n++
			if s.ended && t.binds.Requests(k) == 0 && s.acquiring == 0 {
				spare = append(spare, k)
			}
		}
	}
	t.inst.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", pool.ErrUnknownFunction, fn)
	}
	if st == nil && n >= MaxInstancesPerFunction {
		if len(spare) == 0 {
			return nil, fmt.Errorf("%w: function %q has %d instances, the most one function may have "+
				"(MaxInstancesPerFunction)", pool.ErrLimit, fn, n)
		}
		t.dropInstance(ctx, spare[0])
	}
	if st == nil || !st.placed {
		if err := t.registerInstance(ctx, key, spec); err != nil {
			return nil, err
		}
	}
	t.inst.mu.Lock()
	if st = t.inst.m[key]; st == nil {
		st = &instanceState{}
		t.inst.m[key] = st
	}
	st.ended, st.placed = false, true
	st.acquiring++
	t.inst.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.inst.mu.Lock()
			st.acquiring--
			t.inst.mu.Unlock()
		})
	}, nil
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

// dropInstance forgets an instance in the pool and the data plane (with inst.register held, or its function gone).
func (t *trackedPool) dropInstance(ctx context.Context, key string) {
	t.inst.mu.Lock()
	delete(t.inst.m, key)
	t.inst.mu.Unlock()
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
	t.inst.mu.Lock()
	defer t.inst.mu.Unlock()
	var out []string
	for k := range t.inst.m {
		if f, _ := pool.SplitInstance(k); f == fn {
			out = append(out, k)
		}
	}
	return out
}

// placedInstancesOf lists the keys of fn's instances registered with the controller.
func (t *trackedPool) placedInstancesOf(fn string) []string {
	t.inst.mu.Lock()
	defer t.inst.mu.Unlock()
	var out []string
	for k, st := range t.inst.m {
		if f, _ := pool.SplitInstance(k); f == fn && st.placed {
			out = append(out, k)
		}
	}
	return out
}
