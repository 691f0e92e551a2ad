package controller

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/queueing"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Errors of the controller.
var (
	ErrInvalidConfig = errors.New("invalid controller config")
	ErrDuplicate     = errors.New("duplicate request id")
	ErrUnknownReq    = errors.New("unknown request")
	ErrUnknownGPU    = errors.New("unknown gpu")
)

// Swap kinds of a Decision.
const (
	SwapNone   = "none"
	SwapNVLink = "nvlink"
	SwapPCIe   = "pcie"
	SwapCold   = "cold" // keep-alive: an instance is started
)

// Defaults of Config.
const (
	DefaultHeavyRatio    = 0.3
	DefaultContextBytes  = 1450 << 20
	DefaultColdStart     = 3 * time.Second
	DefaultExecSeed      = 10 * time.Millisecond
	defaultColdBandwidth = 1e9
)

// Config configures a Controller.
type Config struct {
	// Policy by name; default faas-gpu.
	Policy Policy
	// Node is the topology the controller places onto; it must be valid.
	Node topology.Node
	// Seed of the random placement policy.
	Seed uint64
	// Margin on predictions in slack (queueing), default 0.4.
	Margin float64
	// HeavyRatio: a model is heavy when its predicted PCIe swap time exceeds this fraction of its execution time.
	HeavyRatio float64
	// MaxInFlight bounds a function's concurrently bound requests (one per function instance); 0 is unlimited.
	MaxInFlight int
	// ContextBytes is the GPU memory of a function's own CUDA context (native and keep-alive only).
	ContextBytes uint64
	// ColdStart is the fixed part of a keep-alive cold start; the model then loads at 1 GB/s.
	ColdStart time.Duration
	// Prewarm places every function on every GPU where it fits when it registers (tests and simulations that
	// start from a warm node).
	Prewarm bool
	// ShedEvery is how often the overload control (faas-gpu policy) re-decides which functions it sheds; 0
	// means 2 s. It is also the Retry-After of the requests it refuses.
	ShedEvery time.Duration
	// PartialResidency keeps an evicted model's blocks on its GPU while the memory is not needed, so that a
	// later swap-in copies only the missing blocks (Tangram); eviction then frees only the bytes a placement
	// needs, from the blocks cheapest to bring back first (Eviction.Keep, Decision.Bytes). The simulator models
	// it; the executors' data plane drops whole copies, so the gpuserver leaves it off.
	PartialResidency bool
	// Overload sets the overload control of the policies that have one (faas-gpu): auto (the zero value), off,
	// or an explicit target.
	Overload Overload
	// SiblingSources makes a copy of another instance of the same function (pool.InstanceKey) a swap source over
	// NVLink: the instances' images hold the same weights (the executors copy each segment whose content matches
	// from the sibling's copy, the rest from host), so a second copy of a hot model comes from the first, as in
	// Torpor. The gpuserver and the simulator set it.
	SiblingSources bool
	// Admission is the admission rule, for every policy (AdmissionNone, the default, or AdmissionDeadline).
	Admission Admission
	// Alpha, when > 0, fixes the Torpor grouping's alpha (queueing.Config.Alpha) instead of re-tuning it.
	Alpha float64
	// Sharing lets functions with compute shares co-run on a GPU (corun.go); off by default.
	Sharing Sharing
	// ChunkBytes is the data plane's allocation unit (the memory manager's chunk): a copy takes its quota rounded
	// up to whole chunks there, so the controller plans each copy's footprint the same way, and the data plane
	// never runs out of chunks where the controller saw room (its own evictions, EvictUnderPressure, are then for
	// what the controller cannot see). 0: copies take their quota to the byte (no data plane).
	ChunkBytes uint64
}

// Function is what the controller knows of a registered function.
type Function struct {
	pool.FunctionSpec
	// ModelBytes is what a swap moves; 0 means MemoryBytes. It must not exceed MemoryBytes (the quota).
	ModelBytes uint64
	// ExecSeed seeds the execution-time predictor; 0 means 10 ms.
	ExecSeed time.Duration
	// Pin (static policy) lists the GPUs the function's model stays resident on (those with room); empty: the
	// least used GPU with room.
	Pin []int
	// Cold registers the function without a copy even under Config.Prewarm: an instance that starts while the
	// node runs (a simulated autoscaler's) has nothing on a GPU yet.
	Cold bool
}

