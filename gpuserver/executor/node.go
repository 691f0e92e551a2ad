package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Errors of the executors.
var (
	ErrUnknownFunction = errors.New("unknown function")
	ErrNotCaptured     = errors.New("function has no captured image")
	ErrBusy            = errors.New("function is in use on another gpu")
	ErrPinned          = errors.New("copy is the source of a running swap")
	ErrUnhealthy       = errors.New("gpu is unhealthy")
	ErrNoMemory        = errors.New("not enough gpu memory")
	ErrInvalid         = errors.New("invalid request")
	// ErrBroken: a binding's device state was replaced under it (see Binding.Err).
	ErrBroken = errors.New("binding broke")
	// ErrLost: a fault or a GPU failure destroyed device state of a function that no image holds (its memory
	// before its initialisation ended, module globals it wrote, scratch it keeps between requests; scratch.go),
	// or its scratch cannot be kept, so its process must start again (and initialise afresh after Reset). It is
	// pool.ErrFunctionLost, what the gpuserver's callers see (one sentinel across the data plane's seam).
	ErrLost = pool.ErrFunctionLost
)

// Host is the Source of a swap from the host repository (topology.Host).
const Host = topology.Host

// DefaultGroupBytes is the swap group size when none is configured or profiled.
const DefaultGroupBytes = 2 << 20

// Config configures a Node.
type Config struct {
	Device     device.Backend
	Memory     *memory.Manager
	Repository *repository.Repository
	// GroupBytes is the swap group size for every link; 0 uses ProfiledGroups, else DefaultGroupBytes.
	GroupBytes uint64
	// ProfiledGroups, when set, is the group size per GPU (from ProfileGroupSize at start).
	ProfiledGroups []uint64
	// EvictUnderPressure lets a swap-in evict least recently used, unused, unpinned residencies of other
	// functions on its GPU when chunks run out (without it the swap fails with ErrNoMemory and the controller
	// chooses what to evict).
	EvictUnderPressure bool
	// Now for least-recently-used order; time.Now when nil.
	Now func() time.Time
	// Addresses, when set, is the device the memory manager was built on (NewAddresses): the Node reserves the
	// ranges of the repository's images again and restores functions from them (restore.go).
	Addresses *Addresses
	// Logger receives the restore decisions; nil discards them.
	Logger *slog.Logger
	// OnContextFault, when set, is told of every fault of a tenant's work (after the node tore the tenant's
	// context down), and OnUnhealthy of every GPU the node takes out of service. Both are called with the node's
	// lock held: they must not call the node. A tenant executor process reports them to the gpuserver (and exits
	// after a fault: on a real GPU a fault poisons every context of the process).
	OnContextFault func(gpu int, function string, err error)
	OnUnhealthy    func(gpu int, cause error)
	// OnEvict, when set, is told of every copy the node drops on its own decision (EvictUnderPressure, EvictIdle for
	// another tenant's chunks), not of those its caller asked to Evict, so that the controller that places on the
	// node's memory learns of them (docs/design.md, decision 12). Called with the node's lock held: it must not call
	// the node.
	OnEvict func(gpu int, function string, reason string)
	// ComputeGate, when set, gates the launches of functions holding a compute share (computegate.go).
	ComputeGate ComputeGate
}

// Reasons the node evicts a copy on its own (Config.OnEvict).
const (
	EvictPressure = "pressure" // a swap-in ran out of chunks (Config.EvictUnderPressure)
	EvictReclaim  = "reclaim"  // another tenant needed the chunks back (EvictIdle)
)

// Node holds the executors of every GPU and the functions' state. It is safe for concurrent use.
type Node struct {
	cfg   Config
	dev   device.Backend
	mem   *memory.Manager
	repo  *repository.Repository
	execs []*Executor

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	bg     sync.WaitGroup // swap finishers

	addrs *Addresses
	log   *slog.Logger

	// op orders the operations, mu guards the state and is never held across a wait on the device (locking.go).
	op        sync.Mutex
	mu        sync.Mutex
	settled   *sync.Cond // on mu: a function stopped moving
	operating bool       // an operation holds op (guarded by mu)

	domains map[domainKey]device.Context // each tenant's context per GPU (fault.go)
	fns     map[string]*function
	plans   map[string]*restorePlan // images from before a restart whose function has not registered yet
	images  ImageStats

	scratchDropped uint64 // bytes of request scratch given back (scratch.go)

	shares      *compute.Registry  // the gates of the functions granted a compute share (computegate.go)
	shared      map[int]*gpuChunks // chunks shared between copies, per GPU (share.go)
	sharedBytes uint64             // bytes swap-ins mapped from a chunk already on the GPU
}

