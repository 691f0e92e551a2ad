package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant"
)

// trackedPool wraps a pool to know which GPU each function's requests are bound to, which the remoting server
// asks for every call (remoting.Binder), to answer the remoting server's registry (remoting.Registry), and, with
// a data plane, to hold each binding there. Its state is kept by role, each part with its own lock: the functions
// registered (registry), the bindings held (executor.BindingTable), the maximum hold (holdLimit, holds.go), the
// GPUs seen failed (healthWatch, health.go), the instances (instanceTable, instances.go) and the counters.
//
// The end of a function's initialisation (docs/design.md, decision 3) is its first request: Acquire ends it on the
// data plane (DataPlane.EndInit, or inside the request's Hold with executor processes: the model blocks allocated
// so far are captured as the function's image in the repository, later blocks are scratch) before the request
// queues. Calls outside any request (BindImplicit) do not end it. The executors also end it themselves before a
// swap moves the function or an eviction drops its copy, so an image is never lost to a placement decision made
// between initialisation and the first request.
type trackedPool struct {
	healthPool
	node executor.DataPlane // nil without remoting
	log  *slog.Logger
	opt  trackedOptions

	reg    *registry
	binds  *executor.BindingTable[executor.Held]
	holds  *holdLimit
	health *healthWatch
	inst   *instanceTable
	counts counters
	// wake, once set (before serving), is told of every request bound, so that the function's remoting sessions
	// poll for its records at once (remoting.Server.Wake)
	wake atomic.Pointer[func(function string)]
}

// trackedOptions are what the tracked pool reports on besides the pool and the data plane.
type trackedOptions struct {
	sim     *sim.Backend    // the simulated device, for its kernel mode in the status; nil for real GPUs
	tenants *tenant.Plane   // the tenants' executor processes, for the status; nil when in-process
	meter   *metering.Meter // the functions' bill: each request's binding, Acquire to Release
	faults  *faultBackoff   // functions backed off after repeated kernel faults (faults.go); nil: none
}

func newTrackedPool(p healthPool, key auth.Key, node executor.DataPlane, maxFunctions int, maxHold time.Duration,
	log *slog.Logger, opt trackedOptions) *trackedPool {
	return &trackedPool{healthPool: p, node: node, log: log, opt: opt,
		reg: newRegistry(key, maxFunctions), binds: executor.NewBindingTable[executor.Held](),
		holds: newHoldLimit(maxHold, defaultHoldGrace), health: newHealthWatch(), inst: newInstanceTable(),
		counts: counters{swaps: map[string]int64{}}}
}

// setWake sets what is told of every request bound (see trackedPool.wake).
func (t *trackedPool) setWake(wake func(function string)) { t.wake.Store(&wake) }

// counters of the tracked pool.
type counters struct {
	mu       sync.Mutex
	swaps    map[string]int64 // bindings by how the model reached the GPU (pool.Binding.Swap)
	replaced int64            // acquires bound again because a GPU failed under them (see Server.Replaced)
}

// registry is the functions registered, with their specs (remoting.Registry).
type registry struct {
	key auth.Key
	max int

	mu    sync.Mutex
	specs map[string]pool.FunctionSpec
}

func newRegistry(key auth.Key, max int) *registry {
	return &registry{key: key, max: max, specs: map[string]pool.FunctionSpec{}}
}

// lookup returns name's spec, whether it is registered, and whether one more function is refused.
func (r *registry) lookup(name string) (spec pool.FunctionSpec, known, full bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spec, known = r.specs[name]
	return spec, known, !known && len(r.specs) >= r.max
}

func (r *registry) put(spec pool.FunctionSpec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.specs[spec.Name] = spec
}

func (r *registry) remove(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.specs, name)
}

// defaultHoldGrace is how long the work an expired binding had queued on its GPU may take to finish before its
// context there is torn down.
const defaultHoldGrace = 2 * time.Second