// Eviction is one model dropped from one GPU.
type Eviction struct {
	Function string `json:"function"`
	GPU      int    `json:"gpu"`
	// Keep is, with partial residency, how many bytes of the model stay on the GPU (its first blocks, which a
	// pipelined swap-in needs first); 0 drops the whole copy.
	Keep uint64 `json:"keep,omitempty"`
}

// Decision binds one request to a GPU, says how its model gets there, and which models leave first.
type Decision struct {
	Request  uint64
	Function string
	Arrival  time.Time
	GPU      int
	// Swap is SwapNone, SwapNVLink, SwapPCIe or SwapCold.
	Swap string
	// Source is topology.Host or the GPU the model is copied from.
	Source int
	// SourceFunction is, for an NVLink swap from a sibling instance's copy (Config.SiblingSources), the instance
	// whose copy on Source is read; "" when it is the function's own copy (or the host).
	SourceFunction string
	// Bytes moved by the swap.
	Bytes uint64
	// Evict is applied before the swap.
	Evict []Eviction
	// PredictedSwap and PredictedExec are the controller's predictions at the decision.
	PredictedSwap time.Duration
	PredictedExec time.Duration
}

// sourceName is the function whose copy an NVLink swap reads: a sibling instance's, or the function's own.
func (d Decision) sourceName() string { return cmp.Or(d.SourceFunction, d.Function) }

// Path is the transfer path of a swapping decision.
func (d Decision) Path() topology.Path { return topology.Path{From: d.Source, To: d.GPU} }

type residency struct {
	lastUsed time.Time
	pinned   int // in-flight swaps reading from this copy
	loading  bool
}

type gpuState struct {
	index     int
	capacity  uint64
	used      uint64
	resident  map[string]*residency
	busy      uint64          // request id bound, 0 when idle
	busyUntil time.Time       // predicted end of the binding (swap and execution)
	loading   map[string]bool // functions currently swapping in from host here (value: heavy)
	busyTime  time.Duration
	busySince time.Time
	unhealthy bool // out of service (SetHealthy): never placed on, nothing resident
	// partial holds the blocks left of evicted models (partial residency): not runnable, counted in used, and a
	// swap-in of the model copies only what is missing.
	partial map[string]*partialCopy
}

type partialCopy struct {
	bytes    uint64
	lastUsed time.Time
}

type fnState struct {
	Function
	family    string // the function an instance belongs to (pool.SplitInstance), its own name otherwise
	footprint uint64
	exec      Predictor
	swap      map[string]*Predictor // by kind
	replicas  []int
	inFlight  int
	pinnedGPU int // native: -1 when it cannot run
	// overload control
	hold     Predictor // how long a request holds a GPU (swap and execution)
	arrivals int       // requests submitted in the current interval
	rate     float64   // arrivals per second, weighted over intervals
	shed     bool
	ovActive bool   // listed in the overload control's active functions
	episode  uint64 // how many times it was shed anew
	refused  int64  // requests the overload control refused
}

type reqState struct {
	id        uint64
	function  string
	arrival   time.Time
	deadline  time.Time
	bound     bool
	boundAt   time.Time
	decision  Decision
	swapping  bool
	swapStart time.Time // when its transfer started
	broken    bool      // a GPU of its binding (target, or the source of its swap) failed while it was bound
	released  bool      // its NVLink source copy is no longer pinned by it (the source GPU failed)
	// initialisation: the function's calls outside any request (pool.WithInitialisation), bound like a request
	// but counted in no served or on-time figure and observed by no predictor
	initialisation bool
	// unserved: a binding whose acquire failed after the pool bound it (pool.WithUnserved): it served nothing, so
	// it is counted in no served or on-time figure and observed by no predictor
	unserved bool
}

// Controller decides, for a node's GPUs, which request runs next, where, how its model gets there and what is
// evicted. It has no I/O and no clock: every call takes now. It is not safe for concurrent use.
type Controller struct {
	cfg    Config
	tr     traits
	node   topology.Node
	q      *queueing.Queue
	gpus   []*gpuState
	fns    map[string]*fnState
	family map[string][]string // function -> its registered instances' names (with itself when registered)
	reqs   map[uint64]*reqState
	rng    *rand.Rand
	counts Counters
	// links models the transfers in progress (keyed by request id) to predict their ends and new transfers.
	links *topology.Transfers
	ov    overload
	co    coState // co-runners (corun.go)
}

