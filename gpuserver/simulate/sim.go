package simulate

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// maxMinutes bounds a run's length (a week).
const maxMinutes = 7 * 24 * 60

// Defaults of Config.
const (
	DefaultSLO          = 100 * time.Millisecond
	DefaultMemoryFactor = 1.25
)

// Config is one simulation run.
type Config struct {
	Trace  *Trace
	Models []Model
	// Functions is how many functions to build: rows of the trace in order, then rows sampled with replacement and
	// shifted by a random whole number of minutes. Models are assigned round-robin, or drawn per seed (Assign).
	Functions int
	// Assign is how functions get their models: AssignRoundRobin (the zero value: function i runs model i mod
	// the models) or AssignSeeded (each function's model drawn uniformly from Seed, so that which function runs
	// the heaviest model changes with the seed).
	Assign string
	// ArrivalCV, when > 0, draws each function's arrivals as a renewal process with Gamma inter-arrival times of
	// this coefficient of variation (1: Poisson; above 1: bursty) whose rate follows the trace's per-minute counts
	// (the expected count of each minute is the trace's); 0 spreads each minute's exact count as a Poisson
	// process within the minute.
	ArrivalCV float64
	// Admission is the admission rule every policy may run with (controller.Config.Admission); empty: none.
	Admission controller.Admission
	// Alpha, when > 0, fixes the Torpor grouping's alpha (controller.Config.Alpha; Torpor's node simulator: 0.01).
	Alpha float64
	// RemotedTimes charges every policy the late-binding policies' (remoted) execution times, native and static
	// ones included, so that a comparison is about scheduling and not about the execution times' source.
	RemotedTimes bool
	// HoldOverhead is added to every remoted execution time: what a binding is held beyond its kernel on the
	// product, the function process's acquire and release round trips and CUDA calls (holdoverhead.go,
	// ProductHoldOverhead). 0: the kernel's time only.
	HoldOverhead time.Duration
	Node         topology.Node
	// Minutes of the trace to replay; beyond the trace's length it repeats (at most a week).
	Minutes int
	// StartMinute is the trace's minute the replay starts at (0: its first), e.g. 60 for its second hour.
	StartMinute int
	Policy      controller.Policy
	Seed        uint64
	// DefaultSLO applies to models whose profile gives none; DefaultSLO 0 means 100 ms.
	DefaultSLO time.Duration
	// MemoryFactor: a function's GPU memory quota is its weights times this (activations and workspace); 0 means
	// 1.25.
	MemoryFactor float64
	// Instances is how many instances (replicas) each function has throughout, without Autoscale; 0 means 1, what
	// `up` gives a function deployed without scale labels (with com.openfaas.scale.min N and no other scale label
	// it keeps N). Each instance is placed on its own and holds a copy of its own, as on the product
	// (docs/design.md, decision 10); a request goes to a ready instance round robin, as the local backend routes.
	Instances int
	// MaxInFlight bounds the concurrently bound requests of each instance (the controller's MaxInFlight): the
	// product binds one request per instance (DefaultMaxInFlight). 0 is unlimited, which the product cannot do: a
	// function's requests then share its copies on every GPU as if it had an instance per GPU.
	MaxInFlight int
	// Autoscale runs the product's autoscaler (package provider/autoscale, as `up` runs it) over every function:
	// instances between Scaling.Min and Scaling.Max, by requests in flight (instances.go). One node only.
	Autoscale bool
	// Scaling is every function's com.openfaas.scale.* policy; the zero value means DefaultScaling().
	Scaling autoscale.Policy
	// ScaleDownWindow is `up -scale-down-window` (0: autoscale.DefaultScaleDownWindow, 40 s; negative: at
	// once); AutoscaleInterval is `up -autoscale-interval` (0: 1 s).
	ScaleDownWindow   time.Duration
	AutoscaleInterval time.Duration
	// InstanceStart is how long a new instance takes to serve (0: DefaultInstanceStart; negative: at once).
	InstanceStart time.Duration
	// ModelShared deploys every function with com.openfaas.gpu.model: shared: a copy of a sibling instance is
	// then a swap source over NVLink (the controller reads only such siblings' copies, as the executors do).
	ModelShared bool
	// DataPlane models the executors' memory and their own evictions (dataplane.go): each GPU holds
	// DataPlaneShare (0: memory.DefaultShare, 0.9) of its memory less DataPlaneContextBytes (0:
	// DefaultDataPlaneContextBytes) in 2 MiB chunks, and the controller places against that capacity, as the
	// gpuserver gives it (not the GPU's whole memory); a swap-in out of chunks evicts the least recently used idle copy and reports it to the controller (Result
	// .DataPlaneEvictions, faas_gpu_evictions_total{by}). Off, the data plane has every byte the controller
	// plans with, which the product's does not. Late-binding policies without PartialResidency only.
	DataPlane             bool
	DataPlaneShare        float64
	DataPlaneContextBytes uint64
	// Prewarm starts with every function resident wherever it fits.
	Prewarm bool
	// Arrivals, when set, replaces the trace: explicit arrivals (offset from the start, function index).
	Arrivals []Arrival
	// PartialResidency keeps an evicted model's blocks on its GPU while the memory is not needed (see
	// controller.Config.PartialResidency).
	PartialResidency bool
	// Overload sets the overload control of the policies that have one (faas-gpu): auto (the zero value), off or
	// an explicit target.
	Overload controller.Overload
	// StopBelow, when > 0, ends the run as soon as the share of functions within their SLO can no longer reach
	// it: once so many functions have more requests late or refused than their percentile allows that even every
	// other request on time would leave fewer than StopBelow of the functions within their SLO. The result then
	// says Stopped, and its figures count only what finished until then (a sizing search needs no more than "this
	// cluster misses the target"; an overloaded cluster is the slowest to simulate to the end).
	StopBelow float64
	// Sharing lets the functions whose models have a latency-against-share profile ask for compute shares and
	// co-run on a GPU under a sharing policy (share.go); the zero value is exclusive: a GPU runs one request at a
	// time, as before.
	Sharing Sharing
}