// Executor is one GPU's swap machinery.
type Executor struct {
	gpu           int
	groupBytes    uint64
	copyIn        device.Stream // host-to-device swaps
	copyPeer      device.Stream // GPU-to-GPU swaps into this GPU
	zero          device.Stream // zeroing fresh segments, apart from the swaps' copies
	healthy       bool
	lastErr       error
	swaps         int64
	swapBytes     uint64
	siblingBytes  uint64 // model bytes swap-ins copied from a sibling instance's copy (siblings.go)
	contextFaults int64  // tenants' contexts torn down after a fault of their work (fault.go)

	scratchWrittenBack uint64 // bytes of scratch written back to the host from this GPU (scratch.go)
	scratchRestored    uint64 // bytes of scratch copied back into this GPU at swap-ins
}

// New starts a node's executors.
func New(cfg Config) (*Node, error) {
	if cfg.Device == nil || cfg.Memory == nil || cfg.Repository == nil {
		return nil, fmt.Errorf("%w: device, memory and repository are required", ErrInvalid)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, dev: cfg.Device, mem: cfg.Memory, repo: cfg.Repository, ctx: ctx, cancel: cancel,
		fns: map[string]*function{}, plans: map[string]*restorePlan{}, addrs: cfg.Addresses, log: cfg.Logger,
		domains: map[domainKey]device.Context{}}
	n.settled = sync.NewCond(&n.mu)
	shares, serr := compute.NewRegistry(ctx, len(cfg.Device.GPUs()), compute.Config{Clock: device.WallClock{}})
	if serr != nil {
		cancel()
		return nil, serr
	}
	n.shares = shares
	for _, g := range cfg.Device.GPUs() {
		e := &Executor{gpu: g.Index, healthy: true, groupBytes: DefaultGroupBytes}
		switch {
		case cfg.GroupBytes > 0:
			e.groupBytes = cfg.GroupBytes
		case g.Index < len(cfg.ProfiledGroups) && cfg.ProfiledGroups[g.Index] > 0:
			e.groupBytes = cfg.ProfiledGroups[g.Index]
		}
		var err error
		if e.copyIn, err = cfg.Device.NewStream(g.Index); err == nil {
			e.copyPeer, err = cfg.Device.NewStream(g.Index)
		}
		if err == nil {
			e.zero, err = cfg.Device.NewStream(g.Index)
		}
		if err != nil {
			_ = n.Close(context.Background())
			return nil, fmt.Errorf("gpu %d: %w", g.Index, err)
		}
		n.execs = append(n.execs, e)
	}
	if n.addrs != nil {
		n.parkImages(ctx)
	}
	return n, nil
}

// GPUs is the number of executors.
func (n *Node) GPUs() int { return len(n.execs) }

// GroupBytes is GPU gpu's swap group size.
func (n *Node) GroupBytes(gpu int) uint64 { return n.execs[gpu].groupBytes }