// Counters are totals since the controller started.
type Counters struct {
	Decisions  int64
	SwapsNone  int64
	SwapsNV    int64
	SwapsPCIe  int64
	ColdStarts int64
	Evictions  int64
	Rejected   int64
	// Shed counts requests refused by the overload control.
	Shed int64
	// Refused counts requests refused by the admission rule (at Submit or dropped from the queue).
	Refused int64
	// SwappedBytes is the total of the bytes swaps moved onto GPUs.
	SwappedBytes uint64
	// DataPlaneEvictions counts the copies the data plane dropped on its own (Evicted), by reason
	// (executor.EvictPressure, executor.EvictReclaim); Evictions counts those the controller decided.
	DataPlaneEvictions map[string]int64
}

// New returns a controller with no functions.
func New(cfg Config) (*Controller, error) {
	if cfg.Policy == "" {
		cfg.Policy = PolicyFaaSGPU
	}
	if _, err := ParsePolicy(string(cfg.Policy)); err != nil {
		return nil, err
	}
	if err := cfg.Node.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	cfg.HeavyRatio = cmp.Or(cfg.HeavyRatio, DefaultHeavyRatio)
	if cfg.HeavyRatio < 0 {
		return nil, fmt.Errorf("%w: heavy ratio must be > 0", ErrInvalidConfig)
	}
	if cfg.MaxInFlight < 0 {
		return nil, fmt.Errorf("%w: max in flight must be >= 0", ErrInvalidConfig)
	}
	cfg.ContextBytes = cmp.Or(cfg.ContextBytes, DefaultContextBytes)
	cfg.ColdStart = cmp.Or(cfg.ColdStart, DefaultColdStart)
	cfg.ShedEvery = cmp.Or(cfg.ShedEvery, DefaultShedEvery)
	if cfg.ShedEvery < 0 {
		return nil, fmt.Errorf("%w: shed interval must be > 0", ErrInvalidConfig)
	}
	if err := cfg.Overload.validate(); err != nil {
		return nil, err
	}
	if err := cfg.Sharing.validate(); err != nil {
		return nil, err
	}
	if cfg.Admission == "" {
		cfg.Admission = AdmissionNone
	}
	if _, err := ParseAdmission(string(cfg.Admission)); err != nil {
		return nil, err
	}
	if cfg.Overload.Mode == "" {
		cfg.Overload.Mode = OverloadAuto
	}
	tr := cfg.Policy.traits()
	if cfg.Overload.Mode == OverloadOff {
		tr.shed = false
	}
	q, err := queueing.New(queueing.Config{Order: tr.order, Margin: cfg.Margin, RescueShare: tr.rescueShare,
		SpareLast: tr.spareLast, Alpha: cfg.Alpha})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c := &Controller{cfg: cfg, tr: tr, node: cfg.Node.Clone(), q: q, fns: map[string]*fnState{},
		family: map[string][]string{},
		reqs:   map[uint64]*reqState{}, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	c.links = topology.NewTransfers(&c.node)
	c.ov.target, c.ov.auto = DefaultShedTarget, cfg.Overload.Mode == OverloadAuto
	if cfg.Overload.Mode == OverloadTarget {
		c.ov.target = cfg.Overload.Target
	}
	for i, g := range c.node.GPUs {
		c.gpus = append(c.gpus, &gpuState{index: i, capacity: g.MemoryBytes, resident: map[string]*residency{},
			loading: map[string]bool{}, partial: map[string]*partialCopy{}})
	}
	return c, nil
}

// Policy is the controller's policy.
func (c *Controller) Policy() Policy { return c.cfg.Policy }

// Node is the controller's topology.
func (c *Controller) Node() *topology.Node { return &c.node }

// Counters returns the totals so far.
func (c *Controller) Counters() Counters { return c.counts }

// Register adds or replaces a function. It fails with pool.ErrInvalidSpec for a bad spec and pool.ErrTooLarge
// when the function's footprint fits on no GPU.
func (c *Controller) Register(now time.Time, f Function) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if f.ModelBytes == 0 {
		f.ModelBytes = f.MemoryBytes
	}
	if f.ModelBytes > f.MemoryBytes {
		return fmt.Errorf("%w: model of %d bytes exceeds the memory quota of %d bytes", pool.ErrInvalidSpec,
			f.ModelBytes, f.MemoryBytes)
	}
	if f.ExecSeed <= 0 {
		f.ExecSeed = DefaultExecSeed
	}
	footprint := f.MemoryBytes
	if c.tr.ownContext {
		footprint += c.cfg.ContextBytes
	}
	if u := c.cfg.ChunkBytes; u > 0 {
		footprint = (footprint + u - 1) / u * u
	}
	if footprint > c.node.MaxGPUMemory() {
		return fmt.Errorf("%w: %q needs %d bytes, the largest GPU has %d", pool.ErrTooLarge, f.Name, footprint,
			c.node.MaxGPUMemory())
	}
	if err := c.q.SetFunction(f.Name, f.SLO, f.Percentile); err != nil {
		return fmt.Errorf("%w: %w", pool.ErrInvalidSpec, err)
	}
	if old := c.fns[f.Name]; old != nil {
		c.dropResidency(old)
	}
	fam, _ := pool.SplitInstance(f.Name)
	if err := c.q.SetFamily(f.Name, fam); err != nil { // one SLO record over the function's instances
		return fmt.Errorf("%w: %w", pool.ErrInvalidSpec, err)
	}
	fs := &fnState{Function: f, family: fam, footprint: footprint, exec: NewPredictor(f.ExecSeed),
		swap: map[string]*Predictor{}, pinnedGPU: -1}
	for _, kind := range []string{SwapPCIe, SwapNVLink} {
		fs.swap[kind] = c.seedSwap(fs, kind)
	}
	cold := NewPredictor(c.coldStart(fs))
	fs.swap[SwapCold] = &cold
	fs.hold = NewPredictor(c.predictCost(fs))
	if c.fns[f.Name] == nil {
		c.family[fam] = append(c.family[fam], f.Name)
	}
	c.fns[f.Name] = fs
	switch {
	case c.tr.place == placePinned:
		c.pin(now, fs)
	case c.tr.place == placeStatic:
		for _, i := range fs.Pin {
			if i >= 0 && i < len(c.gpus) && !c.gpus[i].unhealthy && c.gpus[i].capacity-c.gpus[i].used >= footprint {
				c.addResident(fs, c.gpus[i], now)
			}
		}
		if len(fs.replicas) == 0 {
			c.pin(now, fs)
		}
	case c.cfg.Prewarm && !f.Cold:
		for _, g := range c.gpus {
			if !g.unhealthy && g.capacity-g.used >= footprint {
				c.addResident(fs, g, now)
			}
		}
	}
	return nil
}

