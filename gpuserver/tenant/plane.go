// Package tenant is the gpuserver's side of tenants isolated by process (docs/tenants.md): a Plane runs every
// tenant's device work in an executor process of its own (package tenantexec), started and supervised here, while
// the gpuserver keeps the pool's policy, every GPU's physical chunks (lent to the executors by descriptor, zeroed
// between tenants), the address plan and the remoting hello. What crosses to an executor crosses in package
// tenant/handoff.
package tenant

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// ErrExecutorDown: a tenant's executor is not running (starting, backed off after dying, or stopped).
var ErrExecutorDown = errors.New("tenant executor down")

// Defaults of Config.
const (
	DefaultMaxTenants   = 32
	DefaultWindowSize   = 1 << 38 // 256 GiB of device address space per tenant
	DefaultStartTimeout = 30 * time.Second
	DefaultBackoffMin   = 100 * time.Millisecond
	DefaultBackoffMax   = 30 * time.Second
	DefaultStableAfter  = time.Minute
)

// Binder binds calls outside a request (an executor's implicit bindings): the gpuserver's pool.
type Binder interface {
	BindImplicit(ctx context.Context, function string) (gpu int, release func(), err error)
}

// Config of a Plane.
type Config struct {
	// Device is the gpuserver's backend: it created Memory's chunks, which it exports (device.Sharer) and zeroes.
	Device device.Backend
	// Memory holds every GPU's chunks.
	Memory *memory.Manager
	// Executor is the device each executor opens (the same node).
	Executor handoff.Device
	// RepositoryDir holds each tenant's image directory and the address plan (tenants.json).
	RepositoryDir string
	// Command is the argv of an executor process: bin/faas-gpu's hidden "tenant-executor" command, or a test binary
	// with Env setting tenantexec.EnvChild. Required.
	Command []string
	// Env is added to the executors' environment.
	Env []string
	// Stderr receives the executors' output (their logs); os.Stderr when nil.
	Stderr io.Writer
	// MaxTenants bounds the executors running at once (DefaultMaxTenants when 0); a function of one more tenant is
	// refused at registration (pool.ErrLimit).
	MaxTenants int
	// WindowBase is where the tenants' address windows start (each WindowSize bytes, DefaultWindowSize when 0).
	WindowBase, WindowSize uint64
	// GroupBytes is the executors' swap group size (0: their default).
	GroupBytes uint64
	// LogLevel of the executors.
	LogLevel string
	// Logger receives the supervisor's logs; nil discards them.
	Logger *slog.Logger
	// Metrics, when set, receives faas_gpu_tenant_*.
	Metrics prometheus.Registerer
	// StartTimeout bounds an executor's start; BackoffMin and BackoffMax bound the wait before restarting one that
	// ended (doubling while it keeps dying); an executor that ran StableAfter is restarted after BackoffMin again.
	StartTimeout, BackoffMin, BackoffMax, StableAfter time.Duration
	// OnFault, when set, is told of every kernel fault of a tenant's function (the gpuserver backs off a function
	// that keeps faulting). It must not call the Plane.
	OnFault func(function string, gpu int, cause string)
	// CheckGPU checks a GPU after a tenant's fault (health.go); device.CheckHealth on Device when nil.
	CheckGPU func(ctx context.Context, gpu int) error
	// OnEvict, when set, is told of every copy an executor dropped on its own (handoff.KindEvicted: a swap-in out of
	// chunks, another tenant's chunks given back), with a function of that executor's tenant only.
	OnEvict func(gpu int, function, reason string)
	// MaxModuleBytes bounds the module images every executor holds together (remoting.DefaultMaxModuleBytes when
	// 0): the node's bound, which each executor's own (per process) would multiply by the tenants.
	MaxModuleBytes uint64
}

// Plane runs the node's executors in one process per tenant. It is the gpuserver's data plane (executor.DataPlane,
// each method an operation of tenant/handoff's Ops) and the remoting server's hand-off (HandOff). It is safe for
// concurrent use.
type Plane struct {
	cfg     Config
	log     *slog.Logger
	mem     *memory.Manager
	lend    *lending
	plan    *addressPlan
	chunks  []int
	metrics *metrics
	binder  atomic.Pointer[binderBox]

	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup // health checks after faults (health.go)

	mu        sync.Mutex
	procs     map[string]*proc
	retiring  map[string]chan struct{} // tenants whose idle executor is stopping (closed when it stopped)
	fns       map[string]string        // function -> tenant
	unhealthy map[int]error
	faults    []int64 // per GPU: executors ended by a fault of their tenant
	nextID    uint64
	closed    bool

	imu    sync.Mutex // guards images and every generation's images and imagesEnded
	images uint64     // module image bytes the executors reserved (Config.MaxModuleBytes)
}