func (t *trackedPool) Register(ctx context.Context, spec pool.FunctionSpec) error {
	if err := pool.CheckName(spec.Name); err != nil {
		return err
	}
	old, known, full := t.reg.lookup(spec.Name)
	if full {
		return fmt.Errorf("%w: %d functions are registered, the most this gpuserver holds (MaxFunctions): "+
			"deregister one first", pool.ErrLimit, t.reg.max)
	}
	if err := t.healthPool.Register(ctx, spec); err != nil {
		return err
	}
	if err := spec.Validate(); err != nil { // fills the defaults the pool applied
		return err
	}
	if t.node != nil {
		if err := t.node.Register(spec.Name); err != nil {
			return err
		}
		if err := t.node.SetTenant(ctx, spec.Name, spec.Tenant()); err != nil { // its namespace, or itself if isolated
			if !known { // a function the data plane cannot take (one tenant too many) stays unknown to the pool too
				err = errors.Join(err, t.healthPool.Deregister(context.WithoutCancel(ctx), spec.Name))
			}
			return fmt.Errorf("register %q: %w", spec.Name, err)
		}
	}
	t.reg.put(spec)
	// Its instances take a new spec; the same spec again (a pod registering itself) leaves their copies alone.
	if known && old != spec {
		for _, key := range t.placedInstancesOf(spec.Name) {
			if err := t.registerInstance(ctx, key, spec); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *trackedPool) Deregister(ctx context.Context, name string) error {
	for _, key := range t.instancesOf(name) {
		t.dropInstance(ctx, key)
	}
	err := t.healthPool.Deregister(ctx, name)
	if t.node != nil {
		if nerr := t.node.Deregister(ctx, name); nerr != nil && !errors.Is(nerr, executor.ErrUnknownFunction) {
			err = errors.Join(err, nerr)
		}
	}
	t.reg.remove(name)
	if t.opt.faults != nil {
		t.opt.faults.forget(name)
	}
	return err
}

// Acquire binds one request of function: its initialisation ends first (see trackedPool). A function whose
// memory was lost before its initialisation ended is refused with pool.ErrFunctionLost (executor.ErrLost): its
// process must start again.
//
// function may name an instance (pool.InstanceKey): the instance is made known first, and bound on a GPU of its
// own while its siblings are bound on theirs (instances.go).
func (t *trackedPool) Acquire(ctx context.Context, function string) (pool.Binding, error) {
	if t.opt.faults != nil {
		if err := t.opt.faults.refused(function); err != nil {
			return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
		}
	}
	done, err := t.useInstance(ctx, function)
	if err != nil {
		return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
	}
	defer done()
	if t.node != nil {
		err := t.node.EndInit(ctx, function)
		switch {
		case errors.Is(err, executor.ErrLost):
			return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
		case err != nil && !errors.Is(err, executor.ErrUnknownFunction):
			return pool.Binding{}, fmt.Errorf("acquire %q: end of initialisation: %w", function, err)
		}
	}
	return t.acquire(ctx, function, true)
}

// acquire binds through the pool (whose actuator swaps the model in), then holds the function on its GPU's
// executor; when the pool's view and the executors' differ (a copy the executors evicted under pressure), the
// executor swaps it in from a GPU with a copy or from the host image. GPU failures the executors saw are told to
// the pool first (noteHealth), so the pool binds healthy GPUs only; should a GPU fail between the pool's decision
// and the executor's hold (a race health.go describes), the binding is given back and the request bound again.
// Only a request's binding (request) is what CurrentGPU reports.
func (t *trackedPool) acquire(ctx context.Context, function string, request bool) (pool.Binding, error) {
	if request {
		if err := t.holds.wait(ctx, function); err != nil {
			return pool.Binding{}, fmt.Errorf("acquire %q: %w", function, err)
		}
	}
	var (
		b    pool.Binding
		held executor.Held
		err  error
	)
	for attempt := 0; ; attempt++ {
		t.noteHealth(ctx)
		if t.noHealthyGPU() {
			return pool.Binding{}, fmt.Errorf("acquire %q: %w: every GPU failed (faas_gpu_gpu_healthy)", function,
				pool.ErrNoHealthyGPU)
		}
		if b, held, err = t.bind(ctx, function, request); err == nil {
			break
		}
		if errors.Is(err, pool.ErrNoHealthyGPU) {
			return pool.Binding{}, err
		}
		// Each retry follows a GPU that failed under this acquire: at most one per GPU.
		if t.node == nil || attempt >= t.node.GPUs() || !failedUnder(err) {
			return pool.Binding{}, err
		}
		t.counts.mu.Lock()
		t.counts.replaced++
		t.counts.mu.Unlock()
		t.log.WarnContext(ctx, "a gpu failed under an acquire: binding again", "function", function, "err", err)
	}
	t.binds.Add(b.ID, function, b.GPU, request, held)
	if request && held != nil {
		t.holds.start(b.ID, function, t.expire)
	}
	fn, inst := pool.SplitInstance(function)
	if request && t.opt.meter != nil {
		spec, _, _ := t.reg.lookup(fn)
		t.opt.meter.Begin(b.ID, fn, spec.MemoryBytes) // a function's instances are billed to it
		// a co-runner is billed at its share (sharing.go)
		if sh, ok := held.(interface{ Share() float64 }); ok {
			_ = t.opt.meter.SetShare(b.ID, sh.Share())
		}
	}
	b.Function, b.Instance = fn, inst
	swap := b.Swap
	if swap == "" {
		swap = "none"
	}
	t.counts.mu.Lock()
	t.counts.swaps[swap]++
	t.counts.mu.Unlock()
	if wake := t.wake.Load(); request && wake != nil {
		(*wake)(function)
	}
	return b, nil
}

// bind is one attempt of acquire: the pool's binding and, with executors, the hold on its GPU.
func (t *trackedPool) bind(ctx context.Context, function string, request bool) (pool.Binding, executor.Held, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &waiter{cancel: cancel}
	t.health.wait(w)
	b, err := t.healthPool.Acquire(ctx, function)
	t.health.waited(w)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, pool.ErrNoHealthyGPU) {
		return pool.Binding{}, nil, fmt.Errorf("acquire %q: %w", function, cause)
	}
	if err != nil || t.node == nil {
		return b, nil, err
	}
	held, err := t.node.Hold(ctx, function, b.GPU, executor.Any, b.ID, request)
	if err != nil {
		// The binding served nothing: it counts in no served or on-time figure.
		rerr := t.healthPool.Release(pool.WithUnserved(context.WithoutCancel(ctx)), b.ID)
		if failedUnder(err) && errors.Is(rerr, pool.ErrGPUUnhealthy) {
			rerr = nil // the pool knows already
		}
		return pool.Binding{}, nil, errors.Join(fmt.Errorf("acquire %q on gpu %d: %w", function, b.GPU, err), rerr)
	}
	return b, held, nil
}

// expire ends the binding id of a request of function that held its GPU longer than the maximum hold (a function
// whose handler never releases, or computes without end, would keep every other function off the GPU): the data
// plane breaks it, refuses the function's device work until the request releases it and stops what it queued
// (executor.Held.Expire), the pool's binding is released so that the GPU serves the next request, and the request's
// release answers that the binding broke (503).
func (t *trackedPool) expire(id, function string) {
	done, ok := t.holds.begin(id, function)
	if !ok {
		return
	}
	defer done()
	e, ok := t.binds.Expire(id) // CurrentGPU no longer reports it: the function's calls bind afresh, and are refused
	if !ok || e.Expired || e.Held == nil {
		return
	}
	t.holds.expired()
	fn, gpu, maxHold, grace := e.Function, e.GPU, t.holds.max, t.holds.grace
	cause := fmt.Errorf("%s held gpu %d longer than %s (the maximum binding hold)", fn, gpu, maxHold)
	ctx, cancel := context.WithTimeout(context.Background(), grace+time.Minute) // a timer: no request ctx
	defer cancel()
	if err := e.Held.Expire(ctx, grace, cause); err != nil {
		t.log.Error("ending a binding held too long", "function", fn, "binding", id, "err", err)
	}
	if err := t.healthPool.Release(ctx, id); err != nil && !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.log.Error("releasing a binding held too long", "function", fn, "binding", id, "err", err)
	}
	t.log.Warn("binding held too long: ended, its gpu serves the next request", "function", fn, "gpu", gpu,
		"binding", id, "max_hold", maxHold)
}

