package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// PoolConfig configures a wall-clock Pool.
type PoolConfig struct {
	// Controller configures the policy and node; the controller is driven on the wall clock.
	Controller Config
	// Actuator carries out swaps and evictions; nil means a LinkActuator on the controller's node.
	Actuator Actuator
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Pool is the gpuserver's pool.Pool driven by the controller: Acquire queues the request in the SLO-aware queue,
// and once the controller binds it, carries out the evictions and the swap through the Actuator before returning
// the binding. Release ends the binding; its duration is the execution time the predictors learn from.
type Pool struct {
	act Actuator
	now func() time.Time

	mu       sync.Mutex
	ctl      *Controller
	nextID   uint64
	waiters  map[uint64]chan Decision
	failed   map[uint64]error // why a closed waiter will never be bound (absent: its function was removed)
	bindings map[string]*poolBinding
}

type poolBinding struct {
	id    uint64
	start time.Time
}

var _ pool.Pool = (*Pool)(nil)

// NewPool returns a Pool.
func NewPool(cfg PoolConfig) (*Pool, error) {
	ctl, err := New(cfg.Controller)
	if err != nil {
		return nil, err
	}
	p := &Pool{act: cfg.Actuator, now: cfg.Now, ctl: ctl, waiters: map[uint64]chan Decision{},
		failed: map[uint64]error{}, bindings: map[string]*poolBinding{}}
	if p.act == nil {
		p.act = NewLinkActuator(cfg.Controller.Node)
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Register adds or replaces a function.
func (p *Pool) Register(_ context.Context, spec pool.FunctionSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctl.Register(p.now(), Function{FunctionSpec: spec})
}

// Deregister removes a function; its waiting acquires fail with pool.ErrUnknownFunction.
func (p *Pool) Deregister(_ context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids, err := p.ctl.Deregister(name)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if ch := p.waiters[id]; ch != nil {
			close(ch)
			delete(p.waiters, id)
		}
	}
	return nil
}

// Acquire waits until the function is bound to a GPU and its model is usable there.
func (p *Pool) Acquire(ctx context.Context, function string) (pool.Binding, error) {
	arrived := p.now()
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	submit := p.ctl.Submit
	if pool.IsInitialisation(ctx) {
		submit = p.ctl.SubmitInitialisation
	}
	if err := submit(arrived, id, function); err != nil {
		p.mu.Unlock()
		return pool.Binding{}, err
	}
	ch := make(chan Decision, 1)
	p.waiters[id] = ch
	p.dispatchLocked()
	p.mu.Unlock()

	var d Decision
	select {
	case dd, ok := <-ch:
		if !ok {
			p.mu.Lock()
			err, failed := p.failed[id]
			delete(p.failed, id)
			p.mu.Unlock()
			if failed {
				return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
			}
			return pool.Binding{}, fmt.Errorf("%w: %q was removed while waiting", pool.ErrUnknownFunction, function)
		}
		d = dd
	case <-ctx.Done():
		p.mu.Lock()
		if p.ctl.Cancel(id) {
			delete(p.waiters, id)
			p.mu.Unlock()
			return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, ctx.Err())
		}
		p.mu.Unlock()
		dd, ok := <-ch // bound concurrently (undone below), or dropped
		if !ok {
			p.mu.Lock()
			delete(p.failed, id)
			p.mu.Unlock()
			return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, ctx.Err())
		}
		d = dd
	}
	if err := ctx.Err(); err != nil {
		p.abort(id, d)
		return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
	}
	swapStart := p.now()
	if err := p.actuate(ctx, d); err != nil {
		p.abort(id, d)
		return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
	}
	bound := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if d.Swap != SwapNone {
		if err := p.ctl.SwapDone(bound, id, bound.Sub(swapStart)); err != nil {
			return pool.Binding{}, err
		}
		p.dispatchLocked() // a request may have waited for this transfer to end
	}
	if p.ctl.broken(id) { // its GPU failed (SetHealthy) before the binding reached the caller
		_, err := p.ctl.Complete(bound, id, 0)
		p.dispatchLocked()
		return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
	}
	bid := strconv.FormatUint(id, 10)
	p.bindings[bid] = &poolBinding{id: id, start: bound}
	return pool.Binding{ID: bid, Function: function, GPU: d.GPU, GPUName: p.ctl.node.GPUs[d.GPU].Name, Swap: d.Swap,
		Queued: bound.Sub(arrived)}, nil
}