// Assignments of models to functions (Config.Assign).
const (
	AssignRoundRobin = "round-robin"
	AssignSeeded     = "seeded"
)

// BusyRequests is the number of requests from which a function counts as busy (Result.FunctionsBusy).
const BusyRequests = 50

// Arrival is one request of function Function (index) at offset At from the start.
type Arrival struct {
	At       time.Duration
	Function int
}

// Swaps counts bindings by how the model reached the GPU.
type Swaps struct {
	None   int64 `json:"none"`
	NVLink int64 `json:"nvlink"`
	PCIe   int64 `json:"pcie"`
}

// Result holds the figures of one policy's run.
type Result struct {
	Name                 string  `json:"name"`
	Node                 string  `json:"node"`
	Functions            int     `json:"functions"`
	FunctionsWithTraffic int     `json:"functions_with_requests"`
	FunctionsSLOMet      int     `json:"functions_slo_met"`
	FunctionsSLOMetShare float64 `json:"functions_slo_met_share"`
	Requests             int64   `json:"requests"`
	RequestsOnTime       int64   `json:"requests_on_time"`
	Rejected             int64   `json:"requests_rejected"`
	// Shed counts the rejected requests that the overload control refused (429 with Retry-After).
	Shed int64 `json:"requests_shed"`
	// Refused counts the rejected requests that the admission rule refused (429 with Retry-After).
	Refused int64 `json:"requests_refused_admission"`
	// FunctionsBusy counts the functions with at least BusyRequests requests, FunctionsBusyMet those of them
	// meeting their SLO (a function of a few requests meets or misses it by one request).
	FunctionsBusy    int `json:"functions_busy"`
	FunctionsBusyMet int `json:"functions_busy_slo_met"`
	// P50, P98 and P99 are of the served (admitted) requests' latencies over their deadline.
	P50       float64   `json:"latency_p50_over_deadline"`
	P98       float64   `json:"latency_p98_over_deadline"`
	P99       float64   `json:"latency_p99_over_deadline"`
	GPUBusy   []float64 `json:"gpu_busy_fraction"`
	Swaps     Swaps     `json:"swaps"`
	Evictions int64     `json:"evictions"`
	// DataPlaneEvictions counts the copies the data plane dropped on its own, by reason (Config.DataPlane:
	// "pressure"; "swap-failed" for a swap that found no chunks, whose request failed), as the controller counts
	// them (faas_gpu_evictions_total{by}); Evictions counts the controller's.
	DataPlaneEvictions map[string]int64 `json:"evictions_by_data_plane,omitempty"`
	// Autoscaler is what the autoscaler did (Config.Autoscale).
	Autoscaler       *AutoscalerResult `json:"autoscaler,omitempty"`
	SwappedBytes     uint64            `json:"swapped_bytes"`
	ColdStarts       int64             `json:"cold_starts"`
	Events           int64             `json:"events"`
	SimulatedSeconds float64           `json:"simulated_seconds"`
	WallSeconds      float64           `json:"wall_seconds"`
	EventsPerSecond  float64           `json:"events_per_second"`
	// Stopped: the run ended early, at SimulatedSeconds, because the share of functions within their SLO could no
	// longer reach Config.StopBelow; the figures count only what finished until then.
	Stopped bool `json:"stopped_early,omitempty"`
	// PerRequest holds every request's outcome when Run is asked for it (tests), and Scaling every autoscaler
	// decision.
	PerRequest []Outcome    `json:"-"`
	Scaling    []ScaleEvent `json:"-"`

	// P95 is the 95th percentile of the served requests' latency over their deadline (the sharing benchmark's
	// figure); CoRunBound counts the requests bound beside another binding (Config.Sharing).
	P95        float64 `json:"latency_p95_over_deadline"`
	CoRunBound int64   `json:"corun_bound,omitempty"`
}

