// Package server assembles a node's gpuserver: the GPU pool for its node and the API served on a Unix socket
// (and optionally TCP). `faas-gpu gpuserver` runs one alone; `faas-gpu up` runs one in-process.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Config of a gpuserver.
type Config struct {
	// Socket is the path of the API's Unix socket; its directory is created.
	Socket string
	// Listen is an optional TCP address for the API (e.g. 127.0.0.1:0); empty means none.
	Listen string
	// Node describes the GPUs of the pool.
	Node topology.Node
	// Policy names the pool's policy: a controller policy (default "faas-gpu"; see controller.Policies) or
	// "fcfs" for the first-come-first-served pool.
	Policy string
	// Overload sets the faas-gpu policy's overload control: auto (the zero value), off or an explicit target.
	Overload controller.Overload
	// Admission is the admission rule (controller.Config.Admission); empty means controller.DefaultAdmission.
	Admission controller.Admission
	// Actuator carries out the controller's swaps and evictions; nil models them as link time on Node.
	Actuator controller.Actuator
	// RemotingSocket is the Unix socket the shim connects to (FAAS_GPU_REMOTING_SOCKET of function processes);
	// empty means no CUDA remoting.
	RemotingSocket string
	// KeyFile holds the key every credential derives from (package auth: the administrator's token, function
	// tokens, registration tickets); created (mode 0600) when missing. Empty means a random key held in memory:
	// credentials then change at every start. Required with RemotingSocket (function processes keep their token
	// across a gpuserver restart).
	KeyFile string
	// SocketGroup, when set (a group name or numeric id), is given the sockets (mode 0660) so that function
	// processes running as other users in that group can connect (a cluster node); empty means mode 0600, the
	// owner only. Either way every call that changes the pool also needs a credential.
	SocketGroup string
	// MaxFunctions bounds the functions registered at once; DefaultMaxFunctions when 0.
	MaxFunctions int
	// Device runs the remoted calls; nil means a simulated node built from Node. The server closes it (also when
	// Start fails).
	Device device.Backend
	// RepositoryDir holds the functions' model images (shared-memory files, kept across restarts: a tmpfs such
	// as /dev/shm/faas-gpu); empty means "repository" beside KeyFile. Used with RemotingSocket.
	RepositoryDir string
	// DeviceReserveBytes caps the device memory reserved per GPU for remoted allocations; 0 means all of it on a
	// real device and DefaultSimReserveBytes on the simulated one (whose device memory is host memory).
	DeviceReserveBytes uint64
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// SimKernels is what the simulated device (Device nil) does with kernels it cannot compute: refuse them at
	// launch (sim.KernelsReference, the default) or accept them without executing them (sim.KernelsDry, a
	// protocol-test mode the log, the pool status and /metrics announce). It must be the default with a Device.
	SimKernels sim.KernelMode
	// SimTimeScale, when > 0, runs the simulated device (Device nil) in its timed mode (sim.Options.TimeScale):
	// kernels, copies and swaps take their modelled time scaled by it, on the wall clock (faas-gpu replay's
	// timed virtual GPU); 0 runs without delays. It must be 0 with a Device.
	SimTimeScale float64
	// MaxBindingHold is the longest a request may hold its GPU (a function's timeout on this node): a binding
	// held longer is ended, the request's device work refused and stopped, its release answers 503, and the GPU
	// serves the next request. Calls outside a request (initialisation) give their GPU up as often and queue
	// again. DefaultMaxBindingHold when 0; negative means no bound.
	MaxBindingHold time.Duration
	// MeteringFile keeps the functions' bill (package metering) across restarts; empty keeps it in memory only.
	MeteringFile string
	// Tenants, when set, runs every tenant's device work in an executor process of its own (docs/tenants.md):
	// the gpuserver keeps the policy, the chunks and the remoting hello. Nil runs every tenant in the gpuserver's
	// process, where tenants are not isolated from each other on a real GPU (docs/security.md).
	Tenants *TenantConfig
	// SimProcessWide makes the simulated GPUs (Device nil) model what one process shares on a real GPU
	// (sim.Options.ProcessWide): in the gpuserver's process without Tenants, in each executor with them.
	SimProcessWide bool
	// FaultBackoff configures the backoff of a function whose kernels keep faulting (faults.go); zero fields take
	// the defaults.
	FaultBackoff FaultBackoff
	// ComputeSharing lets functions that asked for a compute share (com.openfaas.gpu.compute.request below 1)
	// co-run on a GPU, each held to its share by the gates of its executor (sharing.go); functions without a share
	// stay exclusive either way. --compute-sharing, on by default; it needs a data plane whose device measures its
	// streams' GPU time (the simulated GPUs), else it stays off with a warning.
	ComputeSharing bool
}

