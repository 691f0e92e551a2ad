package queueing

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
)

// Order names a request ordering.
type Order string

// The orderings a Queue implements (see the package documentation).
const (
	OrderFIFO     Order = "fifo"
	OrderDQLS     Order = "dqls"
	OrderTorpor   Order = "torpor"
	OrderSLOAware Order = "slo-aware"
)

// Defaults of Config.
const (
	DefaultMargin       = 0.4
	DefaultRegroupEvery = 2 * time.Second
	DefaultAlphaWindow  = 20
)

// ErrInvalidConfig is wrapped by configuration errors; ErrUnknownFunction by pushes for unregistered functions;
// ErrDuplicate by a push that reuses a waiting request's ID.
var (
	ErrInvalidConfig   = errors.New("invalid queueing config")
	ErrUnknownFunction = errors.New("unknown function")
	ErrDuplicate       = errors.New("duplicate request id")
)

// Config configures a Queue; zero fields take the defaults.
type Config struct {
	// Order of requests; default OrderSLOAware.
	Order Order
	// Margin added to predicted costs in slack, as a fraction (0.4 = +40%).
	Margin float64
	// RegroupEvery is how often the high/low groups are recomputed (Torpor and SLO-aware orders).
	RegroupEvery time.Duration
	// AlphaWindow is how many regroupings pass between re-tunings of alpha.
	AlphaWindow int
	// RescueShare (OrderSLOAware), in [0, 1]: while at least this share of the functions with served requests
	// meet their SLO (as of the last regrouping; before any is served the node counts as healthy), a request
	// counts as late only once its predicted cost alone no longer fits before its deadline (deadline - Cost <
	// now), so a request whose margined cost exceeds its SLO (a long swap under a short deadline) still competes
	// while it can make it. Below that share (an overloaded node), and always when RescueShare is 0 (the
	// default), the margined slack decides (deadline - (1+Margin)*Cost < now), which leaves the capacity to
	// requests whose prediction fits with room to spare.
	RescueShare float64
	// SpareLast (OrderSLOAware): among the requests that can still meet their deadline in one group, those of
	// functions that can spare a miss (Spare) go after those of functions that cannot, least slack first within
	// each. A function of few requests meets or misses its SLO by one request, and one with thousands can lose
	// a few without missing it: under load, the request whose loss costs a function its SLO goes first.
	SpareLast bool
	// Alpha, when > 0, fixes the fraction of the expected cost admitted to the high-priority group (Torpor and
	// SLO-aware orders) instead of starting at 1 and re-tuning it; Torpor's node simulator fixes it at 0.01.
	Alpha float64
}

// Request is one queued request or message.
type Request struct {
	// ID identifies the request for Remove; unique among waiting requests.
	ID uint64
	// Function the request belongs to; it must have been registered with SetFunction.
	Function string
	// Arrival time.
	Arrival time.Time
	// Deadline; zero means Arrival + the function's SLO (no deadline when the function has none).
	Deadline time.Time
	// Cost is the predicted swap plus execution time at push.
	Cost time.Duration
	// Payload is carried through untouched.
	Payload any
}

// FunctionStats is the SLO bookkeeping of one function.
type FunctionStats struct {
	Served  int64         // requests observed served (Observe)
	Missed  int64         // requests observed refused or dropped unserved (ObserveMissed)
	OnTime  int64         // m: of the served, within the deadline (n = Served + Missed)
	RRC     float64       // (p*n - m)/(1 - p)
	High    bool          // in the high-priority group
	MeanLat time.Duration // mean observed latency
	Waiting int           // requests queued
}

type entry struct {
	Request
	seq   uint64
	key   int64 // ordering key within the function; smaller first
	due   int64 // deadline - cost in ns since epoch: after it the request cannot make its deadline
	slack int64 // deadline - (1+margin)*cost in ns since epoch; math.MaxInt64 without a deadline
	index int
	late  bool // moved to the function's late heap (SLO-aware order)
}

type fnHeap []*entry