type binderBox struct{ b Binder }

// New validates cfg and returns a Plane; executors start as their tenants' functions register.
func New(cfg Config) (*Plane, error) {
	if cfg.Device == nil || cfg.Memory == nil || cfg.RepositoryDir == "" || len(cfg.Command) == 0 {
		return nil, errors.New("tenant: Device, Memory, RepositoryDir and Command are required")
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxTenants <= 0 {
		cfg.MaxTenants = DefaultMaxTenants
	}
	if cfg.WindowSize == 0 {
		cfg.WindowSize = DefaultWindowSize
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.StableAfter <= 0 {
		cfg.StableAfter = DefaultStableAfter
	}
	if cfg.MaxModuleBytes == 0 {
		cfg.MaxModuleBytes = remoting.DefaultMaxModuleBytes
	}
	if cfg.WindowBase == 0 {
		// Above where the gpuserver's own device reserves (its zeroing staging ranges).
		p, err := cfg.Device.ReserveAddress(cfg.Memory.ChunkSize(), 0)
		if err != nil {
			return nil, fmt.Errorf("tenant: address plan: %w", err)
		}
		_ = cfg.Device.FreeAddress(p, cfg.Memory.ChunkSize())
		cfg.WindowBase = (uint64(p) + cfg.WindowSize - 1) &^ (cfg.WindowSize - 1)
	}
	if err := repository.PrivateDir(cfg.RepositoryDir); err != nil {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	plan, err := openPlan(cfg.RepositoryDir, cfg.WindowBase, cfg.WindowSize, max(4*cfg.MaxTenants, 64))
	if err != nil {
		return nil, err
	}
	lend, err := newLending(cfg.Device, cfg.Memory)
	if err != nil {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("tenant: metrics: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pl := &Plane{cfg: cfg, log: cfg.Logger, mem: cfg.Memory, lend: lend, plan: plan, metrics: m, ctx: ctx,
		cancel: cancel, procs: map[string]*proc{}, retiring: map[string]chan struct{}{}, fns: map[string]string{}, unhealthy: map[int]error{},
		faults: make([]int64, cfg.Memory.GPUs())}
	for g := range cfg.Memory.GPUs() {
		pl.chunks = append(pl.chunks, cfg.Memory.Pool(g).Total())
	}
	m.sessions.pl = pl
	return pl, nil
}

// SetBinder sets what answers the executors' implicit bindings (the gpuserver's pool, built after the Plane).
func (pl *Plane) SetBinder(b Binder) { pl.binder.Store(&binderBox{b}) }

// procFor returns tenant's supervisor with function counted among its functions, starting it (and its executor)
// when it is new; an executor of the tenant that is being retired is waited for first.
func (pl *Plane) procFor(ctx context.Context, tenant, function string) (*proc, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for {
		done, ok := pl.retiring[tenant]
		if !ok {
			break
		}
		pl.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			pl.mu.Lock()
			return nil, ctx.Err()
		}
		pl.mu.Lock()
	}
	if pl.closed {
		return nil, fmt.Errorf("%w: the gpuserver is shutting down", ErrExecutorDown)
	}
	if p, ok := pl.procs[tenant]; ok {
		p.mu.Lock()
		p.functions[function] = true
		p.mu.Unlock()
		return p, nil
	}
	if len(pl.procs) >= pl.cfg.MaxTenants {
		return nil, fmt.Errorf("%w: %d tenants have executors on this node, the most it runs (--max-tenants): "+
			"tenant %s is refused", pool.ErrLimit, len(pl.procs), tenant)
	}
	slot, err := pl.plan.slot(tenant)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", pool.ErrLimit, err)
	}
	p := newProc(pl, tenant, slot)
	p.functions[function] = true
	pl.procs[tenant] = p
	go p.run()
	return p, nil
}

// retireIfIdle stops a tenant's executor once the tenant has no function left, so that it holds no context on any
// GPU and no longer counts against MaxTenants; the tenant keeps its address slot (and its images, if any).
func (pl *Plane) retireIfIdle(ctx context.Context, p *proc) {
	pl.mu.Lock()
	p.mu.Lock()
	idle := len(p.functions) == 0
	p.mu.Unlock()
	if !idle || pl.procs[p.tenant] != p || pl.closed {
		pl.mu.Unlock()
		return
	}
	delete(pl.procs, p.tenant)
	done := make(chan struct{})
	pl.retiring[p.tenant] = done
	pl.mu.Unlock()
	err := p.shutdown(ctx)
	pl.metrics.up.DeleteLabelValues(p.tenant)
	pl.mu.Lock()
	delete(pl.retiring, p.tenant)
	pl.mu.Unlock()
	close(done)
	pl.log.Info("tenant executor stopped: the tenant has no function left", "tenant", p.tenant, "err", err)
}

// procOf returns the supervisor of function's tenant.
func (pl *Plane) procOf(function string) (*proc, error) {
	pl.mu.Lock()
	t, ok := pl.fns[function]
	var p *proc
	if ok {
		p = pl.procs[t]
	}
	pl.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("%w: %s", executor.ErrUnknownFunction, function)
	}
	return p, nil
}

// GPUs is the number of GPUs.
func (pl *Plane) GPUs() int { return pl.mem.GPUs() }

// Healthy reports whether a GPU is in service (no executor reported it failed, and nobody marked it).
func (pl *Plane) Healthy(gpu int) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.unhealthy[gpu] == nil
}