// DefaultMaxBindingHold is Config.MaxBindingHold when none is set: longer than an inference request takes
// (a few seconds; an LLM's answer of a thousand tokens at 30 tokens/s takes half a minute), shorter than the
// time other functions' requests would wait for the GPU before they give up many times over.
const DefaultMaxBindingHold = 2 * time.Minute

// TenantConfig configures the tenants' executor processes.
type TenantConfig struct {
	// Command is the argv of an executor process: bin/faas-gpu's hidden "tenant-executor" command, or a test
	// binary whose TestMain calls tenantexec.RunIfChild (with Env holding tenantexec.EnvChild=1). Required.
	Command []string
	Env     []string
	// Stderr receives the executors' logs; os.Stderr when nil.
	Stderr io.Writer
	// MaxTenants bounds the executors running at once (tenant.DefaultMaxTenants when 0).
	MaxTenants int
	// ContextBytes is what one executor's contexts take of a real GPU's memory; the gpuserver leaves MaxTenants of
	// them free when it reserves its chunks (DefaultTenantContextBytes when 0; the GPU suite measures it).
	ContextBytes uint64
	// LogLevel of the executors ("debug", "info", "warn", "error").
	LogLevel string
	// BackoffMin and BackoffMax bound the wait before an executor that ended is restarted (tenant.Config).
	BackoffMin, BackoffMax time.Duration
	// MaxModuleBytes bounds the module images all executors hold together (remoting.DefaultMaxModuleBytes when 0).
	MaxModuleBytes uint64
}

// DefaultTenantContextBytes is what one executor's contexts are assumed to take of a real GPU's memory until the
// GPU suite measured it (TestCUDAContextMemory).
const DefaultTenantContextBytes = 512 << 20

// Server is a running gpuserver.
type Server struct {
	cfg     Config
	dev     device.Backend
	node    *executor.Node // nil without remoting, and with executor processes per tenant
	tenants *tenant.Plane  // nil without executor processes per tenant
	pool    *trackedPool
	rs      *remoting.Server // nil without remoting
	meter   *metering.Meter
	faults  *faultBackoff // functions whose kernels keep faulting (faults.go)
	key     auth.Key
	servers []*http.Server
	metrics *prometheus.Registry
	addr    string
	errs    chan error
	closers []func(ctx context.Context) error // undone in reverse order by Shutdown
	evicted *dataPlaneEvictions               // the data plane's own evictions, on their way to the controller
	// capacity is each GPU's memory the data plane holds (its chunk pools' bytes, node order), set by
	// startDataPlane; the controller plans with it (planNode).
	capacity []uint64
	chunks   *memory.Manager // the data plane's chunk pools (the gpuserver's, lent to tenants' executors)
	sharing  *sharing        // compute shares (sharing.go); nil when off
}