// stop ends the maximum-hold timers and waits for expiries running (the server shuts down).
func (t *trackedPool) stop() { t.holds.stop() }

// HoldsExpired counts the bindings ended because they were held longer than the maximum hold.
func (t *trackedPool) HoldsExpired() int64 { return t.holds.count() }

// Release ends a binding. When the GPU it was bound to failed meanwhile, the binding is released and the error
// (wrapping pool.ErrGPUUnhealthy and executor.ErrUnhealthy) says it broke: the request's work may not have
// completed. A binding that was ended because it was held too long (expire) answers pool.ErrBindingBroken.
func (t *trackedPool) Release(ctx context.Context, id string) error {
	t.holds.cancel(id)
	e, ok := t.binds.Take(id)
	if ok && e.Expired {
		err := e.Held.Finish() // the function's work is accepted again
		if err == nil {
			err = fmt.Errorf("held longer than %s", t.holds.max)
		}
		return fmt.Errorf("binding %s broke: %w: %w", id, pool.ErrBindingBroken, err)
	}
	// An instance whose processes ended, with nothing bound any more, is forgotten.
	if ok && e.Request && t.binds.Requests(e.Function) == 0 && t.inst.ended(e.Function) {
		defer t.forgetCopies(context.WithoutCancel(ctx), e.Function)
	}
	if t.opt.meter != nil {
		t.opt.meter.End(id) // implicit bindings were never begun
	}
	var broke error
	if ok && e.Held != nil {
		switch err := e.Held.Finish(); {
		case errors.Is(err, executor.ErrUnhealthy):
			broke = fmt.Errorf("binding %s broke: %w: %w", id, pool.ErrGPUUnhealthy, err)
			t.noteHealth(ctx)
		case err != nil:
			broke = fmt.Errorf("binding %s broke: %w: %w", id, pool.ErrBindingBroken, err)
		}
	}
	err := t.healthPool.Release(ctx, id)
	if broke != nil && errors.Is(err, pool.ErrGPUUnhealthy) {
		err = nil // the pool says the same
	}
	return errors.Join(err, broke)
}