// AutoscalerResult sums up the autoscaler's decisions over a run.
type AutoscalerResult struct {
	Ups   int64 `json:"scale_ups"`
	Downs int64 `json:"scale_downs"`
	// Started counts the instances started (those at the start included); Peak is the most instances one
	// function had at once; Mean the instances provisioned on average over the run, all functions.
	Started int64   `json:"instances_started"`
	Peak    int     `json:"instances_peak"`
	Mean    float64 `json:"instances_mean"`
}

// Outcome is one request's fate.
type Outcome struct {
	ID       uint64
	Function int
	Arrival  time.Duration
	Latency  time.Duration
	// Wait is the time from arrival to binding; SwapTime what the swap added to the request.
	Wait     time.Duration
	SwapTime time.Duration
	// Instance is the instance (controller entry) the request was submitted to.
	Instance string
	GPU      int
	Swap     string
	OnTime   bool
	Rejected bool
	Evicted  []controller.Eviction
}

type fnModel struct {
	model            Model
	name             string
	slo              time.Duration
	betaPCIe, betaNV float64
	// insts are the function's instances (instances.go); rr the round robin's counter; nextInst numbers the next
	// one; load its requests in flight (arrival to end) and peak the most since the autoscaler's last look; parked
	// the requests waiting for an instance to be ready.
	insts    []*instance
	rr       uint64
	nextInst int
	load     int
	peak     int
	parked   []*reqInfo
	observed uint64 // the instances the autoscaler saw at its last look at this function
}

// DefaultMaxInFlight is what the product binds per instance at once: one request.
const DefaultMaxInFlight = 1

// modelOf is the index of function i's model (Config.Assign).
func (cfg *Config) modelOf(i int) int {
	if cfg.Assign == AssignSeeded {
		return rand.New(rand.NewPCG(cfg.Seed^0xa551c4, uint64(i))).IntN(len(cfg.Models))
	}
	return i % len(cfg.Models)
}

// fnModel builds function i's model: its profile (Config.Assign), name, SLO and swap penalty factors against the
// reference node ref.
func (cfg *Config) fnModel(i int, ref *topology.Node) fnModel {
	m := cfg.Models[cfg.modelOf(i)]
	fm := fnModel{model: m, name: fmt.Sprintf("fn-%04d-%s", i, m.Name), slo: m.SLO}
	if fm.slo == 0 {
		fm.slo = cfg.DefaultSLO
	}
	tPCIe := ref.TransferTime(m.WeightsBytes, topology.HostPath(0), nil)
	tNV := ref.TransferTime(m.WeightsBytes, topology.PeerPath(3, 0), nil)
	switch {
	case m.SwapPCIe > 0:
		fm.betaPCIe = max(0, float64(m.SwapPCIe-m.Remote)/float64(tPCIe))
		fm.betaNV = max(0, float64(m.SwapNVLink-m.Remote)/float64(tNV))
	case m.H2D > 0:
		fm.betaPCIe = float64(m.H2D) / float64(tPCIe)
		fm.betaNV = fm.betaPCIe
	default:
		fm.betaPCIe, fm.betaNV = 1, 1
	}
	return fm
}