// pin is native binding: fs onto the GPU fs.Pin names, else the least-used healthy GPU that still has room.
func (c *Controller) pin(now time.Time, fs *fnState) {
	best := -1
	for _, g := range c.gpus {
		if !g.unhealthy && g.capacity-g.used >= fs.footprint && (best < 0 || g.used < c.gpus[best].used) {
			best = g.index
		}
	}
	if best >= 0 {
		fs.pinnedGPU = best
		c.addResident(fs, c.gpus[best], now)
	}
}

func (c *Controller) seedSwap(fs *fnState, kind string) *Predictor {
	var d time.Duration
	switch kind {
	case SwapPCIe:
		d = c.node.TransferTime(fs.ModelBytes, topology.HostPath(0), nil)
	case SwapNVLink:
		best := 0.0
		for i := range c.gpus {
			for j := range c.gpus {
				best = max(best, c.node.NVLink(i, j))
			}
		}
		if best == 0 {
			d = c.node.TransferTime(fs.ModelBytes, topology.HostPath(0), nil)
		} else {
			d = time.Duration((c.node.TransferLatencySec + float64(fs.ModelBytes)/best) * float64(time.Second))
		}
	}
	p := NewPredictor(d)
	return &p
}

func (c *Controller) coldStart(fs *fnState) time.Duration {
	return c.cfg.ColdStart + time.Duration(float64(fs.ModelBytes)/defaultColdBandwidth*float64(time.Second))
}