// MarkUnhealthy takes a GPU out of service in every executor.
func (pl *Plane) MarkUnhealthy(gpu int, cause error) {
	pl.mu.Lock()
	if pl.unhealthy[gpu] == nil {
		pl.unhealthy[gpu] = cause
	}
	pl.mu.Unlock()
	_ = toEvery(pl.ctx, pl, handoff.OpMarkUnhealthy, handoff.MarkUnhealthy{GPU: gpu, Cause: cause.Error()})
}

func (pl *Plane) procList() []*proc {
	out := make([]*proc, 0, len(pl.procs))
	for _, p := range pl.procs {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].tenant < out[j].tenant })
	return out
}

func (p *proc) current() *generation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// Register is a no-op: a function's executor is known once SetTenant names its tenant.
func (pl *Plane) Register(name string) error {
	if name == "" {
		return fmt.Errorf("%w: function name is empty", executor.ErrInvalid)
	}
	return nil
}

// SetTenant puts a function into tenant: its tenant's executor (started if new) registers it. A function that
// changes tenant is deregistered from its old tenant's executor (its copies and image there are dropped).
func (pl *Plane) SetTenant(ctx context.Context, name, tenant string) error {
	if tenant == "" {
		return fmt.Errorf("%w: empty tenant", executor.ErrInvalid)
	}
	pl.mu.Lock()
	old, had := pl.fns[name]
	pl.mu.Unlock()
	if had && old != tenant {
		if err := pl.Deregister(ctx, name); err != nil && !errors.Is(err, executor.ErrUnknownFunction) {
			return err
		}
	}
	p, err := pl.procFor(ctx, tenant, name)
	if err != nil {
		return err
	}
	pl.mu.Lock()
	pl.fns[name] = tenant
	pl.mu.Unlock()
	_, err = call(ctx, p, handoff.OpRegister, handoff.Function{Name: name, Tenant: tenant})
	return err
}

// Deregister drops a function from its tenant's executor (copies evicted, image deleted).
func (pl *Plane) Deregister(ctx context.Context, name string) error {
	p, err := pl.procOf(name)
	if err != nil {
		return err
	}
	pl.mu.Lock()
	delete(pl.fns, name)
	pl.mu.Unlock()
	p.mu.Lock()
	delete(p.functions, name)
	p.mu.Unlock()
	_, err = call(ctx, p, handoff.OpDeregister.Op, handoff.Name{Function: name})
	pl.retireIfIdle(ctx, p)
	return err
}

// EndInit does nothing: a request's Hold ends the function's initialisation in its executor first (the capture of
// its image there), one frame less per request. (The executors end it themselves before a swap moves a function or
// an eviction drops its copy, so no image is lost to the placement made in between.)
func (pl *Plane) EndInit(context.Context, string) error { return nil }

// Usable is nil: an executor process refuses its functions' work itself.
func (pl *Plane) Usable(string) error { return nil }

// SwapIn is the controller's swap, carried out by the function's executor.
func (pl *Plane) SwapIn(ctx context.Context, name string, gpu int, source executor.Source) error {
	return toFunction(ctx, pl, name, handoff.OpSwapIn, handoff.SwapIn{Function: name, GPU: gpu, Source: source})
}

