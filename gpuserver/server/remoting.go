package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
// executors, to hold each binding on the executor of its GPU.
//
// The end of a function's initialisation (docs/design.md, decision 3) is its first request: Acquire ends it on the
// executors (Node.EndInit: the model blocks allocated so far are captured as the function's image in the
// repository, later blocks are scratch) before the request queues. Calls outside any request (BindImplicit) do
// not end it. The executors also end it themselves before a swap moves the function or an eviction drops its
// copy, so an image is never lost to a placement decision made between initialisation and the first request.
type trackedPool struct {
	healthPool
	key          auth.Key
	node         executor.DataPlane // nil without remoting
	log          *slog.Logger
	maxFunctions int

	mu       sync.Mutex
	specs    map[string]pool.FunctionSpec
	bound    map[string]map[string]int // function -> binding ID -> GPU
	bindings map[string]string         // binding ID -> function
	held     map[string]executor.Held
	swaps    map[string]int64     // bindings by how the model reached the GPU (pool.Binding.Swap)
	failed   map[int]bool         // unhealthy GPUs already logged and told to the pool (see health.go)
	waiting  map[*waiter]struct{} // acquires waiting in the inner pool, failed at once when no GPU is left
	sim      *sim.Backend         // the simulated device, for its kernel mode in the status; nil for real GPUs
	tenants  *tenant.Plane        // the tenants' executor processes, for the status; nil when in-process
	replaced int64                // acquires bound again because a GPU failed under them (see Server.Replaced)
	meter    *metering.Meter      // the functions' bill: each request's binding, Acquire to Release
	faults   *faultBackoff        // functions backed off after repeated kernel faults (faults.go); nil: none
	// wake, when set (before serving), is told of every request bound, so that the function's remoting sessions
	// poll for its records at once (remoting.Server.Wake)
	wake func(function string)

	// instances are the instances known (instances.go), by key; instMu serialises their registration
	instances map[string]*instanceState
	instMu    sync.Mutex

	// The maximum hold (see expire): a request's binding held longer than maxHold is ended.
	maxHold   time.Duration
	holdGrace time.Duration            // how long the work an expired binding queued may take to finish
	timers    map[string]*time.Timer   // binding ID -> its hold's end
	expired   map[string]executor.Held // binding ID -> expired binding not released yet
	expiries  int64                    // bindings ended because they were held too long
	stopped   bool                     // the server shuts down: no more expiries
	expiring  sync.WaitGroup           // expiries running
	// expiringFn holds, per function, a channel for each expiry running, closed when it is done: the function's
	// new requests are bound once its expired bindings' work is fenced and stopped, not under the teardown
	expiringFn map[string][]chan struct{}
}

func newTrackedPool(p healthPool, key auth.Key, node executor.DataPlane, maxFunctions int, maxHold time.Duration,
	log *slog.Logger) *trackedPool {
	return &trackedPool{healthPool: p, key: key, node: node, log: log, maxFunctions: maxFunctions,
		specs: map[string]pool.FunctionSpec{}, bound: map[string]map[string]int{}, bindings: map[string]string{},
		held: map[string]executor.Held{}, swaps: map[string]int64{}, failed: map[int]bool{},
		waiting: map[*waiter]struct{}{}, maxHold: maxHold, holdGrace: defaultHoldGrace,
		timers: map[string]*time.Timer{}, expired: map[string]executor.Held{}, instances: map[string]*instanceState{}}
}

// defaultHoldGrace is how long the work an expired binding had queued on its GPU may take to finish before its
// context there is torn down.
const defaultHoldGrace = 2 * time.Second