// Deregister removes a function; its waiting requests are returned (they will never be bound).
func (c *Controller) Deregister(name string) ([]uint64, error) {
	fs := c.fns[name]
	if fs == nil {
		return nil, fmt.Errorf("%w: %q", pool.ErrUnknownFunction, name)
	}
	dropped := c.q.RemoveFunction(name)
	ids := make([]uint64, 0, len(dropped))
	for _, r := range dropped {
		ids = append(ids, r.ID)
		delete(c.reqs, r.ID)
	}
	c.dropResidency(fs)
	for _, gi := range slices.Clone(fs.replicas) { // a copy still read by a sibling's swap, or loading: gone too
		c.removeResident(fs, c.gpus[gi]) // (left resident, it named a function no longer known: a nil victim)
	}
	delete(c.fns, name)
	if i := slices.Index(c.family[fs.family], name); i >= 0 {
		c.family[fs.family] = slices.Delete(c.family[fs.family], i, i+1)
	}
	if len(c.family[fs.family]) == 0 {
		delete(c.family, fs.family)
	}
	return ids, nil
}

func (c *Controller) dropResidency(fs *fnState) {
	for _, gi := range slices.Clone(fs.replicas) {
		if r := c.gpus[gi].resident[fs.Name]; r != nil && r.pinned == 0 && !r.loading {
			c.removeResident(fs, c.gpus[gi])
		}
	}
	for _, g := range c.gpus {
		if g.partial[fs.Name] != nil {
			c.evict(fs, g, 0)
		}
	}
}

// Submit queues a request. It fails with pool.ErrUnknownFunction, ErrDuplicate, or pool.ErrTooLarge when the
// function can never run under this policy (native: it got no GPU).
func (c *Controller) Submit(now time.Time, id uint64, function string) error {
	return c.submit(now, id, function, false)
}

// SubmitInitialisation queues a function's initialisation (its CUDA calls outside any request, pool.
// WithInitialisation): as Submit, but neither the overload control nor the admission rule refuses it or drops it
// from the queue, since it is no request with a deadline and a function refused its initialisation never starts;
// it counts in no served or on-time figure (markInitialisation).
func (c *Controller) SubmitInitialisation(now time.Time, id uint64, function string) error {
	if err := c.submit(now, id, function, true); err != nil {
		return err
	}
	c.markInitialisation(id)
	return nil
}

func (c *Controller) submit(now time.Time, id uint64, function string, initialisation bool) error {
	fs := c.fns[function]
	if fs == nil {
		return fmt.Errorf("%w: %q", pool.ErrUnknownFunction, function)
	}
	if _, dup := c.reqs[id]; dup {
		return fmt.Errorf("%w: %d", ErrDuplicate, id)
	}
	if c.tr.place == placePinned && fs.pinnedGPU < 0 || c.tr.place == placeStatic && len(fs.replicas) == 0 {
		c.counts.Rejected++
		return fmt.Errorf("%w: %q has no GPU under native binding (memory is taken by earlier functions)",
			pool.ErrTooLarge, function)
	}
	c.arrived(fs)
	c.maybeDecideShed(now)
	if !initialisation {
		if err := c.admitShed(now, fs); err != nil {
			return err
		}
		if err := c.admit(now, fs); err != nil {
			return err
		}
	}
	r := &reqState{id: id, function: function, arrival: now}
	if fs.SLO > 0 {
		r.deadline = now.Add(fs.SLO)
	}
	if err := c.q.Push(queueing.Request{ID: id, Function: function, Arrival: now, Cost: c.predictCost(fs)}); err != nil {
		return err
	}
	c.reqs[id] = r
	return nil
}

func (c *Controller) predictCost(fs *fnState) time.Duration {
	cost := fs.exec.Mean()
	if len(fs.replicas) == 0 {
		if c.tr.place == placeInstance {
			cost += fs.swap[SwapCold].Mean()
		} else {
			cost += fs.swap[SwapPCIe].Mean()
		}
	}
	return cost
}

// Cancel withdraws a waiting request; it reports whether it was waiting (a bound request is ended by Complete).
func (c *Controller) Cancel(id uint64) bool {
	r := c.reqs[id]
	if r == nil || r.bound {
		return false
	}
	c.q.Remove(id)
	delete(c.reqs, id)
	return true
}

