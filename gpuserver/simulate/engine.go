package simulate

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// The engine runs one or more simulated nodes - each a controller (the code the gpuserver ships) with the node's
// links - on one virtual clock. At each instant it handles, node by node, the transfers that end (the request's
// completion is then scheduled), then completions and cold starts ending, then the arrivals (which the caller
// routes to a node), then periodic ticks (autoscaling), and finally dispatches every node that changed.

// Event kinds on a node.
const (
	evSwapDone = iota // a cold start ends (transfers end through the node's links)
	evComplete        // a request finishes
	evDeliver         // a request reaches the node after its host image loaded
	evReady           // a new instance serves (Config.Autoscale)
)

const never = time.Duration(math.MaxInt64)

type event struct {
	at   time.Duration
	seq  uint64
	kind int
	id   uint64
	took time.Duration
	exec time.Duration
	fn   int       // evReady: the function
	inst *instance // evReady: the instance
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

// reqInfo is the engine's record of one request.
type reqInfo struct {
	id      uint64
	fn      int
	inst    *instance // the instance it was submitted to, nil before (or after it ended)
	counted bool      // in its function's load (the autoscaler's requests in flight)
	arrival time.Duration
	out     int // index in outcomes, -1 when not kept
	node    int
	bound   time.Duration
	// A swap over a link in progress: its start, its time alone, the model's penalty per transfer second alone,
	// and the execution that follows.
	swapStart time.Duration
	alone     time.Duration
	beta      float64
	exec      time.Duration
	// Its binding on the data plane (Config.DataPlane): the copy bound, and an NVLink swap's source copy.
	gpu     int
	name    string
	srcGPU  int
	srcName string
}

type simNode struct {
	index  int
	ctl    *controller.Controller
	links  *topology.Transfers
	events eventHeap
	next   time.Duration // earliest event, never when none
	dirty  bool          // dispatch at the end of the instant
	has    []bool        // function registered and placeable here
	dp     *dataPlane    // the executors' memory (Config.DataPlane), nil when not modelled
}

type engine struct {
	cfg      *Config
	fns      []fnModel
	nodes    []*simNode
	reqs     map[uint64]*reqInfo
	seq      uint64
	now      time.Duration
	events   int64
	keep     bool
	outcomes []Outcome

	// Hooks: arrive routes and submits a new request; deliver submits one whose image has loaded; finished and
	// rejected account for the outcome; each ticker runs every its interval while work remains.
	arrive   func(ri *reqInfo)
	deliver  func(n *simNode, ri *reqInfo)
	finished func(ri *reqInfo, onTime bool, latency, held time.Duration)
	rejected func(ri *reqInfo)
	tickers  []*ticker
	// instFn maps an instance's name to its function's index; scale is the autoscaler (Config.Autoscale); err
	// is a failure found where no error can be returned (it ends the run).
	instFn map[string]int
	scale  *scaling
	err    error
	// pin, when set, gives each function's controller.Function.Pin (static packing).
	pin func(fn int) []int
	// floor, when set, stops the run (stopped) once too many functions can no longer meet their SLO.
	floor   *floorWatch
	stopped bool
	// shares are the GPUs' shared bindings (Config.Sharing, shareexec.go).
	shares map[shareKey]*shareGPU
}

func newEngine(cfg *Config, keep bool) (*engine, error) {
	ref, err := topology.Preset("v100x4")
	if err != nil {
		return nil, err
	}
	e := &engine{cfg: cfg, keep: keep, reqs: make(map[uint64]*reqInfo, 1024), fns: make([]fnModel, cfg.Functions),
		instFn: map[string]int{}}
	if cfg.Autoscale {
		ac := autoscale.Config{Interval: cfg.AutoscaleInterval, ScaleDownWindow: cfg.ScaleDownWindow}.WithDefaults()
		e.scale = &scaling{policy: cfg.Scaling, start: cfg.InstanceStart, interval: ac.Interval}
		for range e.fns {
			e.scale.scalers = append(e.scale.scalers, autoscale.NewScaler(ac.ScaleDownWindow))
		}
	}
	for i := range e.fns {
		e.fns[i] = cfg.fnModel(i, &ref)
		count := max(1, cfg.Instances)
		if e.scale != nil {
			count = int(cfg.Scaling.Min) // a function deploys with scale.min replicas (0: at zero)
		}
		for range count {
			e.newInstance(i, true)
		}
		if e.scale != nil {
			e.scale.peak = max(e.scale.peak, count)
		}
	}
	return e, nil
}

// ticker runs fn every every.
type ticker struct {
	every, next time.Duration
	fn          func() error
}

// addTicker runs fn every every (the first time at every) while the run has work.
func (e *engine) addTicker(every time.Duration, fn func() error) {
	e.tickers = append(e.tickers, &ticker{every: every, next: e.now + every, fn: fn})
}

// addNode starts a node whose controller knows the functions for which register is true (nil: all).
func (e *engine) addNode(register func(fn int) bool) (*simNode, error) {
	cfg := e.cfg
	var dp *dataPlane
	plan := cfg.Node // the node the controller plans with
	chunk := uint64(0)
	if cfg.DataPlane && !cfg.Policy.Pinned() && !cfg.PartialResidency {
		dp = newDataPlane(cfg, func(name string) uint64 {
			return cfg.quota(e.fns[e.instFn[name]].model.WeightsBytes)
		})
		// The gpuserver gives the controller its chunks' capacity, and their size: a copy takes whole chunks.
		plan, chunk = dp.planNode(cfg.Node), dp.chunk
	}
	ctl, err := controller.New(controller.Config{Policy: cfg.Policy, Node: plan, Seed: cfg.Seed,
		MaxInFlight: cfg.MaxInFlight, Prewarm: cfg.Prewarm, PartialResidency: cfg.PartialResidency,
		Overload: cfg.Overload, SiblingSources: true, Admission: cfg.Admission, Alpha: cfg.Alpha, ChunkBytes: chunk,
		Sharing: cfg.Sharing.controller()})
	if err != nil {
		return nil, err
	}
	n := &simNode{index: len(e.nodes), ctl: ctl, links: topology.NewTransfers(&cfg.Node), next: never,
		has: make([]bool, cfg.Functions), dp: dp}
	if dp != nil {
		dp.ctl = ctl
	}
	at := epoch.Add(e.now)
	prewarmed := make([]uint64, len(cfg.Node.GPUs)) // the controller's memory used by prewarmed copies
	for i, fm := range e.fns {
		if register != nil && !register(i) {
			continue
		}
		registered := true
		for _, in := range fm.insts { // each instance is placed on its own (docs/design.md, decision 10)
			if !in.ready || in.stopping {
				continue
			}
			spec := e.spec(i, in.name)
			if err := ctl.Register(at, spec); err != nil {
				if !errors.Is(err, pool.ErrTooLarge) {
					return nil, fmt.Errorf("register %s: %w", spec.Name, err)
				}
				registered = false
				break
			}
			if n.dp != nil && cfg.Prewarm { // the copies Register placed, as the controller places them
				for g, gpu := range plan.GPUs {
					if size := n.dp.chunks(spec.MemoryBytes); gpu.MemoryBytes-prewarmed[g] >= size {
						prewarmed[g] += size
						n.dp.add(g, in.name, e.now)
					}
				}
			}
		}
		n.has[i] = registered
	}
	e.nodes = append(e.nodes, n)
	return n, nil
}

func (e *engine) push(n *simNode, ev event) {
	e.seq++
	ev.seq = e.seq
	heap.Push(&n.events, ev)
	n.next = min(n.next, ev.at)
}

func (e *engine) refresh(n *simNode) {
	n.next = never
	if le, ok := n.links.Next(); ok {
		n.next = le.At.Sub(epoch)
	}
	if n.events.Len() > 0 {
		n.next = min(n.next, n.events[0].at)
	}
}

// submit hands request ri to node n now; the error is the controller's refusal (pool.ErrTooLarge when the
// function cannot run there, pool.ErrOverloaded when the node sheds it).
func (e *engine) submit(n *simNode, ri *reqInfo) error {
	if !n.has[ri.fn] {
		return fmt.Errorf("%w: %s has no GPU on node %d", pool.ErrTooLarge, e.fns[ri.fn].name, n.index)
	}
	fm := &e.fns[ri.fn]
	if !ri.counted { // in the function's load from its arrival to its end, as the proxy counts it
		ri.counted = true
		fm.load++
		fm.peak = max(fm.peak, fm.load)
	}
	in := fm.pick()
	if in == nil { // no instance ready: it waits for one (a function at zero is woken)
		if e.scale != nil && fm.provisioned() == 0 {
			e.scale.ups++
			for range e.scale.policy.Wake() {
				w := e.newInstance(ri.fn, false)
				e.push(n, event{at: e.now + e.scale.start, kind: evReady, fn: ri.fn, inst: w})
			}
			e.scale.peak = max(e.scale.peak, fm.provisioned())
		}
		fm.parked = append(fm.parked, ri)
		ri.node = n.index
		e.reqs[ri.id] = ri
		return nil
	}
	if err := n.ctl.Submit(epoch.Add(e.now), ri.id, in.name); err != nil {
		if errors.Is(err, pool.ErrTooLarge) || errors.Is(err, pool.ErrOverloaded) {
			return err
		}
		return fmt.Errorf("submit %d: %w", ri.id, err) // a bug: abort
	}
	ri.inst = in
	in.inFlight++
	if ri.out >= 0 {
		e.outcomes[ri.out].Instance = in.name
	}
	ri.node = n.index
	e.reqs[ri.id] = ri
	n.dirty = true
	return nil
}

// ended uncounts ri from its instance's requests in flight and its function's load; a stopping instance whose
// last request it was leaves.
func (e *engine) ended(ri *reqInfo) {
	fm := &e.fns[ri.fn]
	if ri.counted {
		ri.counted = false
		fm.load--
	}
	if in := ri.inst; in != nil {
		in.inFlight--
		ri.inst = nil
		if in.stopping && in.inFlight == 0 && e.err == nil {
			e.err = e.retire(e.nodes[ri.node], ri.fn, in)
		}
	}
}

// reject ends request ri unserved.
func (e *engine) reject(ri *reqInfo) {
	e.ended(ri)
	if ri.out >= 0 {
		e.outcomes[ri.out].Rejected = true
	}
	e.rejected(ri)
}

// run replays arrivals; every hook must be set (tick may be nil).
func (e *engine) run(arrivals []Arrival) error {
	ai := 0
	var failed error
	for failed == nil && !e.stopped {
		t := never
		for _, n := range e.nodes {
			t = min(t, n.next)
		}
		if ai < len(arrivals) {
			t = min(t, arrivals[ai].At)
		}
		if t == never {
			break
		}
		for _, tk := range e.tickers {
			t = min(t, tk.next)
		}
		e.now = t
		for _, n := range e.nodes {
			if n.next == t {
				if err := e.nodeEvents(n); err != nil {
					return err
				}
			}
		}
		for ai < len(arrivals) && arrivals[ai].At == t {
			a := arrivals[ai]
			ai++
			e.events++
			ri := &reqInfo{id: uint64(ai), fn: a.Function, arrival: a.At, out: -1, node: -1}
			if e.keep {
				ri.out = len(e.outcomes)
				e.outcomes = append(e.outcomes, Outcome{ID: ri.id, Function: a.Function, Arrival: a.At, GPU: -1})
			}
			e.arrive(ri)
		}
		for _, tk := range e.tickers {
			if tk.next == t {
				if err := tk.fn(); err != nil {
					return err
				}
				tk.next += tk.every
			}
		}
		for _, n := range e.nodes {
			if n.dirty {
				n.dirty = false
				failed = e.dispatch(n)
				e.refresh(n)
			}
		}
		failed = cmp.Or(failed, e.err)
	}
	if failed != nil {
		return failed
	}
	if len(e.reqs) != 0 && !e.stopped {
		return fmt.Errorf("simulation ended with %d requests unserved", len(e.reqs))
	}
	return nil
}

// nodeEvents handles node n's events at the current instant: transfers ending, then completions and cold starts
// ending, then deliveries.
func (e *engine) nodeEvents(n *simNode) error {
	now := e.now
	for {
		if le, ok := n.links.Next(); ok && le.At.Sub(epoch) == now {
			e.events++
			n.links.End(le.At, le.ID)
			ri := e.reqs[le.ID]
			if n.dp != nil && ri.srcName != "" {
				n.dp.pin(ri.srcGPU, ri.srcName, -1)
				ri.srcName = ""
			}
			took := now - ri.swapStart
			penalty := swapPenalty(ri.beta, took, ri.alone)
			if err := n.ctl.SwapDone(epoch.Add(now), le.ID, penalty); err != nil {
				return err
			}
			// The request ends once its execution, pipelined behind the transfer, is done: never before the last
			// byte has arrived.
			e.execute(n, ri, ri.swapStart+max(took, penalty+ri.exec), ri.exec)
			if ri.out >= 0 {
				e.outcomes[ri.out].SwapTime = penalty
			}
			n.dirty = true
			continue
		}
		if n.events.Len() == 0 || n.events[0].at != now {
			break
		}
		ev := heap.Pop(&n.events).(event)
		e.events++
		n.dirty = true
		switch ev.kind {
		case evSwapDone:
			if err := n.ctl.SwapDone(epoch.Add(now), ev.id, ev.took); err != nil {
				return err
			}
		case evComplete:
			onTime, err := n.ctl.Complete(epoch.Add(now), ev.id, ev.exec)
			if err != nil {
				return err
			}
			ri := e.reqs[ev.id]
			delete(e.reqs, ev.id)
			if n.dp != nil {
				n.dp.release(ri.gpu, ri.name, now)
			}
			e.ended(ri)
			lat := now - ri.arrival
			if ri.out >= 0 {
				e.outcomes[ri.out].Latency, e.outcomes[ri.out].OnTime = lat, onTime
			}
			e.finished(ri, onTime, lat, now-ri.bound)
		case evDeliver:
			e.deliver(n, e.reqs[ev.id])
		case evReady:
			if err := e.ready(n, ev.fn, ev.inst); err != nil {
				return err
			}
		case evShare:
			if err := e.shareEvent(n, ev); err != nil {
				return err
			}
		}
	}
	e.refresh(n)
	return nil
}

// deliverLater hands ri to node n after d (its host image loads meanwhile).
func (e *engine) deliverLater(n *simNode, ri *reqInfo, d time.Duration) {
	e.reqs[ri.id] = ri // parked: not yet in the controller
	e.push(n, event{at: e.now + d, kind: evDeliver, id: ri.id})
}

// dispatch binds node n's waiting requests and schedules what follows.
func (e *engine) dispatch(n *simNode) error {
	now := e.now
	ds := n.ctl.Dispatch(epoch.Add(now))
	for _, r := range n.ctl.TakeRefused() { // the overload control dropped them: they could not make it
		ri := e.reqs[r.ID]
		if ri == nil {
			return fmt.Errorf("refused unknown request %d", r.ID)
		}
		delete(e.reqs, r.ID)
		e.reject(ri)
	}
	if n.dp != nil { // the sources of the NVLink copies are read from now: none of them is a victim below
		for _, d := range ds {
			if d.Swap == controller.SwapNVLink {
				n.dp.pin(d.Source, cmp.Or(d.SourceFunction, d.Function), 1)
			}
		}
	}
	for _, d := range ds {
		ri := e.reqs[d.Request]
		if ri == nil {
			return fmt.Errorf("dispatched unknown request %d", d.Request)
		}
		ri.gpu = d.GPU
		if n.dp != nil {
			ri.gpu, ri.name = d.GPU, d.Function
			if d.Swap == controller.SwapNVLink {
				ri.srcGPU, ri.srcName = d.Source, cmp.Or(d.SourceFunction, d.Function)
			}
			if !n.dp.bind(d, d.Function, now) { // no chunks and nothing to evict: the swap fails, and its request
				if ri.srcName != "" {
					n.dp.pin(ri.srcGPU, ri.srcName, -1)
				}
				if _, err := n.ctl.Complete(epoch.Add(now), d.Request, 0); err != nil {
					return err
				}
				n.ctl.Evicted(d.Function, d.GPU, ReasonSwapFailed)
				delete(e.reqs, d.Request)
				e.reject(ri)
				continue
			}
		}
		fm := &e.fns[ri.fn]
		exec := e.cfg.exec(*fm)
		ri.bound = now
		if ri.out >= 0 {
			o := &e.outcomes[ri.out]
			o.GPU, o.Swap, o.Evicted = d.GPU, d.Swap, d.Evict
			o.Wait = now - ri.arrival
		}
		switch d.Swap {
		case controller.SwapPCIe, controller.SwapNVLink:
			// The transfer runs among the others on the node's links until its last byte has moved; its
			// request's completion is scheduled when it ends.
			ri.beta = fm.betaPCIe
			if e.cfg.Node.Kind(d.Path()) == "nvlink" {
				ri.beta = fm.betaNV
			}
			// A partial swap moves only the missing blocks: its penalty scales with the bytes it moves.
			ri.swapStart, ri.exec = now, exec
			ri.alone = e.cfg.Node.TransferTime(d.Bytes, d.Path(), nil)
			n.links.Start(epoch.Add(now), d.Request, d.Path(), d.Bytes)
		case controller.SwapCold:
			penalty := controller.DefaultColdStart + time.Duration(float64(d.Bytes)/1e9*float64(time.Second))
			e.push(n, event{at: now + penalty, kind: evSwapDone, id: d.Request, took: penalty})
			e.execute(n, ri, now+penalty+exec, exec)
			if ri.out >= 0 {
				e.outcomes[ri.out].SwapTime = penalty
			}
		default:
			e.execute(n, ri, now+exec, exec)
		}
	}
	return nil
}