// Start builds the pool and serves the API until Shutdown.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, errs: make(chan error, 3), metrics: prometheus.NewRegistry(),
		evicted: &dataPlaneEvictions{log: cfg.Logger}}
	if cfg.Device != nil { // the server owns it from here, also when the start fails
		s.closers = append(s.closers, cfg.Device.Close)
	}
	started := false
	defer func() {
		if !started {
			_ = s.undo(ctx) // what a failed start built (a no-op after Shutdown)
		}
	}()
	if cfg.Socket == "" {
		return nil, errors.New("gpuserver: socket path is empty")
	}
	if cfg.RemotingSocket != "" && cfg.KeyFile == "" {
		return nil, errors.New("gpuserver: a remoting socket needs a key file for function tokens")
	}
	if err := cfg.Node.Validate(); err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}
	if cfg.MaxFunctions <= 0 {
		cfg.MaxFunctions = DefaultMaxFunctions
	}
	switch {
	case cfg.MaxBindingHold == 0:
		cfg.MaxBindingHold = DefaultMaxBindingHold
	case cfg.MaxBindingHold < 0:
		cfg.MaxBindingHold = 0
	}
	s.cfg = cfg
	s.faults = newFaultBackoff(cfg.FaultBackoff, nil, cfg.Logger)
	if cfg.Device != nil && cfg.SimKernels != sim.KernelsReference {
		return nil, fmt.Errorf("gpuserver: sim kernels %s: only a simulated device runs kernels dry, this one is %s",
			cfg.SimKernels, cfg.Device.Kind())
	}
	if cfg.SimTimeScale < 0 || math.IsNaN(cfg.SimTimeScale) || cfg.SimTimeScale > 0 && cfg.Device != nil {
		return nil, fmt.Errorf("gpuserver: sim time scale %v: must be >= 0, and 0 with a device (only a simulated "+
			"device is timed)", cfg.SimTimeScale)
	}
	var err error
	if cfg.KeyFile != "" {
		s.key, err = auth.LoadKey(cfg.KeyFile)
	} else {
		s.key, err = auth.NewKey()
	}
	if err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}
	if cfg.RemotingSocket != "" {
		if err := s.startDataPlane(ctx); err != nil {
			return nil, err
		}
	}
	var plane executor.DataPlane
	switch {
	case s.tenants != nil:
		plane = s.tenants
	case s.node != nil:
		plane = s.node
	}
	switch {
	case s.capacity != nil && cfg.Device == nil && cfg.DeviceReserveBytes == 0:
		// A simulated GPU's memory is host memory: its chunks hold DefaultSimReserveBytes, a bound on this host, not
		// the GPU the node imitates. The controller keeps planning with the preset's memory there, so a function
		// whose quota is above that bound still deploys (its allocations are what must fit); on a real GPU, or with
		// a reserve named (Config.DeviceReserveBytes), it plans with the chunks.
		s.cfg.Logger.Info("gpuserver controller plans with the simulated node's memory; its data plane holds "+
			"less", "bytes_per_gpu", s.capacity)
	case s.capacity != nil:
		// The controller places against what the executors' chunks hold, not the GPUs' whole memory: a copy it
		// plans then fits, and its evictions are the ones made (the executors evict on their own only past that).
		if cfg.Node, err = planNode(cfg.Node, s.capacity); err != nil {
			return nil, fmt.Errorf("gpuserver: %w", err)
		}
		s.cfg.Logger.Info("gpuserver controller plans with the data plane's memory", "bytes_per_gpu", s.capacity)
	}
	plane, cfg.ComputeSharing = s.startSharing(ctx, cfg, plane)
	if plane != nil && cfg.Actuator == nil && cfg.Policy != PolicyFCFS {
		cfg.Actuator = planeActuator{plane}
	}
	var chunk uint64
	if s.chunks != nil {
		chunk = s.chunks.ChunkSize()
	}
	inner, err := newPool(cfg, plane != nil, chunk)
	if err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}
	s.evicted.attach(inner)
	meter, err := s.openMeter(plane != nil)
	if err != nil {
		return nil, err
	}
	opt := trackedOptions{meter: meter, faults: s.faults, tenants: s.tenants}
	opt.sim, _ = s.dev.(*sim.Backend)
	p := newTrackedPool(inner, s.key, plane, cfg.MaxFunctions, cfg.MaxBindingHold, cfg.Logger, opt)
	s.closers = append(s.closers, func(context.Context) error { p.stop(); return nil })
	if s.tenants != nil {
		s.tenants.SetBinder(p)
	}
	s.pool = p
	reg := s.metrics
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if opt.sim != nil {
		registerSimMetrics(reg, opt.sim)
	}
	reg.MustRegister(meter.Collector(), s.faults.collector(), newEvictionsCollector(inner))
	if plane != nil {
		reg.MustRegister(newScratchCollector(plane))
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "faas_gpu_binding_holds_expired_total",
		Help: "Bindings ended because their request held the GPU longer than the maximum binding hold."},
		func() float64 { return float64(p.HoldsExpired()) }))
	handler, err := api.New(p, reg, reg, cfg.Logger, api.WithAuth(s.key), api.WithUsage(meter))
	if err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}

	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
		return nil, fmt.Errorf("gpuserver: socket directory: %w", err)
	}
	if err := removeStaleSocket(cfg.Socket); err != nil {
		return nil, err
	}
	var listeners []net.Listener
	ul, err := listenUnix(cfg.Socket, cfg.SocketGroup)
	if err != nil {
		return nil, err
	}
	listeners = append(listeners, ul)
	if cfg.Listen != "" {
		tl, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			ul.Close()
			return nil, fmt.Errorf("gpuserver: listen on %s: %w", cfg.Listen, err)
		}
		s.addr = tl.Addr().String()
		listeners = append(listeners, tl)
	}
	for _, l := range listeners {
		hs := handler.NewHTTPServer()
		hs.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn) // accept errors (EMFILE), retried
		s.servers = append(s.servers, hs)
		go func() {
			// Connections are bounded per peer (the Unix socket's peer user, a TCP client's address) and in all.
			if err := hs.Serve(handler.Listener(l)); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.errs <- fmt.Errorf("gpuserver: serve %s: %w", l.Addr(), err)
			}
		}()
	}
	if cfg.RemotingSocket != "" {
		if err := s.startRemoting(ctx); err != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return nil, errors.Join(err, s.Shutdown(sctx))
		}
	}
	started = true
	cfg.Logger.Info("gpuserver started", "socket", cfg.Socket, "tcp", s.addr, "remoting", cfg.RemotingSocket,
		"node", cfg.Node.Name, "gpus", len(cfg.Node.GPUs), "policy", p.Status(ctx).Policy)
	return s, nil
}