func (h fnHeap) Len() int { return len(h) }
func (h fnHeap) Less(i, j int) bool {
	if h[i].key != h[j].key {
		return h[i].key < h[j].key
	}
	return h[i].seq < h[j].seq
}
func (h fnHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *fnHeap) Push(x any)   { e := x.(*entry); e.index = len(*h); *h = append(*h, e) }
func (h *fnHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
func (h fnHeap) head() *entry  { return h[0] }
func (h fnHeap) isEmpty() bool { return len(h) == 0 }

// books is the SLO bookkeeping of a function, shared by the queue's functions that are instances of it
// (SetFamily): its SLO is the function's, over all its instances' requests.
type books struct {
	key    string  // the family's name
	refs   int     // the queue's functions that keep these books
	p      float64 // percentile as a fraction
	served int64
	missed int64 // ObserveMissed: refused or dropped without being served, each a miss
	onTime int64
	latSum time.Duration
	high   bool
}

type function struct {
	name string
	slo  time.Duration
	*books
	waiting    fnHeap // SLO-aware order: requests that can still meet their deadline
	late       fnHeap // SLO-aware order: requests that can no longer, oldest first
	activeSlot int    // index in Queue.active, -1 when no request waits
	demoted    bool   // SetDemoted: after every request of a function not demoted
}

func (f *function) count() int { return len(f.waiting) + len(f.late) }

// head is the function's first request: the first of waiting, else the first of late.
func (f *function) head() *entry {
	if len(f.waiting) > 0 {
		return f.waiting[0]
	}
	return f.late[0]
}

// popHead removes head().
func (f *function) popHead() *entry {
	if len(f.waiting) > 0 {
		return heap.Pop(&f.waiting).(*entry)
	}
	return heap.Pop(&f.late).(*entry)
}

// demoteLate moves requests whose slack has run out (with rescue: that can no longer make their deadline at all)
// from waiting to late; waiting is ordered by slack, so it looks at the head only.
func (f *function) demoteLate(nowNS int64, rescue bool) {
	for len(f.waiting) > 0 && (!rescue && f.waiting[0].slack < nowNS || rescue && f.waiting[0].due < nowNS) {
		e := heap.Pop(&f.waiting).(*entry)
		e.late, e.key = true, int64(e.seq)
		heap.Push(&f.late, e)
	}
}

// n is the function's requests observed: served, and refused or dropped unserved (each a miss).
func (f *books) n() int64 { return f.served + f.missed }

// spareShare: a function can spare a miss (SpareLast) while it keeps a quarter of its miss budget, (1-p) x n.
const spareShare = 0.25

// spare reports whether the function can lose its next request and still meet its SLO with a quarter of its miss
// budget left: m - p*n >= max(1, spareShare*(1-p)*n) for n observed, m of them on time, percentile p.
func (f *books) spare() bool {
	n := float64(f.n())
	return float64(f.onTime)-f.p*n >= max(1, spareShare*(1-f.p)*n)
}

// lost reports whether the function is so far below its SLO that it would need more requests on time in a row
// to meet it again than it has had so far (rrc > n: more than twice its miss budget missed), once it has had a
// whole miss budget's worth of requests (n >= 1/(1-p), 50 at the 98th percentile: before that one miss of a
// new function would make it lost, and ordering it last would keep it so). SpareLast orders it
// with the functions that can spare a miss, last of them near capacity: serving it first would spend the GPUs
// on a function that cannot be saved soon, while functions at the edge of their budget lose theirs (Azure hour
// 1, models drawn with seed 3: function 287's bert_qa, over its budget by thousands of refused requests).
func (f *books) lost() bool {
	n := float64(f.n())
	return n >= 1/(1-f.p) && f.rrc() > n
}

func (f *books) rrc() float64 {
	return (f.p*float64(f.n()) - float64(f.onTime)) / (1 - f.p)
}

func (f *books) meanLat() time.Duration {
	if f.served == 0 {
		return 0
	}
	return f.latSum / time.Duration(f.served)
}

// need is Torpor's within-group metric: mean latency x (p*n - m).
func (f *books) need() float64 {
	return f.meanLat().Seconds() * (f.p*float64(f.n()) - float64(f.onTime))
}

// Queue orders requests of many functions. It is not safe for concurrent use.
type Queue struct {
	cfg       Config
	fns       map[string]*function
	active    []*function // functions with waiting requests
	byID      map[uint64]*entry
	seq       uint64
	n         int
	cost      time.Duration // the waiting requests' Cost together
	lastGroup time.Time
	groupRuns int
	alpha     float64
	oldRatio  float64 // the share of functions meeting their SLO that alpha was last re-tuned against
	hasOld    bool    // oldRatio has been measured
	metShare  float64 // share of functions meeting their SLO at the last regrouping
	// observed lists the functions with served requests (the others are always high priority); changed says
	// whether an observation, an SLO or alpha changed since the last regrouping, and met and seen are that
	// regrouping's counts, reused while nothing changed.
	observed  []*books
	families  map[string]*books // books by family name (SetFamily; a function's own name without one)
	changed   bool
	met, seen int
	pressed   bool // SetPressed
}

// New returns an empty queue.
func New(cfg Config) (*Queue, error) {
	if cfg.Order == "" {
		cfg.Order = OrderSLOAware
	}
	switch cfg.Order {
	case OrderFIFO, OrderDQLS, OrderTorpor, OrderSLOAware:
	default:
		return nil, fmt.Errorf("%w: order %q (want fifo, dqls, torpor or slo-aware)", ErrInvalidConfig, cfg.Order)
	}
	if cfg.Margin == 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.Margin < 0 || math.IsNaN(cfg.Margin) || math.IsInf(cfg.Margin, 0) {
		return nil, fmt.Errorf("%w: margin must be >= 0", ErrInvalidConfig)
	}
	if cfg.RegroupEvery == 0 {
		cfg.RegroupEvery = DefaultRegroupEvery
	}
	if cfg.RegroupEvery < 0 {
		return nil, fmt.Errorf("%w: regroup interval must be > 0", ErrInvalidConfig)
	}
	if cfg.AlphaWindow == 0 {
		cfg.AlphaWindow = DefaultAlphaWindow
	}
	if cfg.AlphaWindow < 0 {
		return nil, fmt.Errorf("%w: alpha window must be > 0", ErrInvalidConfig)
	}
	if cfg.RescueShare < 0 || cfg.RescueShare > 1 || math.IsNaN(cfg.RescueShare) {
		return nil, fmt.Errorf("%w: rescue share must be in [0, 1]", ErrInvalidConfig)
	}
	if cfg.Alpha < 0 || cfg.Alpha > 1 || math.IsNaN(cfg.Alpha) {
		return nil, fmt.Errorf("%w: alpha must be in (0, 1] (0: re-tuned)", ErrInvalidConfig)
	}
	alpha := 1.0
	if cfg.Alpha > 0 {
		alpha = cfg.Alpha
	}
	return &Queue{cfg: cfg, fns: map[string]*function{}, families: map[string]*books{}, byID: map[uint64]*entry{},
		alpha: alpha, metShare: 1}, nil
}

// Config returns the queue's configuration with defaults filled in.
func (q *Queue) Config() Config { return q.cfg }

// SetFunction registers a function or updates its SLO (0: none) and percentile (in (0, 100); 0 means 98).
// Its statistics and waiting requests are kept.
func (q *Queue) SetFunction(name string, slo time.Duration, percentile float64) error {
	if percentile == 0 {
		percentile = contract.DefaultPercentile
	}
	if percentile <= 0 || percentile >= 100 || math.IsNaN(percentile) {
		return fmt.Errorf("%w: percentile of %q must be in (0, 100)", ErrInvalidConfig, name)
	}
	if slo < 0 {
		return fmt.Errorf("%w: slo of %q must be >= 0", ErrInvalidConfig, name)
	}
	f := q.fns[name]
	if f == nil {
		f = &function{name: name, activeSlot: -1}
		q.fns[name] = f
		q.keep(f, name)
	}
	f.slo, f.p = slo, percentile/100
	q.changed = true
	return nil
}

// RemoveFunction forgets a function and returns its waiting requests in arrival order.
func (q *Queue) RemoveFunction(name string) []Request {
	f := q.fns[name]
	if f == nil {
		return nil
	}
	out := make([]Request, 0, f.count())
	es := append(slices.Clone(f.waiting), f.late...)
	slices.SortFunc(es, func(a, b *entry) int { return int(a.seq - b.seq) })
	for _, e := range es {
		out = append(out, e.Request)
		delete(q.byID, e.ID)
		q.cost -= e.Cost
	}
	q.n -= f.count()
	f.waiting, f.late = nil, nil
	q.deactivate(f)
	delete(q.fns, name)
	q.drop(f)
	q.changed = true
	return out
}

// SetFamily makes function's SLO bookkeeping that of family, shared with every other function of the queue set to
// the same family: the instances of one function (pool.InstanceKey) are judged by one SLO, their function's, over
// all their requests, so a new instance starts from its function's record, not from nothing. Call it before the
// function's requests are observed: what was observed under its previous books stays with them.
func (q *Queue) SetFamily(function, family string) error {
	f := q.fns[function]
	if f == nil {
		return fmt.Errorf("%w: %q", ErrUnknownFunction, function)
	}
	if f.books.key == family {
		return nil
	}
	p := f.p
	q.drop(f)
	q.keep(f, family)
	f.p = p
	q.changed = true
	return nil
}

// keep gives f the books of family, new ones when none is kept.
func (q *Queue) keep(f *function, family string) {
	b := q.families[family]
	if b == nil {
		b = &books{key: family, high: true}
		q.families[family] = b
	}
	b.refs++
	f.books = b
}

// drop releases f's books, forgotten once no function keeps them.
func (q *Queue) drop(f *function) {
	b := f.books
	if b.refs--; b.refs > 0 {
		return
	}
	delete(q.families, b.key)
	if i := slices.Index(q.observed, b); i >= 0 {
		q.observed = slices.Delete(q.observed, i, i+1)
	}
}

// Len is the number of waiting requests.
func (q *Queue) Len() int { return q.n }

// Cost is the predicted cost (Request.Cost) of the waiting requests together.
func (q *Queue) Cost() time.Duration { return q.cost }

// Waiting is the number of waiting requests of one function.
func (q *Queue) Waiting(function string) int {
	if f := q.fns[function]; f != nil {
		return f.count()
	}
	return 0
}

// Push adds a request.
func (q *Queue) Push(r Request) error {
	f := q.fns[r.Function]
	if f == nil {
		return fmt.Errorf("%w: %q", ErrUnknownFunction, r.Function)
	}
	if _, dup := q.byID[r.ID]; dup {
		return fmt.Errorf("%w: %d", ErrDuplicate, r.ID)
	}
	if r.Deadline.IsZero() && f.slo > 0 {
		r.Deadline = r.Arrival.Add(f.slo)
	}
	q.seq++
	e := &entry{Request: r, seq: q.seq, slack: math.MaxInt64, due: math.MaxInt64}
	if !r.Deadline.IsZero() {
		e.slack = r.Deadline.UnixNano() - int64((1+q.cfg.Margin)*float64(r.Cost))
		e.due = r.Deadline.UnixNano() - int64(r.Cost)
	}
	switch q.cfg.Order {
	case OrderFIFO, OrderTorpor:
		e.key = int64(e.seq)
	default:
		e.key = e.slack
	}
	heap.Push(&f.waiting, e)
	q.byID[r.ID] = e
	q.n++
	q.cost += r.Cost
	if f.activeSlot < 0 {
		f.activeSlot = len(q.active)
		q.active = append(q.active, f)
	}
	return nil
}

// Remove takes a waiting request out; it reports whether it was waiting.
func (q *Queue) Remove(id uint64) bool {
	e := q.byID[id]
	if e == nil {
		return false
	}
	f := q.fns[e.Function]
	if e.late {
		heap.Remove(&f.late, e.index)
	} else {
		heap.Remove(&f.waiting, e.index)
	}
	delete(q.byID, id)
	q.n--
	q.cost -= e.Cost
	if f.count() == 0 {
		q.deactivate(f)
	}
	return true
}

func (q *Queue) deactivate(f *function) {
	i := f.activeSlot
	if i < 0 {
		return
	}
	last := len(q.active) - 1
	q.active[i] = q.active[last]
	q.active[i].activeSlot = i
	q.active[last] = nil
	q.active = q.active[:last]
	f.activeSlot = -1
}

// Observe records the outcome of one served request of function for the SLO bookkeeping.
func (q *Queue) Observe(function string, onTime bool, latency time.Duration) {
	f := q.fns[function]
	if f == nil {
		return
	}
	if f.n() == 0 {
		q.observed = append(q.observed, f.books)
	}
	f.served++
	if onTime {
		f.onTime++
	}
	f.latSum += latency
	q.changed = true
}

// ObserveMissed records one request of function that was refused or dropped without being served (the admission
// rule's refusals): a miss in the SLO bookkeeping, as the function's SLO counts it, with no latency observed.
func (q *Queue) ObserveMissed(function string) {
	f := q.fns[function]
	if f == nil {
		return
	}
	if f.n() == 0 {
		q.observed = append(q.observed, f.books)
	}
	f.missed++
	q.changed = true
}

// Stats returns a function's SLO bookkeeping; ok is false for an unknown function.
func (q *Queue) Stats(function string) (FunctionStats, bool) {
	f := q.fns[function]
	if f == nil {
		return FunctionStats{}, false
	}
	return FunctionStats{Served: f.served, Missed: f.missed, OnTime: f.onTime, RRC: f.rrc(), High: f.high,
		MeanLat: f.meanLat(), Waiting: f.count()}, true
}

// Alpha is the current fraction of the expected cost admitted to the high-priority group.
func (q *Queue) Alpha() float64 { return q.alpha }

// Pop removes and returns the first request, in the queue's order, whose function eligible accepts (nil accepts
// all). It regroups first when RegroupEvery has passed since the last regrouping.
func (q *Queue) Pop(now time.Time, eligible func(function string) bool) (Request, bool) {
	f := q.pick(now, eligible)
	if f == nil {
		return Request{}, false
	}
	e := f.popHead()
	delete(q.byID, e.ID)
	q.n--
	q.cost -= e.Cost
	if f.count() == 0 {
		q.deactivate(f)
	}
	return e.Request, true
}

// Peek returns the request Pop would return, without removing it.
func (q *Queue) Peek(now time.Time, eligible func(function string) bool) (Request, bool) {
	f := q.pick(now, eligible)
	if f == nil {
		return Request{}, false
	}
	return f.head().Request, true
}

func (q *Queue) pick(now time.Time, eligible func(string) bool) *function {
	if q.n == 0 {
		return nil
	}
	grouped := q.cfg.Order == OrderTorpor || q.cfg.Order == OrderSLOAware
	if grouped && (q.lastGroup.IsZero() || now.Sub(q.lastGroup) >= q.cfg.RegroupEvery) {
		q.Regroup(now)
	}
	nowNS := now.UnixNano()
	rescue := q.cfg.RescueShare > 0 && q.metShare >= q.cfg.RescueShare
	var best *function
	var bTier int
	var bKey float64
	var bSeq uint64
	for _, f := range q.active {
		if eligible != nil && !eligible(f.name) {
			continue
		}
		if q.cfg.Order == OrderSLOAware {
			f.demoteLate(nowNS, rescue)
		}
		h := f.head()
		tier, key := 0, float64(h.key)
		switch q.cfg.Order {
		case OrderTorpor:
			if f.high {
				key = -f.need()
			} else {
				tier, key = 1, f.need()
			}
		case OrderSLOAware:
			if !f.high {
				tier = 3
			}
			switch {
			case h.late || h.slack == math.MaxInt64:
				tier += 2 // late or without a deadline: after every request that can still make it
			case q.cfg.SpareLast && f.lost():
				tier++ // its function is lost for now: with those that can spare a miss
				if q.pressed {
					key = math.Inf(1) // near capacity: after them
				}
			case q.cfg.SpareLast && f.spare():
				tier++ // its function can spare a miss: after those whose function cannot
				if q.pressed {
					key = -f.need() // near capacity: the most needy first, the richest last
				}
			}
		}
		if f.demoted {
			tier += 6 // after every other function's requests
		}
		if best == nil || tier < bTier || (tier == bTier && (key < bKey || (key == bKey && h.seq < bSeq))) {
			best, bTier, bKey, bSeq = f, tier, key, h.seq
		}
	}
	return best
}

// SetPressed tells the queue whether the node is near its capacity (the controller's overload control: the
// functions' demand above its target share of the GPUs). While it is, SpareLast orders the functions that can
// spare a miss most needy first (Torpor's need: mean latency x (p*n - m)), so the function with the most misses
// to spare goes last, instead of least slack first.
func (q *Queue) SetPressed(pressed bool) { q.pressed = pressed }

// SetDemoted demotes function's requests behind every request of the functions not demoted (demoted true), or
// restores them (false), in every order. The controller's overload control demotes the functions it sheds.
func (q *Queue) SetDemoted(function string, demoted bool) {
	if f := q.fns[function]; f != nil {
		f.demoted = demoted
	}
}

// Expire removes function's waiting requests that can no longer meet their deadline (deadline - Cost < now) and
// returns them, oldest first.
func (q *Queue) Expire(now time.Time, function string) []Request {
	f := q.fns[function]
	if f == nil || f.count() == 0 {
		return nil
	}
	nowNS := now.UnixNano()
	var out []*entry
	for _, h := range []*fnHeap{&f.waiting, &f.late} {
		first := len(out)
		for _, e := range *h {
			if e.due < nowNS {
				out = append(out, e)
			}
		}
		for _, e := range out[first:] {
			heap.Remove(h, e.index)
		}
	}
	if len(out) == 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b *entry) int { return int(a.seq - b.seq) })
	rs := make([]Request, len(out))
	for i, e := range out {
		rs[i] = e.Request
		delete(q.byID, e.ID)
		q.cost -= e.Cost
	}
	q.n -= len(out)
	if f.count() == 0 {
		q.deactivate(f)
	}
	return rs
}

