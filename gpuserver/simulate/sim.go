package simulate

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

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
	// shifted by a random whole number of minutes. Models are assigned round-robin.
	Functions int
	Node      topology.Node
	// Minutes of the trace to replay (at most the trace's length; copies wrap around).
	Minutes int
	Policy  controller.Policy
	Seed    uint64
	// DefaultSLO applies to models whose profile gives none; DefaultSLO 0 means 100 ms.
	DefaultSLO time.Duration
	// MemoryFactor: a function's GPU memory quota is its weights times this (activations and workspace); 0 means
	// 1.25.
	MemoryFactor float64
	// MaxInFlight bounds each function's concurrently bound requests (0: unlimited).
	MaxInFlight int
	// Prewarm starts with every function resident wherever it fits.
	Prewarm bool
	// Arrivals, when set, replaces the trace: explicit arrivals (offset from the start, function index).
	Arrivals []Arrival
}

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
	Shed             int64     `json:"requests_shed"`
	P50              float64   `json:"latency_p50_over_deadline"`
	P98              float64   `json:"latency_p98_over_deadline"`
	P99              float64   `json:"latency_p99_over_deadline"`
	GPUBusy          []float64 `json:"gpu_busy_fraction"`
	Swaps            Swaps     `json:"swaps"`
	Evictions        int64     `json:"evictions"`
	ColdStarts       int64     `json:"cold_starts"`
	Events           int64     `json:"events"`
	SimulatedSeconds float64   `json:"simulated_seconds"`
	WallSeconds      float64   `json:"wall_seconds"`
	EventsPerSecond  float64   `json:"events_per_second"`
	// PerRequest holds every request's outcome when Run is asked for it (tests).
	PerRequest []Outcome `json:"-"`
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
	GPU      int
	Swap     string
	OnTime   bool
	Rejected bool
	Evicted  []controller.Eviction
}

