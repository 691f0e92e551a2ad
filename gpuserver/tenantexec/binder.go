package tenantexec

import (
	"context"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// binder tells the executor's remoting sessions on which GPU their calls run (remoting.Binder): the GPU of a
// request's binding, which the gpuserver told this executor when it held it (handoff.OpAcquire), so that no record
// waits on the gpuserver; calls outside a request ask the gpuserver for an implicit binding (they queue like a
// request). The bindings held are kept in executor.BindingTable, as the gpuserver keeps its own.
type binder struct {
	p     *process
	table *executor.BindingTable[*executor.Binding]
}

var _ remoting.Binder = (*binder)(nil)

func newBinder(p *process) *binder {
	return &binder{p: p, table: executor.NewBindingTable[*executor.Binding]()}
}

func (b *binder) hold(id string, request bool, h *executor.Binding) {
	b.table.Add(id, h.Function(), h.GPU(), request, h)
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