// ExpireAll removes every function's waiting requests that can no longer meet their deadline and returns them,
// function by function, oldest first within each. With cost nil a request can no longer make it once its deadline
// minus its Cost at push has passed (see Expire); otherwise cost gives each function's predicted cost now (its
// model may have become resident since the request was pushed, so the cost at push would drop requests that can
// still make it); a negative cost keeps every request of that function (the caller exempts it).
func (q *Queue) ExpireAll(now time.Time, cost func(function string) time.Duration) []Request {
	var out []Request
	nowNS := now.UnixNano()
	for _, f := range slices.Clone(q.active) {
		fc := time.Duration(0)
		if cost != nil {
			if fc = cost(f.name); fc < 0 {
				continue
			}
		}
		var es []*entry
		for _, h := range []*fnHeap{&f.waiting, &f.late} {
			for _, e := range *h {
				due := e.due
				if cost != nil && !e.Deadline.IsZero() {
					due = e.Deadline.UnixNano() - int64(fc)
				}
				if due < nowNS {
					es = append(es, e)
				}
			}
		}
		if len(es) == 0 {
			continue
		}
		slices.SortFunc(es, func(a, b *entry) int { return int(a.seq - b.seq) })
		for _, e := range es {
			if e.late {
				heap.Remove(&f.late, e.index)
			} else {
				heap.Remove(&f.waiting, e.index)
			}
			delete(q.byID, e.ID)
			q.cost -= e.Cost
			q.n--
			out = append(out, e.Request)
		}
		if f.count() == 0 {
			q.deactivate(f)
		}
	}
	return out
}