// Evict is the controller's eviction, carried out by the function's executor.
func (pl *Plane) Evict(ctx context.Context, name string, gpu int) error {
	return toFunction(ctx, pl, name, handoff.OpEvict, handoff.Evict{Function: name, GPU: gpu})
}

// WaitReady waits until a function's copies on its active GPU completed (benchmarks).
func (pl *Plane) WaitReady(ctx context.Context, name string) error {
	return toFunction(ctx, pl, name, handoff.OpWaitReady, handoff.Name{Function: name})
}

var _ executor.DataPlane = (*Plane)(nil)

// Hold is a binding held on a function's executor (executor.Held).
type Hold struct {
	pl *Plane
	g  *generation
	id string
}

// Hold holds binding id of function on gpu in its executor (executor.Node.Acquire there); request says whether
// its function's sessions run their calls on that GPU now (a request's binding, whose hold ends the function's
// initialisation first) or not (an implicit one).
func (pl *Plane) Hold(ctx context.Context, name string, gpu int, source executor.Source, id string,
	request bool) (executor.Held, error) {
	p, err := pl.procOf(name)
	if err != nil {
		return nil, err
	}
	g, peer, err := p.waitUp(ctx)
	if err != nil {
		return nil, err
	}
	// The Acquire runs under the plane's context, not ctx: a caller that gives up while it is in flight abandons
	// it (abandon), so that the executor never keeps a binding nobody releases.
	answer := make(chan error, 1)
	go func() {
		_, err := handoff.OpAcquire.Call(pl.ctx, peer, handoff.Acquire{Function: name, GPU: gpu, Source: source,
			Binding: id, Request: request})
		answer <- err
	}()
	select {
	case err := <-answer:
		if err != nil {
			return nil, err
		}
		return &Hold{pl: pl, g: g, id: id}, nil
	case <-ctx.Done():
	}
	err = fmt.Errorf("hold %s of %s on gpu %d: %w", id, name, gpu, ctx.Err())
	if aerr := pl.abandon(peer, id, answer); aerr != nil {
		pl.log.Error("abandoning a hold its caller gave up", "function", name, "gpu", gpu, "binding", id,
			"err", aerr)
		return nil, errors.Join(err, aerr)
	}
	return nil, err
}

// abandonTimeout bounds the abandon of a hold: the executor's answers to it and to the hold's Acquire.
const abandonTimeout = 30 * time.Second

// abandon undoes binding id's hold, whose caller gave up while its Acquire (answer) was in flight: it tells the
// executor (handoff.Release.Abandoned: the binding is dropped whatever became of the Acquire) and waits for the
// Acquire's answer, after which the executor holds nothing of id, so that the pool may give the GPU to another
// binding. An executor that ended took its bindings with it.
func (pl *Plane) abandon(peer *handoff.Peer, id string, answer <-chan error) error {
	ctx, cancel := context.WithTimeout(pl.ctx, abandonTimeout)
	defer cancel()
	_, err := handoff.OpRelease.Call(ctx, peer, handoff.Release{Binding: id, Abandoned: true})
	if err != nil && !errors.Is(err, handoff.ErrClosed) {
		return fmt.Errorf("abandon binding %s: %w", id, err)
	}
	select {
	case <-answer: // refused (abandoned), failed, or held and then released by the abandon
		return nil
	case <-ctx.Done():
		return fmt.Errorf("abandon binding %s: its acquire did not end: %w", id, ctx.Err())
	}
}

// Finish releases the binding and says whether it broke while it was held: its GPU failed (executor.ErrUnhealthy),
// its function's state was replaced (executor.ErrBroken), or its executor ended (executor.ErrBroken: the work of
// the request is lost with the process).
func (h *Hold) Finish() error {
	peer := h.g.live()
	if peer == nil {
		return fmt.Errorf("%w: %w: the executor of %s ended while the binding was held (%s): the request's work "+
			"and the sessions it ran are lost", executor.ErrBroken, pool.ErrFunctionLost, h.g.p.tenant, h.g.p.lastEnd())
	}
	ctx, cancel := context.WithTimeout(h.pl.ctx, 30*time.Second)
	defer cancel()
	rel, err := handoff.OpRelease.Call(ctx, peer, handoff.Release{Binding: h.id})
	if err != nil {
		if errors.Is(err, handoff.ErrClosed) {
			return fmt.Errorf("%w: %w: the executor of %s ended while the binding was held: the request's work and "+
				"the sessions it ran are lost: %w", executor.ErrBroken, pool.ErrFunctionLost, h.g.p.tenant, err)
		}
		return err
	}
	if rel.Broken != nil {
		return peer.DecodeError(*rel.Broken)
	}
	return nil
}