// Register adds a function (a no-op for a known one). Its image, if the repository has one from before a restart,
// is used for swap-ins; its addresses are reserved again as it allocates.
func (n *Node) Register(name string) error {
	if name == "" {
		return fmt.Errorf("%w: function name is empty", ErrInvalid)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.fns[name]; !ok {
		n.fns[name] = n.newFunctionLocked(name, n.plans[name])
		delete(n.plans, name)
	}
	return nil
}

func (n *Node) newFunctionLocked(name string, plan *restorePlan) *function {
	return &function{name: name, space: n.mem.NewAddressSpace(name), active: -1, res: map[int]*residency{},
		streams: map[int]device.Stream{}, own: map[int]bool{}, dead: map[int]bool{}, plan: plan,
		tenant: DefaultTenant(name)}
}

// Deregister evicts a function everywhere, frees its addresses and deletes its image.
func (n *Node) Deregister(ctx context.Context, name string) error {
	defer n.operate()()
	f, ok := n.fns[name]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownFunction, name)
	}
	defer n.moving(f)()
	f.captured = true // nothing to keep: evicting captures no image
	f.scratch.discard = true
	for gpu := range f.res {
		if err := n.evictLocked(ctx, f, gpu); err != nil {
			return err
		}
	}
	n.freeScratchHostLocked(f, nil)
	if err := n.dropPlanLocked(f); err != nil {
		return err
	}
	for gpu, s := range f.streams {
		if err := s.Destroy(); err != nil {
			return fmt.Errorf("function %s gpu %d: %w", name, gpu, err)
		}
	}
	delete(n.fns, name)
	err := f.space.Close()
	if n.repo.Has(name) {
		err = errors.Join(err, n.repo.Delete(name))
	}
	return err
}

func (n *Node) fn(name string) (*function, error) {
	f, ok := n.fns[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownFunction, name)
	}
	return f, nil
}

// settledFnLocked is fn once the function is not moving (waiting with mu released meanwhile).
func (n *Node) settledFnLocked(name string) (*function, error) {
	for {
		f, err := n.fn(name)
		if err != nil || f.moving == 0 {
			return f, err
		}
		n.settled.Wait()
	}
}

func (n *Node) validGPU(gpu int) error {
	if gpu < 0 || gpu >= len(n.execs) {
		return fmt.Errorf("%w: gpu %d (node has %d)", ErrInvalid, gpu, len(n.execs))
	}
	return nil
}

// Healthy reports whether GPU gpu is healthy.
func (n *Node) Healthy(gpu int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.execs[gpu].healthy
}

// MarkUnhealthy takes GPU gpu out of service: its residencies are dropped (their chunks are not trusted), and
// acquires that name no GPU go elsewhere.
func (n *Node) MarkUnhealthy(gpu int, cause error) {
	defer n.operate()()
	n.markUnhealthyLocked(gpu, cause)
}

func (n *Node) markUnhealthyLocked(gpu int, cause error) {
	if device.IsContextFault(cause) {
		n.processFaultLocked(gpu, cause)
		return
	}
	e := n.execs[gpu]
	if e.healthy && n.cfg.OnUnhealthy != nil {
		n.cfg.OnUnhealthy(gpu, cause)
	}
	e.healthy, e.lastErr = false, cause
	var unmap []memory.Segment
	for _, f := range n.fns {
		r, ok := f.res[gpu]
		if !ok {
			continue
		}
		if f.active == gpu {
			for _, seg := range f.space.Segments() {
				if r.mapped[seg.ID] {
					unmap = append(unmap, seg)
				}
			}
			f.active = -1
			n.loseScratchLocked(f, fmt.Errorf("gpu %d failed: %w", gpu, cause))
		}
		// chunks of a failed GPU are not returned to its pool: the GPU is out of service
		delete(f.res, gpu)
		f.loseLocked(fmt.Errorf("gpu %d failed: %w", gpu, cause))
	}
	n.forgetChunksLocked(gpu)
	// Nothing runs on these addresses any more (the GPU is out of service, the functions are active nowhere).
	_ = n.unlocked(func() error {
		for _, seg := range unmap {
			_ = n.mem.Unmap(seg.Ptr, seg.Size)
		}
		return nil
	})
}

// Status is a snapshot of one GPU's executor.
type Status struct {
	GPU        int      `json:"gpu"`
	Healthy    bool     `json:"healthy"`
	Error      string   `json:"error,omitempty"`
	GroupBytes uint64   `json:"group_bytes"`
	FreeBytes  uint64   `json:"free_bytes"`
	TotalBytes uint64   `json:"total_bytes"`
	Resident   []string `json:"resident"`
	Active     []string `json:"active"`
	Swaps      int64    `json:"swaps"`
	SwapBytes  uint64   `json:"swap_bytes"`
	// SiblingBytes counts the model bytes swap-ins onto this GPU copied from a sibling instance's copy on another
	// GPU (over NVLink where the node has it) instead of the host image (also in SwapBytes).
	SiblingBytes uint64 `json:"sibling_bytes,omitempty"`
	// ContextFaults counts the tenants' contexts torn down after a fault of their work; the GPU stayed in service.
	ContextFaults int64 `json:"context_faults"`
	// ScratchWrittenBack counts the bytes of scratch that functions keep (not declared per request) written back
	// to the host when their copy left this GPU; ScratchRestored the bytes copied back in at swap-ins (also in
	// SwapBytes).
	ScratchWrittenBack uint64 `json:"scratch_written_back_bytes"`
	ScratchRestored    uint64 `json:"scratch_restored_bytes"`
}

