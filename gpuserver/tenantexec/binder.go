package tenantexec

import (
	"context"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// binder tells the executor's remoting sessions on which GPU their calls run (remoting.Binder): the GPU of a
// request's binding, which the gpuserver told this executor when it held it (handoff.OpAcquire), so that no record waits
// on the gpuserver; calls outside a request ask the gpuserver for an implicit binding (they queue like a request).
type binder struct {
	p *process

	mu       sync.Mutex
	holds    map[string]*executor.Binding            // every binding held, by ID
	requests map[string]map[string]*executor.Binding // requests' bindings by function, then ID
}

var _ remoting.Binder = (*binder)(nil)

func newBinder(p *process) *binder {
	return &binder{p: p, holds: map[string]*executor.Binding{}, requests: map[string]map[string]*executor.Binding{}}
}

func (b *binder) hold(id string, request bool, h *executor.Binding) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holds[id] = h
	if request {
		if b.requests[h.Function()] == nil {
			b.requests[h.Function()] = map[string]*executor.Binding{}
		}
		b.requests[h.Function()][id] = h
	}
}

// take removes a binding (nil when unknown).
func (b *binder) take(id string) *executor.Binding {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.holds[id]
	if h == nil {
		return nil
	}
	delete(b.holds, id)
	if m := b.requests[h.Function()]; m != nil {
		delete(m, id)
		if len(m) == 0 {
			delete(b.requests, h.Function())
		}
	}
	return h
}

// expire stops reporting a request's binding as its function's GPU (its calls bind afresh, and are refused while it
// is expired) and returns it; it stays held until its release. Nil when unknown.
func (b *binder) expire(id string) *executor.Binding {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.holds[id]
	if h == nil {
		return nil
	}
	if m := b.requests[h.Function()]; m != nil {
		delete(m, id)
		if len(m) == 0 {
			delete(b.requests, h.Function())
		}
	}
	return h
}

// CurrentGPU is the GPU of one of function's requests in flight; a binding the function was reset under is never
// reported (calls of a new process must not run under the binding a dead one left behind).
func (b *binder) CurrentGPU(function string) (int, bool) {
	b.mu.Lock()
	var hs []*executor.Binding
	for _, h := range b.requests[function] {
		hs = append(hs, h)
	}
	b.mu.Unlock()
	for _, h := range hs { // Orphaned takes the node's lock: asked outside b.mu
		if !h.Orphaned() {
			return h.GPU(), true
		}
	}
	return 0, false
}

// BindImplicit asks the gpuserver to bind the function for calls outside a request. A function whose work the
// executor refuses (a binding of it expired and was not released, its memory was lost) is refused at once instead
// of queueing at the gpuserver.
func (b *binder) BindImplicit(ctx context.Context, function string) (int, func(), error) {
	if err := b.p.node.Usable(function); err != nil {
		return 0, nil, err
	}
	bound, err := handoff.OpBindImplicit.Call(ctx, b.p.peer, handoff.Name{Function: function})
	if err != nil {
		return 0, nil, err
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			rctx, cancel := context.WithTimeout(b.p.ctx, returnTimeout)
			defer cancel()
			if _, err := handoff.OpReleaseImplicit.Call(rctx, b.p.peer, handoff.Release{Binding: bound.Binding}); err != nil {
				b.p.log.Warn("release an implicit binding", "function", function, "err", err)
			}
		})
	}
	return bound.GPU, release, nil
}
