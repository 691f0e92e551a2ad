package tenantexec

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// binder tells the executor's remoting sessions on which GPU their calls run (remoting.Binder): the GPU of a
// request's binding, which the gpuserver told this executor when it held it (handoff.OpAcquire), so that no record
// waits on the gpuserver; calls outside a request ask the gpuserver for an implicit binding (they queue like a
// request). The bindings held are kept in executor.BindingTable, as the gpuserver keeps its own.
//
// A hold the gpuserver gave up (handoff.Release.Abandoned: its caller's context ended while the Acquire was in
// flight) never binds: holds in flight are kept in holding, so that an abandon cancels one and its completion
// drops the binding instead of adding it; an abandon that arrives before its Acquire started (both are dispatched
// at once) is kept in abandoned until that Acquire comes and is refused.
type binder struct {
	p     *process
	table *executor.BindingTable[*executor.Binding]

	mu        sync.Mutex
	holding   map[string]*inFlight // bindings whose Acquire runs
	abandoned map[string]time.Time // bindings abandoned before their Acquire started, and when
}

// inFlight is an Acquire running: cancel ends its context, abandoned says that it must not bind.
type inFlight struct {
	cancel    context.CancelFunc
	abandoned bool
}

// abandonedTTL is how long an abandon that found no Acquire of its binding is kept for the Acquire to come: the
// gpuserver sent that Acquire before it (it waits for its answer), so it comes within a dispatch; one whose
// Acquire had already ended is forgotten after it.
const abandonedTTL = time.Minute

var _ remoting.Binder = (*binder)(nil)

func newBinder(p *process) *binder {
	return &binder{p: p, table: executor.NewBindingTable[*executor.Binding](), holding: map[string]*inFlight{},
		abandoned: map[string]time.Time{}}
}

// errAbandoned refuses the Acquire of a binding the gpuserver gave up.
var errAbandoned = errors.New("the gpuserver gave the hold up (its acquire's context ended)")

// begin starts the Acquire of binding id: the context it runs under, cancelled when the gpuserver abandons it. An
// Acquire already abandoned, or a second one of a binding in flight, is refused.
func (b *binder) begin(ctx context.Context, id string) (context.Context, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.abandoned[id]; ok {
		delete(b.abandoned, id)
		return nil, fmt.Errorf("acquire %s: %w", id, errAbandoned)
	}
	if _, ok := b.holding[id]; ok {
		return nil, fmt.Errorf("%w: acquire of binding %s, already in flight", handoff.ErrProtocol, id)
	}
	ctx, cancel := context.WithCancel(ctx)
	b.holding[id] = &inFlight{cancel: cancel}
	return ctx, nil
}

// finish ends the Acquire of binding id that begin started, which held h (nil when it failed): h is kept unless
// the gpuserver abandoned the hold meanwhile; then it is released here and finish answers errAbandoned.
func (b *binder) finish(id string, request bool, h *executor.Binding) error {
	b.mu.Lock()
	f := b.holding[id]
	delete(b.holding, id)
	if f != nil {
		f.cancel()
	}
	if f != nil && f.abandoned {
		b.mu.Unlock()
		if h != nil {
			h.Release()
		}
		return fmt.Errorf("acquire %s: %w", id, errAbandoned)
	}
	if h != nil {
		b.table.Add(id, h.Function(), h.GPU(), request, h)
	}
	b.mu.Unlock()
	return nil
}

// abandon drops binding id, whose hold the gpuserver gave up: a binding held is released, an Acquire in flight is
// cancelled (it releases what it held: finish), and one not started yet is refused when it comes (begin).
func (b *binder) abandon(id string) {
	b.mu.Lock()
	if e, ok := b.table.Take(id); ok {
		b.mu.Unlock()
		e.Held.Release()
		return
	}
	defer b.mu.Unlock()
	if f := b.holding[id]; f != nil {
		f.abandoned = true
		f.cancel()
		return
	}
	now := time.Now()
	for k, at := range b.abandoned {
		if now.Sub(at) > abandonedTTL {
			delete(b.abandoned, k)
		}
	}
	b.abandoned[id] = now
}

// take removes a binding (nil when unknown).
func (b *binder) take(id string) *executor.Binding {
	e, ok := b.table.Take(id)
	if !ok {
		return nil
	}
	return e.Held
}

// expire stops reporting a request's binding as its function's GPU (its calls bind afresh, and are refused while it
// is expired) and returns it; it stays held until its release. Nil when unknown.
func (b *binder) expire(id string) *executor.Binding {
	e, ok := b.table.Expire(id)
	if !ok {
		return nil
	}
	return e.Held
}

// CurrentGPU is the GPU of one of function's requests in flight (executor.BindingTable.CurrentGPU).
func (b *binder) CurrentGPU(function string) (int, bool) { return b.table.CurrentGPU(function) }

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