// startDataPlane builds the device (the one given, else a simulated node), its memory manager, the model
// repository and the executors.
func (s *Server) startDataPlane(ctx context.Context) error {
	dev, reserve := s.cfg.Device, s.cfg.DeviceReserveBytes
	if dev == nil {
		var err error
		if dev, err = sim.New(sim.Options{Node: s.cfg.Node, Kernels: s.cfg.SimKernels, TimeScale: s.cfg.SimTimeScale,
			ProcessWide: s.cfg.SimProcessWide && s.cfg.Tenants == nil}); err != nil {
			return fmt.Errorf("gpuserver: simulated device: %w", err)
		}
		if s.cfg.SimKernels == sim.KernelsDry {
			s.cfg.Logger.Warn("simulated GPUs in dry kernel mode (--sim-kernels=dry): kernels the simulator cannot "+
				"compute are accepted and NOT executed, their results are wrong; for protocol tests only",
				"sim_kernels", s.cfg.SimKernels.String())
		}
		if reserve == 0 {
			reserve = min(DefaultSimReserveBytes, minGPUMemory(s.cfg.Node))
		}
	}
	if s.cfg.Device == nil {
		s.closers = append(s.closers, dev.Close)
	}
	s.dev = dev
	if s.cfg.Tenants != nil {
		return s.startTenants(dev, reserve)
	}
	if h, ok := dev.(interface{ PageableMemoryAccess(gpu int) bool }); ok {
		for _, g := range dev.GPUs() {
			if h.PageableMemoryAccess(g.Index) {
				s.cfg.Logger.Error("gpu kernels can read and write this process's host memory (HMM/ATS pageable "+
					"memory access): functions are NOT isolated from each other or from the gpuserver; load "+
					"nvidia_uvm with uvm_disable_hmm=1 (docs/security.md)", "gpu", g.Index)
			}
		}
	}
	// The memory manager reserves through addrs, so that functions get the fixed addresses of their images from
	// before a restart again (executor restore.go).
	addrs := executor.NewAddresses(dev)
	mem, err := memory.New(addrs, memory.Config{MaxBytesPerGPU: reserve, SlabChunks: memory.DefaultSlabChunks})
	if err != nil {
		return fmt.Errorf("gpuserver: device memory: %w", err)
	}
	s.closers = append(s.closers, mem.Close)
	s.capacity, s.chunks = chunkCapacity(mem), mem
	dir := s.repositoryDir()
	repo, err := repository.Open(repository.Config{Dir: dir, Registrar: dev})
	if err != nil {
		return fmt.Errorf("gpuserver: model repository: %w", err)
	}
	s.closers = append(s.closers, func(context.Context) error { return repo.Close() })
	// EvictUnderPressure: the controller plans evictions against these chunks' capacity (planNode); the
	// executors evict idle copies themselves should the chunks still run out first (a copy's whole chunks).
	node, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, EvictUnderPressure: true,
		Addresses: addrs, Logger: s.cfg.Logger.With("component", "executor"), OnEvict: s.evicted.report,
		OnContextFault: func(gpu int, function string, err error) {
			if function != "" && !errors.Is(err, executor.ErrHoldExpired) {
				s.faults.fault(function, gpu, err.Error())
			}
		}})
	if err != nil {
		return fmt.Errorf("gpuserver: executors: %w", err)
	}
	s.node = node
	s.closers = append(s.closers, node.Close)
	s.cfg.Logger.Info("gpuserver data plane", "device", dev.Kind(), "gpus", node.GPUs(), "repository", dir,
		"reserve_bytes_per_gpu", reserve, "images", len(repo.Functions()))
	return nil
}

