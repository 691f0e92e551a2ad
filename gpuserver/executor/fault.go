package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Tenants and contexts: one tenant's memory reachable on a GPU at a time, a fault contained to its tenant.
//
// Every function belongs to a tenant (pool.FunctionSpec.Tenant: its namespace, or itself when isolated). On each
// GPU a tenant's work runs in a device context of its own (device.Context: a CUDA context), created when the
// tenant first runs there: its functions' compute streams, modules and events live in it.
//
// Memory. Device memory mapped at the functions' fixed addresses is the process's: a kernel of any context on a
// GPU reaches every mapping accessible on that GPU, so contexts alone do not keep tenants apart. The node keeps
// one tenant's memory accessible on a GPU at a time: before a function becomes active on a GPU, the functions of
// other tenants active there are deactivated (their mappings removed; their copies stay parked, so coming back
// costs a re-map, not a copy), and a GPU with a binding of another tenant refuses (ErrBusy). Staging mappings of
// GPU-to-GPU swaps are accessible from the target GPU only, and chunks that are mapped without being filled by a
// copy (scratch, a model during initialisation) are zeroed first, so no tenant reads what another left in them.
//
// Faults. A fault of a tenant's work (an illegal address, a kernel fault) poisons its context on that GPU only.
// The node tears that context down, drops the copies of the tenant's functions that were active on the GPU (their
// memory was exposed to the faulting kernel; parked copies were not mapped and stay), and restores them from their
// host images (or a healthy peer copy) at their next swap-in. The error returned wraps ErrContextFault; bindings
// held across the fault break (Binding.Err). Other tenants, the node's own swap streams and the GPU stay in
// service: only device-level failures mark a GPU unhealthy (a context fault that surfaces on the node's own
// streams, as when a fault poisons every context of the process, is the tenant's too: processFaultLocked). A
// function whose initialisation had not ended has no image to come back from: it stays broken (ErrBroken,
// ErrLost) until it is reset (its process starts again).

// ErrContextFault: a fault of a tenant's work poisoned its context on a GPU; the context was torn down and the
// tenant's functions there will be restored from their images.
var ErrContextFault = errors.New("kernel fault: the tenant's context was reset")

// DefaultTenant is the tenant of a function registered without one: its namespace.
func DefaultTenant(function string) string {
	return pool.FunctionSpec{Name: function, Isolation: pool.IsolationShared}.Tenant()
}

type domainKey struct {
	tenant string
	gpu    int
}

// SetTenant puts a registered function into tenant. A function that changes tenant loses its copies (they may
// be mapped on GPUs serving its old tenant); it fails with ErrBusy while it has bindings.
func (n *Node) SetTenant(ctx context.Context, name, tenant string) error {
	if tenant == "" {
		return fmt.Errorf("%w: empty tenant", ErrInvalid)
	}
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	if f.tenant == tenant {
		return nil
	}
	defer n.moving(f)()
	if f.users > 0 {
		return fmt.Errorf("%w: %s has %d bindings", ErrBusy, name, f.users)
	}
	for gpu := range f.res {
		if err := n.evictLocked(ctx, f, gpu); err != nil {
			return err
		}
	}
	for gpu, s := range f.streams {
		_ = s.Destroy()
		delete(f.streams, gpu)
	}
	f.tenant = tenant
	return nil
}

// Tenant returns a function's tenant.
func (n *Node) Tenant(name string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return "", err
	}
	return f.tenant, nil
}

// Context returns the device context the function's work runs in on gpu (created on first use). Modules and
// events of the function belong there. After a fault tore it down, a new one is returned: what was created in
// the old one is gone.
func (n *Node) Context(name string, gpu int) (device.Context, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return nil, err
	}
	if err := n.validGPU(gpu); err != nil {
		return nil, err
	}
	return n.contextLocked(f.tenant, gpu)
}

func (n *Node) contextLocked(tenant string, gpu int) (device.Context, error) {
	k := domainKey{tenant, gpu}
	if c, ok := n.domains[k]; ok {
		return c, nil
	}
	c, err := n.dev.NewContext(gpu)
	if err != nil {
		return nil, fmt.Errorf("context of %s on gpu %d: %w", tenant, gpu, err)
	}
	n.domains[k] = c
	return c, nil
}