// Expire ends the binding in its executor because its request held it too long (handoff.Expire: the function's
// work there is refused until Finish, and what it queued is stopped after grace); it returns once that is done. An
// executor that ended meanwhile took the function's work with it (Finish says the binding broke).
func (h *Hold) Expire(ctx context.Context, grace time.Duration, cause error) error {
	peer := h.g.live()
	if peer == nil {
		return nil
	}
	_, err := handoff.OpExpire.Call(ctx, peer, handoff.Expire{Binding: h.id, GraceNS: int64(grace),
		Cause: cause.Error()})
	if errors.Is(err, handoff.ErrClosed) {
		return nil
	}
	return err
}

// Orphaned is false: an executor's bindings are its sessions' business (it answers CurrentGPU itself).
func (h *Hold) Orphaned() bool { return false }

func (p *proc) lastEnd() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastExit == "" {
		return "it is being replaced"
	}
	return p.lastExit
}

// HandOff sends a remoting session whose hello the gpuserver checked to its function's tenant executor
// (remoting.HandOff).
func (pl *Plane) HandOff(ctx context.Context, conn, shm *os.File, info remoting.SessionInfo, shmSize uint64,
	done func()) error {
	defer conn.Close()
	defer shm.Close()
	p, err := pl.procOf(info.Function)
	if err != nil {
		done()
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, pl.cfg.StartTimeout)
	defer cancel()
	g, peer, err := p.waitUp(wctx)
	if err != nil {
		done()
		return err
	}
	pl.mu.Lock()
	pl.nextID++
	id := pl.nextID
	pl.mu.Unlock()
	var once sync.Once
	doneOnce := func() { once.Do(done) }
	g.mu.Lock()
	if g.ended {
		g.mu.Unlock()
		doneOnce()
		return fmt.Errorf("%w: the executor of %s ended", ErrExecutorDown, p.tenant)
	}
	g.sessions[id] = doneOnce
	g.mu.Unlock()
	if _, _, err := handoff.OpSession.CallFiles(wctx, peer, handoff.Session{ID: id, Function: info.Function,
		Spec: info.Spec, PID: info.PID, ShmSize: shmSize}, []*os.File{conn, shm}); err != nil {
		g.sessionEnded(id)
		return err
	}
	return nil
}

// sessionEnded uncounts a session handed to g.
func (g *generation) sessionEnded(id uint64) {
	g.mu.Lock()
	done := g.sessions[id]
	delete(g.sessions, id)
	g.mu.Unlock()
	if done != nil {
		done()
	}
}

// Close stops every executor (their images stay) and releases the lending's resources; the chunks are the
// caller's (the memory manager).
func (pl *Plane) Close(ctx context.Context) error {
	pl.mu.Lock()
	pl.closed = true
	procs := pl.procList()
	pl.mu.Unlock()
	var errs []error
	for _, p := range procs {
		errs = append(errs, p.shutdown(ctx))
	}
	pl.cancel()
	pl.bg.Wait()
	errs = append(errs, pl.lend.close())
	return errors.Join(errs...)
}

// reserveImages reserves n bytes of module images for generation g within the node's bound.
func (pl *Plane) reserveImages(g *generation, n uint64) error {
	pl.imu.Lock()
	defer pl.imu.Unlock()
	if g.imagesEnded {
		return fmt.Errorf("%w: the executor ended", handoff.ErrClosed)
	}
	if pl.images+n > pl.cfg.MaxModuleBytes || pl.images+n < pl.images {
		return fmt.Errorf("the node would hold %d bytes of module images, at most %d (MaxModuleBytes, over every "+
			"tenant's executor)", pl.images+n, pl.cfg.MaxModuleBytes)
	}
	g.images += n
	pl.images += n
	return nil
}

// releaseImages gives back n bytes of module images g reserved; all gives back everything and reserves no more
// (g ended).
func (pl *Plane) releaseImages(g *generation, n uint64, all bool) {
	pl.imu.Lock()
	defer pl.imu.Unlock()
	if all {
		n, g.imagesEnded = g.images, true
	}
	n = min(n, g.images)
	g.images -= n
	pl.images -= n
}