// openMeter opens the functions' bill (metering.go), with the host images of the repository when there is a data
// plane; Shutdown closes it (writing its state file).
func (s *Server) openMeter(dataPlane bool) (*metering.Meter, error) {
	var images func() (map[string]uint64, error)
	if dataPlane {
		dir := s.repositoryDir()
		images = func() (map[string]uint64, error) { return repository.HostImages(dir) }
	}
	m, err := metering.Open(metering.Config{File: s.cfg.MeteringFile, HostImages: images,
		Logger: s.cfg.Logger.With("component", "metering")})
	if err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}
	s.meter = m
	s.closers = append(s.closers, func(context.Context) error { return m.Close() })
	return m, nil
}

// Usage is the functions' bill since a time (package metering; the zero time: since it began).
func (s *Server) Usage(since time.Time) metering.Report { return s.meter.Report(since) }

// repositoryDir is where the model images are: Config.RepositoryDir, else "repository" beside the key file.
func (s *Server) repositoryDir() string {
	if s.cfg.RepositoryDir != "" {
		return s.cfg.RepositoryDir
	}
	return filepath.Join(filepath.Dir(s.cfg.KeyFile), "repository")
}

// registerSimMetrics exports the simulated device's kernel mode and its dry launches.
func registerSimMetrics(reg prometheus.Registerer, sd *sim.Backend) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "faas_gpu_sim_kernels_dry",
			Help: "1 while the simulated GPUs accept kernels they cannot compute without executing them " +
				"(--sim-kernels=dry: results are wrong), 0 when they refuse them."},
			func() float64 {
				if sd.KernelMode() == sim.KernelsDry {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "faas_gpu_sim_dry_launches_total",
			Help: "Kernel launches the simulated GPUs accepted and did not execute (--sim-kernels=dry)."},
			func() float64 { return float64(sd.DryLaunches()) }))
}

// chunkCapacity is each GPU's bytes in the memory manager's chunk pools: what the data plane holds.
func chunkCapacity(mem *memory.Manager) []uint64 {
	c := make([]uint64, mem.GPUs())
	for i := range c {
		c[i] = uint64(mem.Pool(i).Total()) * mem.ChunkSize()
	}
	return c
}