// claimLocked makes gpu serve f's tenant: functions of other tenants active there are deactivated (their
// mappings removed, their copies parked). It fails with ErrBusy when one of them holds a binding there.
func (n *Node) claimLocked(ctx context.Context, f *function, gpu int) error {
	for _, o := range n.functionsLocked() { // deactivating one releases mu
		if o.active != gpu || o.tenant == f.tenant {
			continue
		}
		if o.users > 0 {
			return fmt.Errorf("%w: gpu %d serves %s, whose function %s holds %d bindings there; %s (%s) cannot "+
				"share it", ErrBusy, gpu, o.tenant, o.name, o.users, f.name, f.tenant)
		}
		if o.fenced > 0 {
			return fmt.Errorf("%w: gpu %d serves %s, whose function %s's expired binding is being cleared "+
				"(Expire); %s (%s) cannot share it yet", ErrBusy, gpu, o.tenant, o.name, f.name, f.tenant)
		}
		// A fault of o's own work surfacing here tore o's context down and unmapped o: the GPU is free all the same.
		if err := n.deactivateLocked(ctx, o); err != nil && !errors.Is(err, ErrContextFault) {
			return err
		}
	}
	return nil
}

// faultLocked handles a fault of f's work on gpu: if err is a context fault, the tenant's context there is torn
// down and the tenant's functions active there lose their copy on it (see the comment at the top); the returned
// error wraps ErrContextFault. Any other error is a device failure of gpu (failLocked).
func (n *Node) faultLocked(f *function, gpu int, err error) error {
	if !device.IsContextFault(err) {
		return n.failLocked(gpu, err)
	}
	defer n.movingTenantLocked(f.tenant)()
	if c := n.detachLocked(f.tenant, gpu, err); c != nil { // poisoned: nothing of it runs any more
		if derr := n.unlocked(c.Destroy); derr != nil {
			n.log.Warn("destroying a poisoned context", "gpu", gpu, "tenant", f.tenant, "err", derr)
		}
	}
	n.dropTenantLocked(f, gpu, err)
	return fmt.Errorf("%w: gpu %d, %s (%s): %w", ErrContextFault, gpu, f.name, f.tenant, err)
}

// processFaultLocked handles a context fault that the node's own work on gpu found (a swap's copies, a zeroing,
// an event of them): the node's streams run no tenant's code, so the fault is a tenant's kernel that poisoned
// every context of the process (on a real GPU one illegal address does; the sim models it with ProcessWide), not
// a failure of the GPU. The GPU stays in service: OnContextFault is told (a tenant executor process ends, and the
// gpuserver checks the device before it trusts the GPU again: docs/operations.md), and the work that found it
// fails with ErrContextFault.
func (n *Node) processFaultLocked(gpu int, err error) {
	if n.cfg.OnContextFault != nil {
		n.cfg.OnContextFault(gpu, "", err)
	}
	n.log.Warn("a context fault surfaced on the node's own work: a tenant's kernel poisoned the process's "+
		"contexts; the gpu stays in service", "gpu", gpu, "err", err)
}

// fault handles a fault of the tenant's context c on gpu that work submitted through f's Stream found (gate),
// once the operation holds the node. It reports false, doing nothing, when the state changed since gate looked
// (the context was torn down or replaced meanwhile, f left the GPU, the GPU or f went out of service): gate then
// looks again.
func (n *Node) fault(f *function, gpu int, c device.Context) (err error, done bool) {
	defer n.operate()()
	if cur, ok := n.domains[domainKey{f.tenant, gpu}]; !ok || cur != c || f.active != gpu || !n.execs[gpu].healthy ||
		f.usableLocked() != nil {
		return nil, false
	}
	return n.faultLocked(f, gpu, c.Err()), true
}

// movingTenantLocked marks every function of tenant as moving until the returned function is
// called: while their context is torn down, their streams (destroyed with it) take no work.
func (n *Node) movingTenantLocked(tenant string) (settled func()) {
	var done []func()
	for _, o := range n.fns {
		if o.tenant == tenant {
			done = append(done, n.moving(o))
		}
	}
	return func() {
		for _, d := range done {
			d()
		}
	}
}

// detachLocked takes tenant's context on gpu out of service (the next use creates a new one) and returns it for
// the caller to destroy, nil when there was none. What the tenant's functions active on gpu had queued there is
// lost with it (cause says why): the loss is recorded here, in the same hold of mu that removes their streams, so
// that no reader ever sees a stream gone without its loss (Stream.Synchronize, Binding.Err), not even while the
// caller destroys the context with mu released. A function not active on gpu has nothing queued there: its work
// was waited for when it left (deactivateLocked), and gate refuses work on a GPU it is not active on.
func (n *Node) detachLocked(tenant string, gpu int, cause error) device.Context {
	k := domainKey{tenant, gpu}
	c, ok := n.domains[k]
	if !ok {
		return nil
	}
	delete(n.domains, k)
	for _, o := range n.fns {
		if o.tenant != tenant {
			continue
		}
		if _, ok := o.streams[gpu]; ok && o.active == gpu {
			o.epoch++
			o.fault = cause
		}
		delete(o.streams, gpu) // destroyed with the context
	}
	return c
}