// Waiting is the number of queued requests.
func (c *Controller) Waiting() int { return c.q.Len() }

// ActiveTransfers lists the paths of the swaps in progress, in the order they started.
func (c *Controller) ActiveTransfers() []topology.Path { return c.links.Paths() }

// maxBlockedPerDispatch bounds how many functions one Dispatch passes over because their requests cannot be
// placed now (keep-alive instances on busy GPUs), so a round stays cheap under a deep backlog.
const maxBlockedPerDispatch = 64

// Dispatch binds waiting requests to idle GPUs, in queue order, and returns the decisions; the caller carries
// each out (evictions, then the swap, then execution) and reports SwapDone and Complete.
func (c *Controller) Dispatch(now time.Time) []Decision {
	c.maybeDecideShed(now)
	c.expireShed(now)
	c.expireAdmitted(now)
	var out []Decision
	var blocked map[string]bool
	eligible := func(f string) bool {
		fs := c.fns[f]
		if c.cfg.MaxInFlight > 0 && fs.inFlight >= c.cfg.MaxInFlight {
			return false
		}
		return !blocked[f]
	}
	for c.q.Len() > 0 && c.anyIdle() {
		r, ok := c.q.Peek(now, eligible)
		if !ok {
			break
		}
		fs := c.fns[r.Function]
		d, ok := c.place(now, fs, c.reqs[r.ID])
		if !ok {
			if blocked == nil {
				blocked = map[string]bool{}
			}
			blocked[r.Function] = true
			if len(blocked) >= maxBlockedPerDispatch {
				break
			}
			continue
		}
		c.q.Remove(r.ID)
		d.Request, d.Function, d.Arrival = r.ID, r.Function, r.Arrival
		c.apply(now, fs, &d)
		out = append(out, d)
	}
	return append(out, c.dispatchCoRunners(now)...)
}

func (c *Controller) anyIdle() bool {
	for _, g := range c.gpus {
		if g.busy == 0 && !g.unhealthy {
			return true
		}
	}
	return false
}

// apply commits a decision to the model of the node.
func (c *Controller) apply(now time.Time, fs *fnState, d *Decision) {
	g := c.gpus[d.GPU]
	for _, e := range d.Evict {
		c.evict(c.fns[e.Function], c.gpus[e.GPU], e.Keep)
		c.counts.Evictions++
	}
	req := c.reqs[d.Request]
	req.bound, req.boundAt = true, now
	g.busy = d.Request
	g.busySince = now
	fs.inFlight++
	d.PredictedExec = fs.exec.Mean()
	c.counts.Decisions++
	switch d.Swap {
	case SwapNone:
		c.counts.SwapsNone++
		g.resident[fs.Name].lastUsed = now
		g.busyUntil = now.Add(d.PredictedExec)
		req.decision = *d
		return
	case SwapNVLink:
		c.counts.SwapsNV++
		c.gpus[d.Source].resident[d.sourceName()].pinned++
	case SwapPCIe:
		c.counts.SwapsPCIe++
		g.loading[fs.Name] = c.heavy(fs)
	case SwapCold:
		c.counts.ColdStarts++
	}
	d.Bytes = c.missing(fs, g)
	c.counts.SwappedBytes += d.Bytes
	d.PredictedSwap = c.scaleSwap(fs, fs.swap[d.Swap].Mean(), d.Bytes)
	if d.Swap != SwapCold {
		if c.tr.deadlineAware {
			d.PredictedSwap = c.swapTime(fs, d.Swap, d.Path(), d.Bytes, now, now)
		}
		c.links.Start(now, d.Request, d.Path(), d.Bytes)
		req.swapStart = now
	}
	g.busyUntil = now.Add(d.PredictedSwap + d.PredictedExec)
	c.addResident(fs, g, now)
	g.resident[fs.Name].loading = true
	req.swapping = true
	req.decision = *d
}