// exec is fm's execution time under cfg's policy: native or remoted.
func (cfg *Config) exec(fm fnModel) time.Duration {
	if cfg.Policy.NativeExec() && !cfg.RemotedTimes {
		return fm.model.Native
	}
	return fm.model.Remote + cfg.HoldOverhead
}

// quota is the GPU memory a function whose weights take bytes is given: MemoryFactor times them, in whole MiB.
func (cfg *Config) quota(bytes uint64) uint64 {
	return uint64(math.Ceil(float64(bytes)*cfg.MemoryFactor/(1<<20))) << 20
}

// epoch is the virtual clock's origin.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates one policy on one node. keepOutcomes records every request's outcome in Result.PerRequest.
func Run(cfg Config, keepOutcomes bool) (Result, error) {
	if err := cfg.check(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	e, err := newEngine(&cfg, keepOutcomes)
	if err != nil {
		return Result{}, err
	}
	n, err := e.addNode(nil)
	if err != nil {
		return Result{}, err
	}
	arrivals := cfg.Arrivals
	if arrivals == nil {
		arrivals = cfg.arrivals()
	}
	res := Result{Name: string(cfg.Policy), Node: cfg.Node.Name, Functions: cfg.Functions}
	perFn := make([][2]int64, cfg.Functions) // served, on time
	norm := make([]float64, 0, len(arrivals))
	e.rejected = func(ri *reqInfo) {
		res.Rejected++
		perFn[ri.fn][0]++
		e.missed(ri.fn)
	}
	e.arrive = func(ri *reqInfo) {
		if err := e.submit(n, ri); err != nil {
			e.reject(ri)
		}
	}
	e.finished = func(ri *reqInfo, onTime bool, lat, _ time.Duration) {
		perFn[ri.fn][0]++
		if onTime {
			perFn[ri.fn][1]++
			res.RequestsOnTime++
		} else {
			e.missed(ri.fn)
		}
		norm = append(norm, float64(lat)/float64(e.fns[ri.fn].slo))
	}
	if s := e.scale; s != nil {
		e.addTicker(s.interval, func() error { return e.scaleTick(n) })
	}
	e.watchFloor(arrivals)
	if err := e.run(arrivals); err != nil {
		return Result{}, err
	}
	now := e.now
	res.Requests, res.Events, res.Stopped = int64(len(arrivals)), e.events, e.stopped
	ctr := n.ctl.Counters()
	if len(ctr.DataPlaneEvictions) > 0 {
		res.DataPlaneEvictions = ctr.DataPlaneEvictions
	}
	res.Swaps = Swaps{None: ctr.SwapsNone, NVLink: ctr.SwapsNV, PCIe: ctr.SwapsPCIe}
	res.Evictions, res.ColdStarts, res.Shed, res.Refused = ctr.Evictions, ctr.ColdStarts, ctr.Shed, ctr.Refused
	res.SwappedBytes = ctr.SwappedBytes
	res.FunctionsWithTraffic, res.FunctionsSLOMet = e.compliance(perFn)
	res.FunctionsBusy, res.FunctionsBusyMet = e.busyCompliance(perFn)
	if res.FunctionsWithTraffic > 0 {
		res.FunctionsSLOMetShare = float64(res.FunctionsSLOMet) / float64(res.FunctionsWithTraffic)
	}
	sort.Float64s(norm)
	res.P50, res.P98, res.P99 = quantile(norm, 0.50), quantile(norm, 0.98), quantile(norm, 0.99)
	res.P95, res.CoRunBound = quantile(norm, 0.95), n.ctl.CoRunCounts().Bound
	res.SimulatedSeconds = now.Seconds()
	for _, b := range n.ctl.BusyTime(epoch.Add(now)) {
		f := 0.0
		if now > 0 {
			f = float64(b) / float64(now)
		}
		res.GPUBusy = append(res.GPUBusy, f)
	}
	res.WallSeconds = time.Since(start).Seconds()
	if res.WallSeconds > 0 {
		res.EventsPerSecond = float64(res.Events) / res.WallSeconds
	}
	res.PerRequest = e.outcomes
	if s := e.scale; s != nil {
		s.account(now, 0)
		res.Autoscaler = &AutoscalerResult{Ups: s.ups, Downs: s.downs, Started: s.started, Peak: s.peak}
		if now > 0 {
			res.Autoscaler.Mean = s.instSecs / now.Seconds()
		}
		res.Scaling = s.events
	}
	return res, nil
}

// compliance counts the functions with traffic and those of them meeting their SLO (at least their percentile
// of requests on time; perFn holds requests and requests on time, refused ones counted as requests).
func (e *engine) compliance(perFn [][2]int64) (withTraffic, met int) {
	for i, f := range perFn {
		if f[0] == 0 {
			continue
		}
		withTraffic++
		if e.meets(i, f[0], f[1]) {
			met++
		}
	}
	return withTraffic, met
}

// busyCompliance counts the functions with at least BusyRequests requests and those of them meeting their SLO.
func (e *engine) busyCompliance(perFn [][2]int64) (busy, met int) {
	for i, f := range perFn {
		if f[0] < BusyRequests {
			continue
		}
		busy++
		if e.meets(i, f[0], f[1]) {
			met++
		}
	}
	return busy, met
}

// meets says whether function i with onTime of its total requests on time meets its SLO: at least its
// percentile of them.
func (e *engine) meets(i int, total, onTime int64) bool {
	p := e.fns[i].model.Percentile
	if p == 0 {
		p = contract.DefaultPercentile
	}
	return float64(onTime) >= p/100*float64(total)-1e-9
}

// allowedMisses is how many of its total requests function i may have late or refused and still meet its SLO.
func (e *engine) allowedMisses(i int, total int64) int64 {
	m := int64(0)
	for m < total && e.meets(i, total, total-m-1) {
		m++
	}
	return m
}

// floorWatch tracks, for Config.StopBelow, the functions that can no longer meet their SLO.
type floorWatch struct {
	floor       float64
	allowed     []int64 // misses each function may have; -1: no requests
	misses      []int64
	lost        int
	withTraffic int
}

// watchFloor arms the early stop of Config.StopBelow for a run of arrivals.
func (e *engine) watchFloor(arrivals []Arrival) {
	if e.cfg.StopBelow <= 0 {
		return
	}
	total := make([]int64, e.cfg.Functions)
	for _, a := range arrivals {
		total[a.Function]++
	}
	w := &floorWatch{floor: e.cfg.StopBelow, allowed: make([]int64, len(total)), misses: make([]int64, len(total))}
	for i, t := range total {
		w.allowed[i] = -1
		if t > 0 {
			w.allowed[i] = e.allowedMisses(i, t)
			w.withTraffic++
		}
	}
	e.floor = w
}

// missed counts a request of function fn late or refused, and stops the run once the floor is out of reach.
func (e *engine) missed(fn int) {
	w := e.floor
	if w == nil {
		return
	}
	w.misses[fn]++
	if w.misses[fn] == w.allowed[fn]+1 {
		w.lost++
		if float64(w.withTraffic-w.lost) < w.floor*float64(w.withTraffic)-1e-9 {
			e.stopped = true
		}
	}
}

// swapPenalty is what a swap whose transfer took took (alone: alone) adds to its request's latency. A model's
// profile gives the penalty of a swap alone as beta x its transfer time (pipelined execution hides the rest); when
// contention stretches the transfer beyond its time alone, the extra time is on the request's critical path (its
// last layers wait for their weights), so it adds in full.
func swapPenalty(beta float64, took, alone time.Duration) time.Duration {
	scaled := time.Duration(beta * float64(took))
	if took <= alone {
		return scaled
	}
	return max(scaled, time.Duration(beta*float64(alone))+took-alone)
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func (cfg *Config) check() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrInvalidInput, fmt.Sprintf(f, a...)) }
	if cfg.DefaultSLO == 0 {
		cfg.DefaultSLO = DefaultSLO
	}
	if cfg.MemoryFactor == 0 {
		cfg.MemoryFactor = DefaultMemoryFactor
	}
	if err := cfg.autoscaleDefaults(); err != nil {
		return err
	}
	if err := cfg.Sharing.check(); err != nil {
		return err
	}
	if cfg.Sharing.On() && cfg.Sharing.Profile == nil {
		cfg.Sharing.Profile = DefaultShareProfile()
	}
	switch {
	case len(cfg.Models) == 0:
		return bad("models: none given")
	case cfg.Functions <= 0:
		return bad("functions: must be > 0")
	case cfg.Assign != "" && cfg.Assign != AssignRoundRobin && cfg.Assign != AssignSeeded:
		return bad("assign %q: want %s or %s", cfg.Assign, AssignRoundRobin, AssignSeeded)
	case cfg.ArrivalCV < 0 || math.IsNaN(cfg.ArrivalCV) || cfg.ArrivalCV > 100:
		return bad("arrival cv: must be in [0, 100] (0: Poisson within each minute)")
	case cfg.Alpha < 0 || cfg.Alpha > 1 || math.IsNaN(cfg.Alpha):
		return bad("alpha: must be in (0, 1] (0: re-tuned)")
	case cfg.DataPlaneShare < 0 || cfg.DataPlaneShare > 1 || math.IsNaN(cfg.DataPlaneShare):
		return bad("data plane share: must be in (0, 1] (0: %g)", memory.DefaultShare)
	case cfg.MemoryFactor < 1:
		return bad("memory factor: must be >= 1")
	case cfg.Arrivals == nil && (cfg.Trace == nil || len(cfg.Trace.Counts) == 0):
		return bad("trace: no functions")
	case cfg.StartMinute < 0 || cfg.Arrivals == nil && cfg.StartMinute >= cfg.Trace.Minutes():
		return bad("start minute: must be in 0..%d", max(0, cfg.Trace.Minutes()-1))
	case cfg.Arrivals == nil && (cfg.Minutes <= 0 || cfg.Minutes > maxMinutes):
		return bad("minutes: must be in 1..%d (beyond the trace's %d minutes it repeats)", maxMinutes,
			cfg.Trace.Minutes())
	}
	for _, a := range cfg.Arrivals {
		if a.Function < 0 || a.Function >= cfg.Functions || a.At < 0 {
			return bad("arrivals: function %d at %v out of range", a.Function, a.At)
		}
	}
	if !slices.IsSortedFunc(cfg.Arrivals, func(a, b Arrival) int { return int(a.At - b.At) }) {
		return bad("arrivals: not sorted by time")
	}
	return nil
}