// Swaps counts the bindings so far by how the model reached the GPU: none (resident), nvlink, pcie, cold.
func (t *trackedPool) Swaps() map[string]int64 {
	t.counts.mu.Lock()
	defer t.counts.mu.Unlock()
	out := make(map[string]int64, len(t.counts.swaps))
	for k, v := range t.counts.swaps {
		out[k] = v
	}
	return out
}

// Status adds the swaps by kind to the pool's status.
func (t *trackedPool) Status(ctx context.Context) pool.Status {
	t.noteHealth(ctx)
	st := t.healthPool.Status(ctx)
	st.Swaps = t.Swaps()
	if t.opt.sim != nil {
		st.SimKernels, st.SimDryLaunches = t.opt.sim.KernelMode().String(), t.opt.sim.DryLaunches()
	}
	if t.opt.tenants != nil {
		st.Tenants = t.opt.tenants.Tenants()
	}
	if t.opt.faults != nil {
		for i := range st.Functions {
			st.Functions[i].Faults, st.Functions[i].BackedOff = t.opt.faults.view(st.Functions[i].Name)
		}
	}
	return st
}

// CurrentGPU implements remoting.Binder: the GPU of one of the function's requests in flight
// (executor.BindingTable.CurrentGPU: never one the function was reset under).
func (t *trackedPool) CurrentGPU(function string) (int, bool) { return t.binds.CurrentGPU(function) }

// BindImplicit implements remoting.Binder: calls outside a request (initialisation) queue like a request. A
// function whose device work is refused (a binding of it expired and was not released, its memory was lost, it is
// backed off after repeated kernel faults) is refused at once instead of queueing.
func (t *trackedPool) BindImplicit(ctx context.Context, function string) (int, func(), error) {
	if t.opt.faults != nil { // backed off after repeated kernel faults: its initialisation waits too (faults.go)
		if err := t.opt.faults.refused(function); err != nil {
			return 0, nil, fmt.Errorf("bind %q outside a request: %w", function, err)
		}
	}
	if t.node != nil {
		if err := t.node.Usable(function); err != nil {
			return 0, nil, err
		}
	}
	done, err := t.useInstance(ctx, function)
	if err != nil {
		return 0, nil, err
	}
	defer done()
	// Initialisation goes on: no capture, not a request (counted in no served or on-time figure).
	b, err := t.acquire(pool.WithInitialisation(ctx), function, false)
	if err != nil {
		return 0, nil, err
	}
	var once sync.Once
	release := func() {
		once.Do(func() { _ = t.Release(context.WithoutCancel(ctx), b.ID) })
	}
	return b.GPU, release, nil
}

// Function implements remoting.Registry.
func (t *trackedPool) Function(name string) (pool.FunctionSpec, string, error) {
	spec, ok, _ := t.reg.lookup(name)
	if !ok {
		return pool.FunctionSpec{}, "", fmt.Errorf("%w: %s", pool.ErrUnknownFunction, name)
	}
	return spec, t.reg.key.FunctionToken(name), nil
}