// SwapDone reports that the swap of request id finished after took (the time it added to the request); the copy
// on the target becomes a possible source and the source copy is unpinned.
func (c *Controller) SwapDone(now time.Time, id uint64, took time.Duration) error {
	r := c.reqs[id]
	if r == nil || !r.swapping {
		return fmt.Errorf("%w: %d is not swapping", ErrUnknownReq, id)
	}
	r.swapping = false
	d := r.decision
	fs := c.fns[d.Function]
	g := c.gpus[d.GPU]
	if res := g.resident[d.Function]; res != nil {
		res.loading = false
		if r.broken && fs != nil { // its source failed under the copy: what arrived is incomplete
			c.removeResident(fs, g)
		}
	}
	delete(g.loading, d.Function)
	ran := now.Sub(r.swapStart) // how long its transfer ran, contended or not
	if d.Swap == SwapCold || !c.links.End(now, id) {
		ran = 0
	}
	if d.Swap == SwapNVLink && !r.released {
		r.released = true
		if src := c.gpus[d.Source].resident[d.sourceName()]; src != nil {
			src.pinned--
		}
	}
	if fs != nil && !r.broken { // a swap cut short by a GPU failure teaches nothing
		// Deadline-aware policies learn the swap time a transfer adds alone: what contention stretched the transfer
		// by beyond its time alone is on the request's critical path, so it is taken off here and predicted again
		// from the transfers in progress (swapTime).
		if c.tr.deadlineAware && ran > 0 {
			took -= max(0, ran-c.node.TransferTime(d.Bytes, d.Path(), nil))
		}
		if d.Bytes > 0 && d.Bytes < fs.ModelBytes { // a partial swap: learn the whole model's time
			took = time.Duration(float64(took) * float64(fs.ModelBytes) / float64(d.Bytes))
		}
		fs.swap[d.Swap].Observe(max(0, took))
	}
	return nil
}

// markInitialisation marks submitted request id as a function's initialisation (pool.WithInitialisation): Complete
// counts it in no served or on-time figure and feeds no predictor with it.
func (c *Controller) markInitialisation(id uint64) {
	if r := c.reqs[id]; r != nil {
		r.initialisation = true
	}
}

// markUnserved marks bound request id as one whose acquire failed after it was bound (pool.WithUnserved):
// Complete counts it in no served or on-time figure and feeds no predictor with it.
func (c *Controller) markUnserved(id uint64) {
	if r := c.reqs[id]; r != nil {
		r.unserved = true
	}
}

// Complete ends request id after it executed for exec (without the swap); it frees the GPU and feeds the SLO
// bookkeeping with the latency from arrival to now. It returns whether the request met its deadline. A request
// whose GPU failed while it was bound (SetHealthy) is ended all the same, counted late, teaches the predictors
// nothing, and the error wraps pool.ErrGPUUnhealthy: its work was lost.
func (c *Controller) Complete(now time.Time, id uint64, exec time.Duration) (bool, error) {
	r := c.reqs[id]
	if r == nil || !r.bound {
		return false, fmt.Errorf("%w: %d is not bound", ErrUnknownReq, id)
	}
	if r.swapping {
		if err := c.SwapDone(now, id, now.Sub(r.arrival)-exec); err != nil {
			return false, err
		}
	}
	delete(c.reqs, id)
	d := r.decision
	g := c.gpus[d.GPU]
	coRan := c.unbind(now, g, id)
	onTime := !r.broken && (r.deadline.IsZero() || !now.After(r.deadline))
	if fs := c.fns[d.Function]; fs != nil {
		fs.inFlight--
		if !r.broken && !r.initialisation && !r.unserved {
			c.observeExec(fs, coRan, exec)
			fs.hold.Observe(now.Sub(r.boundAt))
			c.observeShed(fs, onTime, r.arrival)
		}
		if res := g.resident[d.Function]; res != nil {
			res.lastUsed = now
		}
		if !r.initialisation && !r.unserved {
			c.q.Observe(d.Function, onTime, now.Sub(r.arrival))
		}
	}
	if r.broken {
		return false, fmt.Errorf("%w: gpu %d failed while request %d of %q was bound to it", pool.ErrGPUUnhealthy,
			d.GPU, id, d.Function)
	}
	return onTime, nil
}