// planNode is the node the controller plans with: each GPU's memory the data plane's capacity (at most the GPU's
// own). A GPU whose chunks hold nothing is an error: the controller would place there what cannot be held.
func planNode(n topology.Node, capacity []uint64) (topology.Node, error) {
	if len(capacity) != len(n.GPUs) {
		return topology.Node{}, fmt.Errorf("data plane: %d GPUs' chunk pools for a node of %d GPUs", len(capacity),
			len(n.GPUs))
	}
	out := n.Clone()
	for i, c := range capacity {
		if c == 0 {
			return topology.Node{}, fmt.Errorf("data plane: gpu %d: no device memory reserved (its chunk pool is "+
				"empty)", i)
		}
		out.GPUs[i].MemoryBytes = min(out.GPUs[i].MemoryBytes, c)
	}
	return out, nil
}

func minGPUMemory(n topology.Node) uint64 {
	m := uint64(0)
	for i, g := range n.GPUs {
		if i == 0 || g.MemoryBytes < m {
			m = g.MemoryBytes
		}
	}
	return m
}

// undo runs the closers of a failed start.
func (s *Server) undo(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i](sctx))
	}
	s.closers = nil
	return errors.Join(errs...)
}

// startRemoting serves the shim's connections on the executors.
func (s *Server) startRemoting(ctx context.Context) error {
	dev := s.dev
	rcfg := remoting.Config{Device: dev, Node: s.node, Functions: s.pool, Binder: s.pool,
		Logger: s.cfg.Logger.With("component", "remoting"), Metrics: s.metrics, MaxImplicitHold: s.cfg.MaxBindingHold}
	if s.tenants != nil { // sessions run in their tenants' executors once their hello passed
		rcfg.Node, rcfg.Binder, rcfg.HandOff = nil, nil, s.tenants.HandOff
	}
	rs, err := remoting.NewServer(rcfg)
	if err != nil {
		return fmt.Errorf("gpuserver: %w", err)
	}
	s.rs = rs
	if s.tenants == nil { // in-process sessions poll from the moment their function is bound
		s.pool.setWake(rs.Wake)
	}
	if err := removeStaleSocket(s.cfg.RemotingSocket); err != nil {
		return err
	}
	l, err := listenUnix(s.cfg.RemotingSocket, s.cfg.SocketGroup)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rs.Serve(rctx, l); err != nil {
			s.errs <- err
		}
	}()
	s.closers = append(s.closers, func(ctx context.Context) error {
		cancel()
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("remoting sessions did not end: %w", ctx.Err())
		}
		if err := os.Remove(s.cfg.RemotingSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
	return nil
}

// Token returns a function's token (its processes' FAAS_GPU_TOKEN: the remoting hello, acquire and release).
func (s *Server) Token(function string) string { return s.key.FunctionToken(function) }

// AdminToken returns the administrator's credential (registration and deregistration), which the provider holds.
func (s *Server) AdminToken() string { return s.key.AdminToken() }

// DefaultMaxFunctions bounds the functions a gpuserver registers at once when Config.MaxFunctions is 0.
const DefaultMaxFunctions = 4096

// listenUnix listens on a Unix socket that only its owner (mode 0600), or its owner and group (mode 0660), can
// connect to (connecting needs write permission on the socket file).
func listenUnix(path, group string) (net.Listener, error) {
	mode, gid := os.FileMode(0o600), -1
	if group != "" {
		mode = 0o660
		var err error
		if gid, err = lookupGroup(group); err != nil {
			return nil, fmt.Errorf("gpuserver: socket group: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("gpuserver: listen on %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("gpuserver: give socket %s to group %s: %w", path, group, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("gpuserver: chmod %s: %w", path, err)
	}
	return l, nil
}

// lookupGroup resolves a group name or numeric id.
func lookupGroup(group string) (int, error) {
	if gid, err := strconv.Atoi(group); err == nil && gid >= 0 {
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(g.Gid)
}

// RemotingSocket returns the shim's socket path, or "" without remoting.
func (s *Server) RemotingSocket() string { return s.cfg.RemotingSocket }

// RemotingStats are the remoting server's counters (remoting.Stats; zero without remoting): the sessions this
// process serves, not those of tenant executors.
func (s *Server) RemotingStats() remoting.Stats {
	if s.rs == nil {
		return remoting.Stats{}
	}
	return s.rs.Stats()
}

// DefaultSimReserveBytes is the device memory reserved per simulated GPU for remoted allocations.
const DefaultSimReserveBytes = 2 << 30

// PolicyFCFS selects the first-come-first-served pool instead of the controller.
const PolicyFCFS = "fcfs"

// ErrInvalidPolicy is wrapped when Config.Policy names no policy.
var ErrInvalidPolicy = errors.New("invalid policy")

// newPool builds the pool. With executors (oneGPU), each instance's requests are bound one at a time: its blocks
// live at one address, mapped on one GPU at a time (other GPUs may hold parked copies); a function's instances
// (pool.InstanceKey) are placed on their own, so a function is bound on as many GPUs at once as it has instances
// (instances.go). A sibling instance's copy is a swap source (controller.Config.SiblingSources; executor
// siblings.go). chunk is the data plane's chunk size (0 without one): a copy there takes its quota in whole chunks,
// and the controller plans it so (controller.Config.ChunkBytes).
func newPool(cfg Config, oneGPU bool, chunk uint64) (healthPool, error) {
	if cfg.Policy == PolicyFCFS {
		gpus := make([]pool.GPU, len(cfg.Node.GPUs))
		for i, g := range cfg.Node.GPUs {
			gpus[i] = pool.GPU{Name: g.Name, MemoryBytes: g.MemoryBytes}
		}
		return pool.NewFCFS(gpus, nil)
	}
	policy := controller.PolicyFaaSGPU
	if cfg.Policy != "" {
		var err error
		if policy, err = controller.ParsePolicy(cfg.Policy); err != nil {
			return nil, fmt.Errorf("%w: %w (or %s)", ErrInvalidPolicy, err, PolicyFCFS)
		}
	}
	admission := cfg.Admission
	if admission == "" {
		admission = controller.DefaultAdmission
	}
	maxInFlight := 0
	if oneGPU {
		maxInFlight = 1
	}
	return controller.NewPool(controller.PoolConfig{
		Controller: controller.Config{Policy: policy, Node: cfg.Node, MaxInFlight: maxInFlight,
			Overload: cfg.Overload, Admission: admission, SiblingSources: true, ChunkBytes: chunk,
			Sharing: controller.Sharing{On: cfg.ComputeSharing && oneGPU}},
		Actuator: cfg.Actuator,
	})
}

// Pool returns the server's pool.
func (s *Server) Pool() pool.Pool { return s.pool }

// Metrics is the registry the gpuserver's /metrics serves: the pool, remoting, API, Go runtime and process
// metrics. `up` serves it beside the gateway's on the gateway's /metrics.
func (s *Server) Metrics() prometheus.Gatherer { return s.metrics }

// Socket returns the API's Unix socket path.
func (s *Server) Socket() string { return s.cfg.Socket }

// Addr returns the TCP address of the API, or "" when it listens on the socket only.
func (s *Server) Addr() string { return s.addr }

// Err reports a listener that failed after Start.
func (s *Server) Err() <-chan error { return s.errs }

// Shutdown stops serving, waiting for in-flight requests until ctx ends, and removes the socket.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	for _, hs := range s.servers {
		if err := hs.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			_ = hs.Close()
		}
	}
	if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.closers = nil
	return errors.Join(errs...)
}

// removeStaleSocket deletes a socket file left by a gpuserver that died, and refuses to start when one answers.
func removeStaleSocket(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("gpuserver: another gpuserver is listening on %s", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("gpuserver: remove stale socket %s: %w", path, err)
	}
	return nil
}

// Executors returns the node's executors when they run in the gpuserver's process (nil without remoting, and with
// executor processes per tenant: see Tenants).
func (s *Server) Executors() *executor.Node { return s.node }

// Tenants returns the tenants' executor processes (nil when every tenant runs in the gpuserver's process).
func (s *Server) Tenants() *tenant.Plane { return s.tenants }

// Swaps counts the bindings so far by how the model reached the GPU: none (resident), nvlink, pcie, cold.
func (s *Server) Swaps() map[string]int64 { return s.pool.Swaps() }
