// Package tenantexec is a tenant executor process (docs/tenants.md): one per tenant per node, started and
// supervised by the gpuserver (package tenant), which sends it everything over one control socket (package
// tenant/handoff). It runs what the gpuserver ran in its own process before, for its tenant's functions only:
// package executor's Node (address spaces in the tenant's address window, residencies, swaps, captures) on chunks
// the gpuserver lends it, package repository on the tenant's own image directory, and package remoting's sessions,
// which the gpuserver hands over once their hello passed. A kernel fault of its tenant ends this process only
// (ExitFault); the gpuserver restarts it and its functions come back from their images.
package tenantexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// EnvChild, set to 1, makes a program that is not bin/faas-gpu (a test binary re-executing itself) run as a tenant
// executor: see RunIfChild.
const EnvChild = "FAAS_GPU_TENANT_EXECUTOR"

// Exit statuses of an executor process.
const (
	ExitOK    = 0
	ExitError = 1
	// ExitFault: a kernel of the tenant faulted; on a real GPU that poisons every context of the process.
	ExitFault = 3
)

// ErrFault ends an executor after a kernel fault of its tenant.
var ErrFault = errors.New("a kernel of the tenant faulted: the executor ends (every context of its process is poisoned)")

const (
	returnTimeout = 30 * time.Second
	// faultGrace lets the faulting call's answer reach its function before the process ends (the answer is an
	// error either way: the call's own, or the lost session's).
	faultGrace = 50 * time.Millisecond
)

// RunIfChild runs a tenant executor and exits when the process was started as one (EnvChild=1); otherwise it
// returns. Test binaries of packages that start executors call it first in TestMain.
func RunIfChild() {
	if os.Getenv(EnvChild) == "1" {
		os.Exit(Main(os.Stderr))
	}
}