// Evicted tells the controller that the data plane dropped function's copy on gpu on its own (reason: why, e.g.
// executor.EvictPressure when a swap-in ran out of chunks, executor.EvictReclaim when another tenant needed them
// back): the copy is forgotten (it is neither a placement target nor a swap source any more, and its memory is free)
// and the eviction is counted, so that the pool's status, /metrics and the simulator count the same evictions
// (docs/design.md, decision 12). A copy the controller still sees loading is kept (its swap ends it); an unknown
// function or copy is counted all the same. It reports whether a copy was forgotten.
func (c *Controller) Evicted(function string, gpu int, reason string) bool {
	if c.counts.DataPlaneEvictions == nil {
		c.counts.DataPlaneEvictions = map[string]int64{}
	}
	c.counts.DataPlaneEvictions[reason]++
	fs := c.fns[function]
	if fs == nil || gpu < 0 || gpu >= len(c.gpus) {
		return false
	}
	g := c.gpus[gpu]
	if r := g.resident[function]; r != nil && !r.loading {
		c.removeResident(fs, g)
		return true
	}
	if g.partial[function] != nil {
		c.evict(fs, g, 0)
		return true
	}
	return false
}

// BusyTime is how long each GPU has been bound so far (bindings still open count up to now).
func (c *Controller) BusyTime(now time.Time) []time.Duration {
	out := make([]time.Duration, len(c.gpus))
	for i, g := range c.gpus {
		out[i] = g.busyTime
		if g.busy != 0 {
			out[i] += now.Sub(g.busySince)
		}
	}
	return out
}

func (c *Controller) addResident(fs *fnState, g *gpuState, now time.Time) {
	if _, ok := g.resident[fs.Name]; ok {
		return
	}
	if pc := g.partial[fs.Name]; pc != nil { // the blocks kept become part of the full copy
		g.used -= pc.bytes
		delete(g.partial, fs.Name)
	}
	g.resident[fs.Name] = &residency{lastUsed: now}
	g.used += fs.footprint
	fs.replicas = append(fs.replicas, g.index)
}

func (c *Controller) removeResident(fs *fnState, g *gpuState) {
	if _, ok := g.resident[fs.Name]; !ok {
		return
	}
	delete(g.resident, fs.Name)
	g.used -= fs.footprint
	if i := slices.Index(fs.replicas, g.index); i >= 0 {
		fs.replicas = slices.Delete(fs.replicas, i, i+1)
	}
}

// evict drops fs's copy on g (full or partial) down to keep bytes of its model.
func (c *Controller) evict(fs *fnState, g *gpuState, keep uint64) {
	if r := g.resident[fs.Name]; r != nil {
		last := r.lastUsed
		c.removeResident(fs, g)
		if keep > 0 {
			keep = min(keep, fs.ModelBytes)
			g.partial[fs.Name] = &partialCopy{bytes: keep, lastUsed: last}
			g.used += keep
		}
		return
	}
	if pc := g.partial[fs.Name]; pc != nil {
		keep = min(keep, pc.bytes)
		g.used -= pc.bytes - keep
		pc.bytes = keep
		if keep == 0 {
			delete(g.partial, fs.Name)
		}
	}
}

// dropPartials forgets every partial copy on g.
func (c *Controller) dropPartials(g *gpuState) {
	for name, pc := range g.partial {
		g.used -= pc.bytes
		delete(g.partial, name)
	}
}

// missing is how many bytes of fs's model a swap into g moves: all of it, less the blocks a partial copy kept.
func (c *Controller) missing(fs *fnState, g *gpuState) uint64 {
	if pc := g.partial[fs.Name]; pc != nil {
		return fs.ModelBytes - min(pc.bytes, fs.ModelBytes)
	}
	return fs.ModelBytes
}

// scaleSwap scales a swap time learned for the whole model to a swap of bytes of it.
func (c *Controller) scaleSwap(fs *fnState, d time.Duration, bytes uint64) time.Duration {
	if bytes >= fs.ModelBytes || fs.ModelBytes == 0 {
		return d
	}
	return time.Duration(float64(d) * float64(bytes) / float64(fs.ModelBytes))
}

// heavy: swapping over PCIe slows the model's request noticeably (predicted swap time against execution time).
func (c *Controller) heavy(fs *fnState) bool {
	return fs.swap[SwapPCIe].Mean().Seconds() > c.cfg.HeavyRatio*fs.exec.Mean().Seconds()
}