type event struct {
	at   time.Duration
	seq  uint64
	kind int // 0 swap done, 1 complete
	id   uint64
	took time.Duration
	exec time.Duration
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type fnModel struct {
	model            Model
	name             string
	slo              time.Duration
	betaPCIe, betaNV float64
	unplaceable      bool // fits on no GPU: every request is rejected
}

// fnModel builds function i's model: its profile (round-robin), name, SLO and swap penalty factors against the
// reference node ref.
func (cfg *Config) fnModel(i int, ref *topology.Node) fnModel {
	m := cfg.Models[i%len(cfg.Models)]
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

// epoch is the virtual clock's origin.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates one policy. keepOutcomes records every request's outcome in Result.PerRequest.
func Run(cfg Config, keepOutcomes bool) (Result, error) {
	if err := cfg.check(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	ref, err := topology.Preset("v100x4")
	if err != nil {
		return Result{}, err
	}
	ctl, err := controller.New(controller.Config{Policy: cfg.Policy, Node: cfg.Node, Seed: cfg.Seed,
		MaxInFlight: cfg.MaxInFlight, Prewarm: cfg.Prewarm})
	if err != nil {
		return Result{}, err
	}
	fns := make([]fnModel, cfg.Functions)
	for i := range fns {
		fm := cfg.fnModel(i, &ref)
		m := fm.model
		quota := uint64(math.Ceil(float64(m.WeightsBytes)*cfg.MemoryFactor/(1<<20))) << 20
		exec := m.Remote
		if cfg.Policy.NativeExec() {
			exec = m.Native
		}
		spec := controller.Function{
			FunctionSpec: pool.FunctionSpec{Name: fm.name, MemoryBytes: quota, SLO: fm.slo, Percentile: m.Percentile},
			ModelBytes:   m.WeightsBytes, ExecSeed: exec,
		}
		if err := ctl.Register(epoch, spec); err != nil {
			if !errors.Is(err, pool.ErrTooLarge) {
				return Result{}, fmt.Errorf("register %s: %w", fm.name, err)
			}
			fm.unplaceable = true
		}
		fns[i] = fm
	}
	arrivals := cfg.Arrivals
	if arrivals == nil {
		arrivals = cfg.arrivals()
	}
	res := Result{Name: string(cfg.Policy), Node: cfg.Node.Name, Functions: cfg.Functions}
	type reqInfo struct {
		fn      int
		arrival time.Duration
		out     int // index in outcomes, -1 when not kept
		// A swap over a link in progress: its start, its time alone, the model's penalty per transfer second
		// alone, and the execution that follows.
		swapStart time.Duration
		alone     time.Duration
		beta      float64
		exec      time.Duration
	}
	reqs := make(map[uint64]*reqInfo, 1024)
	var outcomes []Outcome
	perFn := make([][2]int64, cfg.Functions) // served, on time
	norm := make([]float64, 0, len(arrivals))
	var events eventHeap
	var seq uint64
	var now time.Duration
	ai := 0
	links := topology.NewTransfers(&cfg.Node) // the node's links: transfers advance as a fluid
	push := func(e event) {
		seq++
		e.seq = seq
		heap.Push(&events, e)
	}
	for ai < len(arrivals) || events.Len() > 0 || links.Len() > 0 {
		// Next event: transfers ending, then completions and cold starts ending, then arrivals at the same instant.
		le, transferring := links.Next()
		if transferring && (events.Len() == 0 || le.At.Sub(epoch) <= events[0].at) &&
			(ai >= len(arrivals) || le.At.Sub(epoch) <= arrivals[ai].At) {
			now = le.At.Sub(epoch)
			res.Events++
			links.End(le.At, le.ID)
			ri := reqs[le.ID]
			took := now - ri.swapStart
			penalty := swapPenalty(ri.beta, took, ri.alone)
			if err := ctl.SwapDone(epoch.Add(now), le.ID, penalty); err != nil {
				return Result{}, err
			}
			// The request ends once its execution, pipelined behind the transfer, is done: never before the last
			// byte has arrived.
			push(event{at: ri.swapStart + max(took, penalty+ri.exec), kind: 1, id: le.ID, exec: ri.exec})
			if ri.out >= 0 {
				outcomes[ri.out].SwapTime = penalty
			}
		} else if events.Len() > 0 && (ai >= len(arrivals) || events[0].at <= arrivals[ai].At) {
			e := heap.Pop(&events).(event)
			now = e.at
			res.Events++
			switch e.kind {
			case 0:
				if err := ctl.SwapDone(epoch.Add(now), e.id, e.took); err != nil {
					return Result{}, err
				}
			case 1:
				onTime, err := ctl.Complete(epoch.Add(now), e.id, e.exec)
				if err != nil {
					return Result{}, err
				}
				ri := reqs[e.id]
				delete(reqs, e.id)
				lat := now - ri.arrival
				perFn[ri.fn][0]++
				if onTime {
					perFn[ri.fn][1]++
					res.RequestsOnTime++
				}
				norm = append(norm, float64(lat)/float64(fns[ri.fn].slo))
				if ri.out >= 0 {
					outcomes[ri.out].Latency, outcomes[ri.out].OnTime = lat, onTime
				}
			}
		} else {
			a := arrivals[ai]
			ai++
			now = a.At
			res.Events++
			res.Requests++
			id := uint64(ai)
			ri := &reqInfo{fn: a.Function, arrival: a.At, out: -1}
			if keepOutcomes {
				ri.out = len(outcomes)
				outcomes = append(outcomes, Outcome{ID: id, Function: a.Function, Arrival: a.At, GPU: -1})
			}
			err := ctl.Submit(epoch.Add(now), id, fns[a.Function].name)
			if fns[a.Function].unplaceable {
				err = pool.ErrTooLarge
			}
			if err != nil {
				if !errors.Is(err, pool.ErrTooLarge) && !errors.Is(err, pool.ErrOverloaded) {
					return Result{}, err
				}
				res.Rejected++
				perFn[a.Function][0]++
				if ri.out >= 0 {
					outcomes[ri.out].Rejected = true
				}
				continue
			}
			reqs[id] = ri
		}
		if events.Len() > 0 && events[0].at == now || ai < len(arrivals) && arrivals[ai].At == now {
			continue // dispatch once per instant
		}
		if le, ok := links.Next(); ok && le.At.Sub(epoch) == now {
			continue
		}
		for _, d := range ctl.Dispatch(epoch.Add(now)) {
			ri := reqs[d.Request]
			fm := &fns[ri.fn]
			exec := fm.model.Remote
			if cfg.Policy.NativeExec() {
				exec = fm.model.Native
			}
			if ri.out >= 0 {
				o := &outcomes[ri.out]
				o.GPU, o.Swap, o.Evicted = d.GPU, d.Swap, d.Evict
				o.Wait = now - ri.arrival
			}
			switch d.Swap {
			case controller.SwapPCIe, controller.SwapNVLink:
				// The transfer runs among the others on the node's links until its last byte has moved; its
				// request's completion is scheduled when it ends.
				ri.beta = fm.betaPCIe
				if cfg.Node.Kind(d.Path()) == "nvlink" {
					ri.beta = fm.betaNV
				}
				ri.swapStart, ri.exec = now, exec
				ri.alone = cfg.Node.TransferTime(d.Bytes, d.Path(), nil)
				links.Start(epoch.Add(now), d.Request, d.Path(), d.Bytes)
				continue
			case controller.SwapCold:
				penalty := controller.DefaultColdStart + time.Duration(float64(d.Bytes)/1e9*float64(time.Second))
				push(event{at: now + penalty, kind: 0, id: d.Request, took: penalty})
				push(event{at: now + penalty + exec, kind: 1, id: d.Request, exec: exec})
				if ri.out >= 0 {
					outcomes[ri.out].SwapTime = penalty
				}
				continue
			}
			push(event{at: now + exec, kind: 1, id: d.Request, exec: exec})
		}
	}
	if len(reqs) != 0 {
		return Result{}, fmt.Errorf("simulation ended with %d requests unserved", len(reqs))
	}
	ctr := ctl.Counters()
	res.Swaps = Swaps{None: ctr.SwapsNone, NVLink: ctr.SwapsNV, PCIe: ctr.SwapsPCIe}
	res.Evictions, res.ColdStarts, res.Shed = ctr.Evictions, ctr.ColdStarts, ctr.Shed
	for i, f := range perFn {
		if f[0] == 0 {
			continue
		}
		res.FunctionsWithTraffic++
		p := fns[i].model.Percentile
		if p == 0 {
			p = pool.DefaultPercentile
		}
		if float64(f[1]) >= p/100*float64(f[0])-1e-9 {
			res.FunctionsSLOMet++
		}
	}
	if res.FunctionsWithTraffic > 0 {
		res.FunctionsSLOMetShare = float64(res.FunctionsSLOMet) / float64(res.FunctionsWithTraffic)
	}
	sort.Float64s(norm)
	res.P50, res.P98, res.P99 = quantile(norm, 0.50), quantile(norm, 0.98), quantile(norm, 0.99)
	res.SimulatedSeconds = now.Seconds()
	for _, b := range ctl.BusyTime(epoch.Add(now)) {
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
	res.PerRequest = outcomes
	return res, nil
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
	switch {
	case len(cfg.Models) == 0:
		return bad("models: none given")
	case cfg.Functions <= 0:
		return bad("functions: must be > 0")
	case cfg.MemoryFactor < 1:
		return bad("memory factor: must be >= 1")
	case cfg.Arrivals == nil && (cfg.Trace == nil || len(cfg.Trace.Counts) == 0):
		return bad("trace: no functions")
	case cfg.Arrivals == nil && (cfg.Minutes <= 0 || cfg.Minutes > cfg.Trace.Minutes()):
		return bad("minutes: must be in 1..%d (the trace's length)", cfg.Trace.Minutes())
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
		for m := range cfg.Minutes {
			for range counts[(m+shift)%length] {
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