func (t *trackedPool) Register(ctx context.Context, spec pool.FunctionSpec) error {
	if err := pool.CheckName(spec.Name); err != nil {
		return err
	}
	t.mu.Lock()
	old, known := t.specs[spec.Name]
	full := !known && len(t.specs) >= t.maxFunctions
	t.mu.Unlock()
	if full {
		return fmt.Errorf("%w: %d functions are registered, the most this gpuserver holds (MaxFunctions): "+
			"deregister one first", pool.ErrLimit, t.maxFunctions)
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
	t.mu.Lock()
	t.specs[spec.Name] = spec
	t.mu.Unlock()
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
	t.mu.Lock()
	delete(t.specs, name)
	t.mu.Unlock()
	if t.faults != nil {
		t.faults.forget(name)
	}
	return err
}

// Acquire binds one request of function: its initialisation ends first (see trackedPool). A function whose
// memory was lost before its initialisation ended (executor.ErrLost) is refused with pool.ErrFunctionLost: its
// process must start again.
//
// function may name an instance (pool.InstanceKey): the instance is made known first, and bound on a GPU of its
// own while its siblings are bound on theirs (instances.go).
func (t *trackedPool) Acquire(ctx context.Context, function string) (pool.Binding, error) {
	if t.faults != nil {
		if err := t.faults.refused(function); err != nil {
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
			return pool.Binding{}, fmt.Errorf("acquire %q: %w: %w", function, pool.ErrFunctionLost, err)
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
		if err := t.waitExpiries(ctx, function); err != nil {
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
		t.mu.Lock()
		t.replaced++
		t.mu.Unlock()
		t.log.WarnContext(ctx, "a gpu failed under an acquire: binding again", "function", function, "err", err)
	}
	t.mu.Lock()
	if request {
		if t.bound[function] == nil {
			t.bound[function] = map[string]int{}
		}
		t.bound[function][b.ID] = b.GPU
		t.bindings[b.ID] = function
	}
	if held != nil {
		t.held[b.ID] = held
		if request && t.maxHold > 0 && !t.stopped {
			id := b.ID
			t.timers[id] = time.AfterFunc(t.maxHold, func() { t.expire(id) })
		}
	}
	fn, inst := pool.SplitInstance(function)
	if request && t.meter != nil {
		t.meter.Begin(b.ID, fn, t.specs[fn].MemoryBytes) // a function's instances are billed to it
	}
	b.Function, b.Instance = fn, inst
	swap := b.Swap
	if swap == "" {
		swap = "none"
	}
	t.swaps[swap]++
	wake := t.wake
	t.mu.Unlock()
	if request && wake != nil {
		wake(function)
	}
	return b, nil
}

// bind is one attempt of acquire: the pool's binding and, with executors, the hold on its GPU.
func (t *trackedPool) bind(ctx context.Context, function string, request bool) (pool.Binding, executor.Held, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &waiter{cancel: cancel}
	t.mu.Lock()
	t.waiting[w] = struct{}{}
	t.mu.Unlock()
	b, err := t.healthPool.Acquire(ctx, function)
	t.mu.Lock()
	delete(t.waiting, w)
	t.mu.Unlock()
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, pool.ErrNoHealthyGPU) {
		return pool.Binding{}, nil, fmt.Errorf("acquire %q: %w", function, cause)
	}
	if err != nil || t.node == nil {
		return b, nil, err
	}
	held, err := t.node.Hold(ctx, function, b.GPU, executor.Any, b.ID, request)
	if errors.Is(err, executor.ErrLost) { // its memory is gone with no image: its process must start again
		err = fmt.Errorf("%w: %w", pool.ErrFunctionLost, err)
	}
	if err != nil {
		rerr := t.healthPool.Release(context.WithoutCancel(ctx), b.ID)
		if failedUnder(err) && errors.Is(rerr, pool.ErrGPUUnhealthy) {
			rerr = nil // the pool knows already
		}
		return pool.Binding{}, nil, errors.Join(fmt.Errorf("acquire %q on gpu %d: %w", function, b.GPU, err), rerr)
	}
	return b, held, nil
}

// expire ends the binding id of a request that held its GPU longer than maxHold (a function whose handler never
// releases, or computes without end, would keep every other function off the GPU): the executors break it,
// refuse the function's device work until the request releases it and stop what it queued (executor.Expire), the
// pool's binding is released so that the GPU serves the next request, and the request's release answers that the
// binding broke (503).
func (t *trackedPool) expire(id string) {
	t.mu.Lock()
	fn, ok := t.bindings[id]
	held := t.held[id]
	gpu := t.bound[fn][id]
	delete(t.timers, id)
	if !ok || held == nil || t.stopped {
		t.mu.Unlock()
		return
	}
	delete(t.bindings, id) // CurrentGPU no longer reports it: the function's calls bind afresh, and are refused
	delete(t.bound[fn], id)
	if len(t.bound[fn]) == 0 {
		delete(t.bound, fn)
	}
	delete(t.held, id)
	t.expired[id] = held
	t.expiries++
	t.expiring.Add(1)
	done := make(chan struct{})
	if t.expiringFn == nil {
		t.expiringFn = map[string][]chan struct{}{}
	}
	t.expiringFn[fn] = append(t.expiringFn[fn], done)
	t.mu.Unlock()
	defer t.expiring.Done()
	defer t.expiryDone(fn, done)
	cause := fmt.Errorf("%s held gpu %d longer than %s (the maximum binding hold)", fn, gpu, t.maxHold)
	ctx, cancel := context.WithTimeout(context.Background(), t.holdGrace+time.Minute) // a timer: no request ctx
	defer cancel()
	if err := held.Expire(ctx, t.holdGrace, cause); err != nil {
		t.log.Error("ending a binding held too long", "function", fn, "binding", id, "err", err)
	}
	if err := t.healthPool.Release(ctx, id); err != nil && !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.log.Error("releasing a binding held too long", "function", fn, "binding", id, "err", err)
	}
	t.log.Warn("binding held too long: ended, its gpu serves the next request", "function", fn, "gpu", gpu,
		"binding", id, "max_hold", t.maxHold)
}

// waitExpiries waits until the expiries of function's bindings running now are done (the expired request's work
// fenced, what it queued stopped), so that a new request of the function is not bound under their teardown.
func (t *trackedPool) waitExpiries(ctx context.Context, function string) error {
	t.mu.Lock()
	waits := append([]chan struct{}(nil), t.expiringFn[function]...)
	t.mu.Unlock()
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// expiryDone marks one expiry of function done (see waitExpiries).
func (t *trackedPool) expiryDone(function string, done chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	waits := t.expiringFn[function]
	for i, c := range waits {
		if c == done {
			waits = append(waits[:i], waits[i+1:]...)
			break
		}
	}
	if len(waits) == 0 {
		delete(t.expiringFn, function)
	} else {
		t.expiringFn[function] = waits
	}
	close(done)
}

// stop ends the maximum-hold timers and waits for expiries running (the server shuts down).
func (t *trackedPool) stop() {
	t.mu.Lock()
	t.stopped = true
	for id, tm := range t.timers {
		tm.Stop()
		delete(t.timers, id)
	}
	t.mu.Unlock()
	t.expiring.Wait()
}

// HoldsExpired counts the bindings ended because they were held longer than the maximum hold.
func (t *trackedPool) HoldsExpired() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.expiries
}

// Release ends a binding. When the GPU it was bound to failed meanwhile, the binding is released and the error
// (wrapping pool.ErrGPUUnhealthy and executor.ErrUnhealthy) says it broke: the request's work may not have
// completed. A binding that was ended because it was held too long (expire) answers pool.ErrBindingBroken.
func (t *trackedPool) Release(ctx context.Context, id string) error {
	t.mu.Lock()
	if tm, ok := t.timers[id]; ok {
		tm.Stop()
		delete(t.timers, id)
	}
	if held, ok := t.expired[id]; ok {
		delete(t.expired, id)
		t.mu.Unlock()
		err := held.Finish() // the function's work is accepted again
		if err == nil {
			err = fmt.Errorf("held longer than %s", t.maxHold)
		}
		return fmt.Errorf("binding %s broke: %w: %w", id, pool.ErrBindingBroken, err)
	}
	var gone string // an instance whose processes ended, with nothing bound any more
	if fn, ok := t.bindings[id]; ok {
		delete(t.bindings, id)
		delete(t.bound[fn], id)
		if len(t.bound[fn]) == 0 {
			delete(t.bound, fn)
			if st := t.instances[fn]; st != nil && st.ended {
				gone = fn
			}
		}
	}
	held := t.held[id]
	delete(t.held, id)
	t.mu.Unlock()
	if gone != "" {
		defer t.forgetCopies(context.WithoutCancel(ctx), gone)
	}
	if t.meter != nil {
		t.meter.End(id) // implicit bindings were never begun
	}
	var broke error
	if held != nil {
		switch err := held.Finish(); {
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
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int64, len(t.swaps))
	for k, v := range t.swaps {
		out[k] = v
	}
	return out
}

// Status adds the swaps by kind to the pool's status.
func (t *trackedPool) Status(ctx context.Context) pool.Status {
	t.noteHealth(ctx)
	st := t.healthPool.Status(ctx)
	st.Swaps = t.Swaps()
	if t.sim != nil {
		st.SimKernels, st.SimDryLaunches = t.sim.KernelMode().String(), t.sim.DryLaunches()
	}
	if t.tenants != nil {
		st.Tenants = t.tenants.Tenants()
	}
	if t.faults != nil {
		for i := range st.Functions {
			st.Functions[i].Faults, st.Functions[i].BackedOff = t.faults.view(st.Functions[i].Name)
		}
	}
	return st
}

// CurrentGPU implements remoting.Binder: the GPU of one of the function's requests in flight. A binding the
// function was reset under (executor.Binding.Orphaned: every process of the function ended while it was held) is
// never reported: calls of a new process must not run under the binding a dead one left behind. (A binding broken
// by a fault is still its live request's: its calls go on under it, and its release says it broke.)
func (t *trackedPool) CurrentGPU(function string) (int, bool) {
	t.mu.Lock()
	type cand struct {
		gpu  int
		held executor.Held
	}
	var cands []cand
	for id, gpu := range t.bound[function] {
		cands = append(cands, cand{gpu, t.held[id]})
	}
	t.mu.Unlock()
	for _, c := range cands { // Orphaned takes the executors' lock: asked outside t.mu
		if c.held == nil || !c.held.Orphaned() {
			return c.gpu, true
		}
	}
	return 0, false
}

// BindImplicit implements remoting.Binder: calls outside a request (initialisation) queue like a request. A
// function whose device work is refused (a binding of it expired and was not released, its memory was lost, it is
// backed off after repeated kernel faults) is refused at once instead of queueing.
func (t *trackedPool) BindImplicit(ctx context.Context, function string) (int, func(), error) {
	if t.faults != nil { // backed off after repeated kernel faults: its initialisation waits too (faults.go)
		if err := t.faults.refused(function); err != nil {
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
	t.mu.Lock()
	defer t.mu.Unlock()
	spec, ok := t.specs[name]
	if !ok {
		return pool.FunctionSpec{}, "", fmt.Errorf("%w: %s", pool.ErrUnknownFunction, name)
	}
	return spec, t.key.FunctionToken(name), nil
}