// Status describes every executor.
func (n *Node) Status() []Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Status, len(n.execs))
	cs := n.mem.ChunkSize()
	for i, e := range n.execs {
		p := n.mem.Pool(i)
		out[i] = Status{GPU: i, Healthy: e.healthy, GroupBytes: e.groupBytes, FreeBytes: uint64(p.Free()) * cs,
			TotalBytes: uint64(p.Total()) * cs, Swaps: e.swaps, SwapBytes: e.swapBytes, SiblingBytes: e.siblingBytes, ContextFaults: e.contextFaults,
			ScratchWrittenBack: e.scratchWrittenBack, ScratchRestored: e.scratchRestored}
		if e.lastErr != nil {
			out[i].Error = e.lastErr.Error()
		}
	}
	for name, f := range n.fns {
		for gpu := range f.res {
			out[gpu].Resident = append(out[gpu].Resident, name)
		}
		if f.active >= 0 {
			out[f.active].Active = append(out[f.active].Active, name)
		}
	}
	for i := range out {
		sort.Strings(out[i].Resident)
		sort.Strings(out[i].Active)
	}
	return out
}

// Close waits for running swaps (until ctx ends), drops every function's copies (unmapped, chunks back to the
// pools, addresses freed; the images stay in the repository) and destroys the executors' streams.
func (n *Node) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { n.bg.Wait(); close(done) }()
	var errs []error
	select {
	case <-done:
	case <-ctx.Done():
		n.cancel()
		<-done
		errs = append(errs, fmt.Errorf("executor: close: %w", ctx.Err()))
	}
	n.cancel()
	defer n.operate()()
	for _, f := range n.functionsLocked() {
		errs = append(errs, n.closeFunctionLocked(ctx, f)...)
	}
	for name, p := range n.plans {
		errs = append(errs, n.dropPlanLocked(&function{plan: p}))
		delete(n.plans, name)
	}
	for k, c := range n.domains {
		errs = append(errs, c.Destroy())
		delete(n.domains, k)
	}
	for _, e := range n.execs {
		for _, s := range []device.Stream{e.copyIn, e.copyPeer, e.zero} {
			if s != nil {
				errs = append(errs, s.Destroy())
			}
		}
	}
	return errors.Join(errs...)
}

// closeFunctionLocked waits for f's work, then drops its copies (Close).
func (n *Node) closeFunctionLocked(ctx context.Context, f *function) []error {
	defer n.moving(f)()
	var errs []error
	for gpu, s := range f.streams {
		if n.execs[gpu].healthy { // a failed GPU's errors were reported when it failed
			errs = append(errs, n.unlocked(func() error { return s.Synchronize(ctx) }))
		}
		errs = append(errs, s.Destroy())
	}
	f.streams = map[int]device.Stream{}
	for gpu, r := range f.res { // the images stay in the repository
		errs = append(errs, n.waitReadyLocked(ctx, f, r), n.unmapLocked(f, r))
		if n.execs[gpu].healthy {
			for _, chunks := range r.chunks {
				errs = append(errs, n.putChunksLocked(gpu, chunks))
			}
		}
	}
	f.res, f.active = map[int]*residency{}, -1
	n.freeScratchHostLocked(f, nil)
	return append(errs, n.dropPlanLocked(f), f.space.Close())
}

// functionsLocked is a snapshot of the registered functions, for an operation that releases mu as it goes through
// them.
func (n *Node) functionsLocked() []*function {
	fns := make([]*function, 0, len(n.fns))
	for _, f := range n.fns {
		fns = append(fns, f)
	}
	return fns
}