// Main runs an executor on the control socket at fd 3 until the gpuserver closes it, a fault ends the tenant,
// or SIGTERM; it returns the exit status.
func Main(stderr io.Writer) int {
	// fd 3 must be the control socket the gpuserver passed; checked before anything opens a descriptor that
	// could take its number.
	if typ, err := unix.GetsockoptInt(handoff.FileFD, unix.SOL_SOCKET, unix.SO_TYPE); err != nil ||
		typ != unix.SOCK_SEQPACKET {
		fmt.Fprintf(stderr, "faas-gpu tenant-executor: started without a control socket on fd %d: the gpuserver "+
			"starts this command, one per tenant (docs/tenants.md)\n", handoff.FileFD)
		return ExitError
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctl := os.NewFile(uintptr(handoff.FileFD), "tenant-control")
	err := Run(ctx, ctl, stderr)
	switch {
	case errors.Is(err, ErrFault):
		return ExitFault
	case err != nil:
		fmt.Fprintf(stderr, "faas-gpu tenant-executor: %v\n", err)
		return ExitError
	}
	return ExitOK
}

// process is one executor's state.
type process struct {
	ctx    context.Context // ends when the executor ends
	cancel context.CancelCauseFunc
	peer   *handoff.Peer
	stderr io.Writer
	log    *slog.Logger

	ready    chan struct{} // closed once started (startErr says how)
	startErr error
	once     sync.Once

	cfg     handoff.Start
	dev     device.Backend // the backend as opened
	win     *window        // dev with reservations in the tenant's window
	sharer  device.Sharer
	mem     *memory.Manager
	repo    *repository.Repository
	node    *executor.Node
	srv     *remoting.Server
	binder  *binder
	metrics *prometheus.Registry
	closers []func(context.Context) error

	sessions   atomic.Int64
	faulted    atomic.Bool
	namedFault atomic.Pointer[handoff.Fault] // the first fault that names its function (onFault)
	named      chan struct{}                 // closed when namedFault is set

	// evicted are the copies the node dropped on its own, not yet reported (onEvict); kick wakes their reporter
	evictMu sync.Mutex
	evicted []handoff.Evicted
	kick    chan struct{}
}

// Run serves the control socket ctl (its descriptor is closed when Run returns).
func Run(ctx context.Context, ctl *os.File, stderr io.Writer) error {
	conn, err := handoff.FileConn(ctl)
	_ = ctl.Close()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	p := &process{ctx: ctx, cancel: cancel, stderr: stderr, ready: make(chan struct{}), named: make(chan struct{}),
		log: slog.New(slog.NewTextHandler(stderr, nil)), kick: make(chan struct{}, 1)}
	p.peer = handoff.NewPeer(conn, p.handlers(), handoff.Codes, p.log)
	reported := make(chan struct{})
	go func() { defer close(reported); p.reportEvictions(ctx) }()
	defer func() { cancel(nil); <-reported }()
	serveErr := p.peer.Serve(ctx)
	cause := context.Cause(ctx)
	if p.faulted.Load() {
		return ErrFault // the process ends now: its contexts are poisoned, nothing to tidy
	}
	p.shutdown()
	if cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	if errors.Is(serveErr, handoff.ErrClosed) {
		return nil // the gpuserver closed the socket: it stops this executor
	}
	return nil
}

// shutdown ends the sessions and releases what the executor built (images stay in the repository).
func (p *process) shutdown() {
	p.cancel(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := len(p.closers) - 1; i >= 0; i-- {
		if err := p.closers[i](ctx); err != nil {
			p.log.Warn("tenant executor: shut down", "err", err)
		}
	}
}

// handlers answer the gpuserver's operations (handoff.Ops, handoff.ToExecutor): the data plane's on the Node
// (handoff.PlaneRoutes), the others here (handlers.go); every one but the start waits for the executor to be
// started.
func (p *process) handlers() map[handoff.Kind]handoff.Handler {
	own := []handoff.Route{
		handoff.OpRegister.Handle(p.register),
		handoff.OpAcquire.Handle(p.acquire),
		handoff.OpRelease.Handle(p.release),
		handoff.OpExpire.Handle(p.expire),
		handoff.OpStatus.Handle(p.status),
		handoff.OpReclaim.Handle(p.reclaim),
		handoff.OpSession.HandleFiles(p.session),
	}
	routes := []handoff.Route{handoff.OpStart.Handle(p.start)}
	for _, r := range append(handoff.PlaneRoutes(p.plane), own...) {
		routes = append(routes, p.started(r))
	}
	return handoff.Routes(handoff.ToExecutor, routes...)
}

// plane is the executor's data plane, its Node (set once started: the routes of handlers ask it after that).
func (p *process) plane() executor.DataPlane { return p.node }

// started wraps the handler of an operation that needs the executor started (a frame before the start waits for
// it).
func (p *process) started(r handoff.Route) handoff.Route {
	h := r.Handler
	r.Handler = func(ctx context.Context, f handoff.Frame) (any, []*os.File, error) {
		select {
		case <-p.ready:
		case <-ctx.Done():
			closeAll(f.Files)
			return nil, nil, ctx.Err()
		}
		if p.startErr != nil {
			closeAll(f.Files)
			return nil, nil, fmt.Errorf("the executor did not start: %w", p.startErr)
		}
		return h(ctx, f)
	}
	return r
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

func (p *process) start(_ context.Context, cfg handoff.Start) (handoff.Started, error) {
	first := false
	p.once.Do(func() {
		first = true
		p.startErr = p.build(cfg)
		close(p.ready)
	})
	if !first {
		return handoff.Started{}, fmt.Errorf("%w: the executor was started already", handoff.ErrProtocol)
	}
	if p.startErr != nil {
		return handoff.Started{}, p.startErr
	}
	return handoff.Started{PID: os.Getpid(), GPUs: p.node.GPUs()}, nil
}

// build opens the device, the lending pools, the tenant's repository, the executors and the remoting server.
func (p *process) build(cfg handoff.Start) error {
	p.cfg = cfg
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	p.log = slog.New(slog.NewTextHandler(p.stderr, &slog.HandlerOptions{Level: level})).With(
		"component", "tenant-executor", "tenant", cfg.Tenant, "generation", cfg.Generation, "pid", os.Getpid())
	dev, err := openDevice(cfg.Device, cfg.WindowBase)
	if err != nil {
		return err
	}
	p.dev = dev
	p.closers = append(p.closers, dev.Close)
	sharer, ok := dev.(device.Sharer)
	if !ok {
		return fmt.Errorf("%w: the %s backend cannot import chunks from another process", device.ErrNotSupported,
			dev.Kind())
	}
	p.sharer = sharer
	if cfg.ChunkSize == 0 || len(cfg.Chunks) != len(dev.GPUs()) {
		return fmt.Errorf("%w: start: %d chunk counts of %d bytes for %d GPUs", handoff.ErrProtocol, len(cfg.Chunks),
			cfg.ChunkSize, len(dev.GPUs()))
	}
	p.win = newWindow(dev, cfg.WindowBase, cfg.WindowSize, p.log)
	repo, err := repository.Open(repository.Config{Dir: cfg.RepositoryDir, Registrar: dev})
	if err != nil {
		return fmt.Errorf("the tenant's repository: %w", err)
	}
	p.closers = append(p.closers, func(context.Context) error { return repo.Close() })
	p.repo = repo
	for _, name := range repo.Functions() { // new reservations go past the images' ranges
		if im, err := repo.Get(p.ctx, name); err == nil {
			for _, s := range im.Segments() {
				p.win.skip(uint64(s.Ptr), s.Size)
			}
			_ = im.Release()
		}
	}
	addrs := executor.NewAddresses(p.win)
	pools := make([]*memory.ChunkPool, len(cfg.Chunks))
	for g, n := range cfg.Chunks {
		pools[g] = memory.NewLendingPool(p.ctx, g, cfg.ChunkSize, n, lender{p})
	}
	p.mem = memory.FromPools(addrs, cfg.ChunkSize, pools)
	p.closers = append(p.closers, p.mem.Close)
	node, err := executor.New(executor.Config{Device: p.win, Memory: p.mem, Repository: repo,
		EvictUnderPressure: true, Addresses: addrs, GroupBytes: cfg.GroupBytes, Logger: p.log,
		OnContextFault: p.onFault, OnUnhealthy: p.onUnhealthy, OnEvict: p.onEvict})
	if err != nil {
		return fmt.Errorf("executors: %w", err)
	}
	p.node = node
	p.closers = append(p.closers, node.Close)
	for _, fn := range cfg.Functions {
		if err := p.registerFunction(p.ctx, fn); err != nil {
			return fmt.Errorf("register %s again: %w", fn.Name, err)
		}
	}
	p.binder = newBinder(p)
	p.metrics = prometheus.NewRegistry()
	srv, err := remoting.NewServer(remoting.Config{Device: dev, Node: node, Functions: noHellos{}, Binder: p.binder,
		NodeImages: imageBudget{p}, Logger: p.log.With("component", "remoting"), Metrics: p.metrics})
	if err != nil {
		return err
	}
	p.srv = srv
	p.log.Info("tenant executor started", "device", dev.Kind(), "gpus", len(dev.GPUs()),
		"repository", cfg.RepositoryDir, "images", len(repo.Functions()), "functions", len(cfg.Functions))
	return nil
}

// openDevice opens the executor's backend; a simulated one places its own memory (module globals) in the tenant's
// window from base on (a real driver places module globals where it likes).
func openDevice(d handoff.Device, base uint64) (device.Backend, error) {
	switch d.Kind {
	case "sim":
		if d.Sim == nil {
			return nil, fmt.Errorf("%w: start: a sim device without its node", handoff.ErrProtocol)
		}
		mode, err := sim.ParseKernelMode(d.Sim.Kernels)
		if d.Sim.Kernels == "" {
			mode, err = sim.KernelsReference, nil
		}
		if err != nil {
			return nil, err
		}
		return sim.New(sim.Options{Node: d.Sim.Node, Kernels: mode, TimeScale: d.Sim.TimeScale,
			Granularity: d.Sim.Granularity, ProcessWide: d.Sim.ProcessWide, AddressBase: device.Ptr(base)})
	case "cuda":
		return cuda.Open(d.CUDALibrary)
	}
	return nil, fmt.Errorf("%w: start: device kind %q", handoff.ErrProtocol, d.Kind)
}

// noHellos is the executor's remoting registry: it never reads a hello (the gpuserver checked it).
type noHellos struct{}

func (noHellos) Function(name string) (pool.FunctionSpec, string, error) {
	return pool.FunctionSpec{}, "", fmt.Errorf("%w: %s: hellos are checked by the gpuserver", pool.ErrUnknownFunction,
		name)
}

// onFault is called by the node (with its lock held) after a fault of the tenant's work: let the faulting call's
// answer go out, tell the gpuserver, and end the process. A fault that surfaced first on the node's own streams
// names no function (the process's contexts were poisoned): the faulting function's own report, which follows
// within the grace (its call's synchronisation), is the one told, so that the gpuserver backs off the right
// function.
func (p *process) onFault(gpu int, function string, err error) {
	f := &handoff.Fault{GPU: gpu, Function: function, Error: err.Error()}
	if function != "" && p.namedFault.CompareAndSwap(nil, f) {
		close(p.named)
	}
	if !p.faulted.CompareAndSwap(false, true) {
		return
	}
	p.log.Error("a kernel of the tenant faulted: the executor ends; the gpuserver restarts it and the tenant's "+
		"functions come back from their images", "gpu", gpu, "function", function, "err", err)
	go func() {
		t := time.NewTimer(faultGrace)
		defer t.Stop()
		graced := false
		select {
		case <-p.named: // at once when this fault names its function
		case <-t.C:
			graced = true
		case <-p.ctx.Done():
		}
		if named := p.namedFault.Load(); named != nil {
			f = named
		}
		_ = handoff.EventFault.Notify(p.peer, *f)
		if !graced {
			select {
			case <-t.C:
			case <-p.ctx.Done():
			}
		}
		p.cancel(ErrFault)
	}()
}

// onEvict is called by the node (with its lock held) when it drops a copy on its own: the gpuserver's controller
// forgets it and counts it. Frames go out in order on the control socket, so a later swap's frame never overtakes it.
func (p *process) onEvict(gpu int, function, reason string) {
	p.evictMu.Lock()
	p.evicted = append(p.evicted, handoff.Evicted{GPU: gpu, Function: function, Reason: reason})
	p.evictMu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// reportEvictions sends the copies the node dropped on its own to the gpuserver, in order, until ctx ends.
func (p *process) reportEvictions(ctx context.Context) {
	for {
		select {
		case <-p.kick:
		case <-ctx.Done():
			return
		}
		p.evictMu.Lock()
		es := p.evicted
		p.evicted = nil
		p.evictMu.Unlock()
		for _, e := range es {
			if err := handoff.EventEvicted.Notify(p.peer, e); err != nil {
				p.log.Warn("report an eviction", "function", e.Function, "gpu", e.GPU, "err", err)
			}
		}
	}
}

// onUnhealthy is called by the node (with its lock held) when it takes a GPU out of service. After a fault of the
// tenant the report says so (AfterFault): what failed may be the process's poisoned contexts, not the GPU.
func (p *process) onUnhealthy(gpu int, cause error) {
	after := p.faulted.Load()
	go func() {
		_ = handoff.EventGPUFailed.Notify(p.peer, handoff.GPUFailed{GPU: gpu, Error: cause.Error(), AfterFault: after})
	}()
}