// dropTenantLocked drops the copies of f's tenant's functions active on gpu after their context there was torn
// down (err says why), once no work of it runs any more: they come back from their images (see the comment at the
// top).
func (n *Node) dropTenantLocked(f *function, gpu int, err error) {
	var restored []string
	// The active copies were exposed to the faulting work, and so were the parked ones holding a chunk shared with
	// them (share.go): find them all before any chunk is given back.
	var exposed []*function
	for _, o := range n.fns {
		if o.tenant != f.tenant {
			continue
		}
		if r := o.res[gpu]; r != nil && (o.active == gpu || n.sharedWithLocked(r)) {
			exposed = append(exposed, o)
		}
	}
	for _, o := range exposed {
		if n.dropExposedLocked(o, gpu, err) {
			restored = append(restored, o.name)
		}
	}
	if !errors.Is(err, ErrHoldExpired) { // a context torn down to stop an expired binding's work did not fault
		n.execs[gpu].contextFaults++
		if n.cfg.OnContextFault != nil {
			n.cfg.OnContextFault(gpu, f.name, err)
		}
	}
	n.log.Warn("the tenant's context on the gpu was torn down, its functions there are restored from their "+
		"images; the gpu stays in service", "gpu", gpu, "tenant", f.tenant, "function", f.name,
		"functions", restored, "err", err)
}

// dropExposedLocked drops o's copy on gpu, which a fault exposed (dropTenantLocked), and reports whether o was
// active there (it comes back from its image at its next swap-in).
func (n *Node) dropExposedLocked(o *function, gpu int, err error) (wasActive bool) {
	defer n.moving(o)()
	r := o.res[gpu]
	_ = n.unmapLocked(o, r)
	_ = n.waitReadyLocked(context.Background(), o, r) // the node's own copies into the chunks (not the tenant's)
	for _, chunks := range r.chunks {
		_ = n.putChunksLocked(gpu, chunks)
	}
	delete(o.res, gpu)
	if o.active != gpu {
		return false // a parked copy: dropped, restored from the image at its next swap-in
	}
	o.active = -1
	o.epoch++
	o.fault = err
	o.loseLocked(fmt.Errorf("gpu %d: %w", gpu, err))
	n.loseScratchLocked(o, fmt.Errorf("gpu %d: %w", gpu, err))
	return true
}

// loseLocked records that f's copy was destroyed (by cause): a function still initialising has nothing to come
// back from (no image; bytes written back before, if any, are older than what it wrote since), unless its image
// from before a restart still matches everything it wrote, or it has no model block to lose.
func (f *function) loseLocked(cause error) {
	if f.captured || f.lost != nil || f.plan != nil && f.plan.stale == "" || len(modelSegments(f)) == 0 {
		return
	}
	f.lost = cause
}

// Lose records that device state of function that no image holds was destroyed (cause), as the remoting server
// finds when a module whose globals the function wrote is gone with its context: the function's work fails with
// ErrBroken and ErrLost until it is reset (its processes end and start again).
func (n *Node) Lose(name string, cause error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	if f.lost == nil {
		f.lost = cause
		n.log.Warn("function state lost: its process must start again", "function", name, "err", cause)
	}
	return f.usableLocked()
}

// Usable reports why function's device work is refused (its memory was lost, ErrLost; a binding of it expired
// and was not released, ErrHoldExpired), nil when it is not (or the function is unknown).
func (n *Node) Usable(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f, ok := n.fns[name]; ok {
		return f.usableLocked()
	}
	return nil
}

// usableLocked refuses work of a function whose memory was destroyed before it had an image (ErrLost), or one
// with a binding that expired and was not released yet (ErrHoldExpired) while it has no live binding and no request
// being bound: the function's other requests are bound and served, only work outside them is refused.
func (f *function) usableLocked() error {
	if f.lost != nil {
		return fmt.Errorf("%w: %w: %s: %w", ErrBroken, ErrLost, f.name, f.lost)
	}
	if f.fenced > 0 && f.users == 0 && f.admitting == 0 {
		return fmt.Errorf("%w: %w: %s: its work is refused until the request that held it releases it", ErrBroken,
			ErrHoldExpired, f.name)
	}
	return nil
}