// TraceArrivals gives the arrivals a run of cfg replays: cfg.Arrivals when set, else those built from the trace
// (each minute's count spread as a Poisson process within the minute, from cfg.Seed). Given back as
// cfg.Arrivals they replay the same run, so runs that differ only in policy or cluster can share one list.
func TraceArrivals(cfg Config) ([]Arrival, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Arrivals != nil {
		return cfg.Arrivals, nil
	}
	return cfg.arrivals(), nil
}

// arrivals builds the functions' arrival times: each minute's count spread as a Poisson process within the
// minute (uniform times given the count), from the seed.
func (cfg *Config) arrivals() []Arrival {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	rows, length := len(cfg.Trace.Counts), cfg.Trace.Minutes()
	var out []Arrival
	for i := range cfg.Functions {
		row, shift := i, 0
		if i >= rows {
			row, shift = rng.IntN(rows), rng.IntN(length)
		}
		counts := cfg.Trace.Counts[row]
		if cfg.ArrivalCV > 0 {
			out = gammaArrivals(out, rng, i, cfg.ArrivalCV, cfg.Minutes, func(m int) int {
				return counts[(m+cfg.StartMinute+shift)%length]
			})
			continue
		}
		for m := range cfg.Minutes {
			for range counts[(m+cfg.StartMinute+shift)%length] {
				at := time.Duration(m)*time.Minute + time.Duration(rng.Int64N(int64(time.Minute)))
				out = append(out, Arrival{At: at, Function: i})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Arrival) int {
		if a.At != b.At {
			if a.At < b.At {
				return -1
			}
			return 1
		}
		return a.Function - b.Function
	})
	return out
}