func (p *Pool) actuate(ctx context.Context, d Decision) error {
	for _, e := range d.Evict {
		if err := p.act.Evict(ctx, e.Function, e.GPU); err != nil {
			return fmt.Errorf("evict %q from GPU %d: %w", e.Function, e.GPU, err)
		}
	}
	if d.Swap == SwapNone {
		return nil
	}
	return p.act.SwapIn(ctx, d.Function, d.GPU, Source{GPU: d.Source, Kind: d.Swap, Bytes: d.Bytes})
}

// abort ends a binding that never reached its caller: it served nothing (counted in no served figure).
func (p *Pool) abort(id uint64, d Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.ctl.markUnserved(id)
	_, _ = p.ctl.Complete(now, id, 0)
	p.dispatchLocked()
}

// Release ends a binding; one released with pool.WithUnserved counts in no served or on-time figure.
func (p *Pool) Release(ctx context.Context, bindingID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bindings[bindingID]
	if b == nil {
		return fmt.Errorf("%w: %q", pool.ErrUnknownBinding, bindingID)
	}
	delete(p.bindings, bindingID)
	now := p.now()
	if pool.IsUnserved(ctx) {
		p.ctl.markUnserved(b.id)
	}
	if _, err := p.ctl.Complete(now, b.id, now.Sub(b.start)); err != nil {
		if errors.Is(err, pool.ErrGPUUnhealthy) { // released, but its work was lost
			p.dispatchLocked()
			return fmt.Errorf("release %s: %w", bindingID, err)
		}
		return errors.Join(pool.ErrUnknownBinding, err)
	}
	p.dispatchLocked()
	return nil
}

// SetHealthy takes GPU gpu out of service or returns it (see Controller.SetHealthy). A binding held there when
// it fails is released as usual, but Release answers an error wrapping pool.ErrGPUUnhealthy; an acquire that can
// never be bound any more (native binding with no GPU left for its function) fails with pool.ErrGPUUnhealthy.
func (p *Pool) SetHealthy(gpu int, healthy bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	dropped, err := p.ctl.SetHealthy(p.now(), gpu, healthy)
	if err != nil {
		return err
	}
	for _, id := range dropped {
		if ch := p.waiters[id]; ch != nil {
			p.failed[id] = fmt.Errorf("%w: gpu %d failed and no other GPU has room for the function", pool.ErrGPUUnhealthy, gpu)
			close(ch)
			delete(p.waiters, id)
		}
	}
	p.dispatchLocked()
	return nil
}

// Evicted tells the controller of a copy the data plane dropped on its own (Controller.Evicted); memory it freed
// may bind a waiting request.
func (p *Pool) Evicted(function string, gpu int, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctl.Evicted(function, gpu, reason)
	p.dispatchLocked()
}

// EvictionCounts are the copies dropped from GPUs so far: the controller's decisions and the data plane's own.
func (p *Pool) EvictionCounts() pool.EvictionCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	ev := pool.EvictionCounts{Controller: p.ctl.counts.Evictions, DataPlane: map[string]int64{}}
	for k, v := range p.ctl.counts.DataPlaneEvictions {
		ev.DataPlane[k] = v
	}
	return ev
}

// Status returns a snapshot of GPUs, functions and queues.
func (p *Pool) Status(context.Context) pool.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ctl.Status()
}

func (p *Pool) dispatchLocked() {
	ds := p.ctl.Dispatch(p.now())
	for _, r := range p.ctl.TakeRefused() {
		if ch := p.waiters[r.ID]; ch != nil {
			p.failed[r.ID] = r.Err
			close(ch)
			delete(p.waiters, r.ID)
		}
	}
	for _, d := range ds {
		ch := p.waiters[d.Request]
		delete(p.waiters, d.Request)
		ch <- d // buffered: never blocks
	}
}