// Regroup recomputes the high/low groups and, every AlphaWindow calls, re-tunes alpha. Pop calls it on schedule;
// call it directly only to force a regrouping.
func (q *Queue) Regroup(now time.Time) {
	q.lastGroup = now
	if q.changed {
		q.changed = false
		q.met, q.seen = q.group()
	}
	met, seen := q.met, q.seen
	if seen == 0 {
		return
	}
	q.metShare = float64(met) / float64(seen)
	q.groupRuns++
	if q.groupRuns < q.cfg.AlphaWindow || q.cfg.Alpha > 0 {
		return
	}
	q.groupRuns = 0
	ratio := float64(met) / float64(seen)
	const diff, scale, small = 0.04, 2.0, 1.01
	before := q.alpha
	// The trend is the relative change of the share since the last re-tuning. The first measurement sets the
	// reference (no trend); from a share of 0 any share above it is a rise and another 0 is flat, so alpha does
	// not keep doubling back while no function meets its SLO.
	var trend float64
	switch {
	case !q.hasOld:
		q.oldRatio, q.hasOld = ratio, true
	case q.oldRatio > 0:
		trend = (ratio - q.oldRatio) / q.oldRatio
	case ratio > 0:
		trend = math.Inf(1)
	}
	switch {
	case trend >= diff:
		q.alpha = min(1, q.alpha*scale)
		q.oldRatio = ratio
	case trend < -diff:
		q.alpha /= scale
		q.oldRatio = ratio
	default:
		q.alpha = min(1, q.alpha*small)
	}
	q.changed = q.changed || q.alpha != before
}

// group recomputes the high/low groups from the observed functions at the current alpha and returns how many of
// them meet their SLO.
func (q *Queue) group() (met, seen int) {
	type fc struct {
		f    *books
		cost float64
	}
	costs := make([]fc, 0, len(q.observed))
	var total float64
	for _, f := range q.observed {
		seen++
		if float64(f.onTime) >= f.p*float64(f.n()) {
			met++
		}
		costs = append(costs, fc{f, f.meanLat().Seconds() * f.rrc()})
	}
	slices.SortFunc(costs, func(a, b fc) int {
		if a.cost != b.cost {
			if a.cost < b.cost {
				return -1
			}
			return 1
		}
		if a.f.key < b.f.key {
			return -1
		}
		return 1
	})
	for _, c := range costs { // summed in sorted order so the result does not depend on map order
		if c.cost > 0 {
			total += c.cost
		}
	}
	limit, agg, over := total*q.alpha, 0.0, false
	for _, c := range costs {
		if c.cost > 0 && !over {
			agg += c.cost
			over = agg > limit
		}
		c.f.high = !over
	}
	return met, seen
}
