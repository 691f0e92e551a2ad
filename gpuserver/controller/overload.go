package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Overload control (the faas-gpu policy). A node is judged on two figures: the functions meeting their SLO and
// the requests served within it. When the functions' demand exceeds what the GPUs can serve, some requests are
// late whatever the node does; the control chooses whose. Every ShedEvery it estimates each function's demand -
// its arrival rate times the GPU time its requests hold a GPU for (swap and execution, as observed) - and, when
// the summed demand exceeds the target share of the healthy GPUs' time, admits functions cheapest first within
// that share and sheds the rest.
//
// Shedding demotes, it does not refuse: a shed function's requests are queued behind every admitted request and
// served with the capacity the admitted functions leave, so the node stays work-conserving. A shed request is
// refused (pool.ErrOverloaded, HTTP 429 with Retry-After) only once it can no longer meet its deadline: at Submit
// when the work queued ahead of it already exceeds its deadline, and while it waits once deadline - cost has
// passed. Such a request would have been late anyway, so refusing it costs neither figure and frees the GPU time
// it would have taken; the caller (a router, the queue worker) may retry it elsewhere.
//
// Automatic mode (the default) sheds only when the node's model says shedding raises the requests served on
// time: with admitted demand A (arrival rate r_A), shed demand S (rate r_S, GPU time per request h_S) and GPU time
// C, it predicts r_A + min(r_S, (C - A) / h_S) requests per second on time with shedding against (r_A + r_S) x
// min(1, C / (A + S)) without, and sheds only when the first is not smaller; otherwise, and as soon as demand falls
// back under the target, it backs off and sheds nothing. Lateness alone never drives shedding: a node late because
// of link contention or bursts, with GPU time to spare, sheds nothing. An explicit target sheds whenever the
// demand exceeds it; off never sheds.

// Defaults of the overload control.
const (
	DefaultShedEvery = 2 * time.Second
	// DefaultShedTarget is the automatic mode's share of the healthy GPUs' time that admitted demand may take.
	DefaultShedTarget = 0.9
	// rateWeight is the weight of the last interval in a function's arrival rate.
	rateWeight = 0.1
	// minAdmitted, maxAdmittedLate and maxBackoff: the automatic mode's measured check judges an interval of
	// shedding by at least minAdmitted requests of admitted functions; more than maxAdmittedLate of them late
	// backs it off for 1, 2, 4 ... at most maxBackoff intervals.
	minAdmitted     = 20
	maxAdmittedLate = 0.02
	maxBackoff      = 32
	// sustained: the automatic mode starts shedding once the demand exceeded the target at this many decisions
	// in a row (a burst shorter than that is the queue's to absorb).
	sustained = 2
)

// Modes of the overload control.
const (
	OverloadAuto   = "auto"
	OverloadOff    = "off"
	OverloadTarget = "target"
)

// Overload is the overload control's setting.
type Overload struct {
	// Mode is OverloadAuto (also the empty string), OverloadOff or OverloadTarget.
	Mode string
	// Target (OverloadTarget) is the share of the healthy GPUs' time admitted demand may take, in (0, 1].
	Target float64
}

// ParseOverload reads a setting: "auto", "off", or a target share such as "0.85".
func ParseOverload(s string) (Overload, error) {
	switch s = strings.TrimSpace(s); s {
	case "", OverloadAuto:
		return Overload{Mode: OverloadAuto}, nil
	case OverloadOff:
		return Overload{Mode: OverloadOff}, nil
	}
	t, err := strconv.ParseFloat(s, 64)
	if err != nil || !(t > 0 && t <= 1) {
		return Overload{}, fmt.Errorf("%w: overload %q: want auto, off or a target share of GPU time in (0, 1]",
			ErrInvalidConfig, s)
	}
	return Overload{Mode: OverloadTarget, Target: t}, nil
}

// String is the setting as ParseOverload reads it.
func (o Overload) String() string {
	switch o.Mode {
	case OverloadOff:
		return OverloadOff
	case OverloadTarget:
		return strconv.FormatFloat(o.Target, 'g', -1, 64)
	}
	return OverloadAuto
}

func (o Overload) validate() error {
	switch o.Mode {
	case "", OverloadAuto, OverloadOff:
		return nil
	case OverloadTarget:
		if o.Target > 0 && o.Target <= 1 {
			return nil
		}
		return fmt.Errorf("%w: overload target %v must be in (0, 1]", ErrInvalidConfig, o.Target)
	}
	return fmt.Errorf("%w: overload mode %q (want auto, off or target)", ErrInvalidConfig, o.Mode)
}

// overload is the state of the overload control.
type overload struct {
	auto      bool
	target    float64
	last      time.Time // start of the current interval
	decisions int
	demand    float64 // summed demand at the last decision, GPU-seconds per second
	capacity  float64 // healthy GPUs at the last decision
	// shedding lists the functions shed at the last decision, by name.
	shedding []*fnState
	// active lists the functions with arrivals in the current interval or a weighted rate above minRate; the
	// others have no demand and are never shed.
	active []*fnState
	// refused holds the requests dropped from the queue since TakeRefused.
	refused []Refusal
	// Measured check of the automatic mode: the admitted functions' requests finished (and late) in the current
	// interval while it sheds; when shedding leaves them late, the control backs off for backoff intervals
	// (doubling while it keeps failing), sheds nothing until decision holdUntil.
	admDone, admLate int
	backoff          int
	holdUntil        int
	// over counts the decisions in a row at which the demand exceeded the target.
	over int
	// since is when the node last started shedding.
	since time.Time
}

// pressedShare: while the functions' demand exceeds this share of the healthy GPUs' time, the queue orders the
// functions that can spare a miss most needy first (queueing.Queue.SetPressed; the estimate is the overload
// control's, so with the control off they stay in least-slack order). Tuned on the Azure trace's hour 1 alone
// (models drawn with seeds 1-5 and 8; 0.65, 0.7, 0.75, 0.9 and always tried: docs/bench/policy-predictions.md).
const pressedShare = 0.75

// minRate: a function whose weighted arrival rate decays below it (per second) counts as idle.
const minRate = 1e-4

// OverloadStatus reports the overload control's state.
type OverloadStatus struct {
	// Setting is the control's setting ("auto", "off" or the target share).
	Setting string
	// Target is the share of the healthy GPUs' time admitted demand may take.
	Target float64
	// Demand is the functions' summed demand at the last decision, in GPUs (GPU-seconds per second), and
	// Capacity the healthy GPUs then.
	Demand, Capacity float64
	// Shedding lists the functions shed at the last decision, by name.
	Shedding []string
	// Decisions counts the decisions taken.
	Decisions int
}

// Overload returns the overload control's state.
func (c *Controller) Overload() OverloadStatus {
	st := OverloadStatus{Setting: c.cfg.Overload.String(), Target: c.ov.target, Demand: c.ov.demand,
		Capacity: c.ov.capacity, Decisions: c.ov.decisions, Shedding: []string{}}
	if !c.tr.shed {
		st.Setting = OverloadOff
	}
	for _, fs := range c.ov.shedding {
		st.Shedding = append(st.Shedding, fs.Name)
	}
	return st
}

// Shed reports whether function is shed at the last decision.
func (c *Controller) Shed(function string) bool {
	fs := c.fns[function]
	return fs != nil && fs.shed
}

// Refusal is a waiting request the overload control dropped: Err wraps pool.ErrOverloaded (an
// *pool.OverloadedError).
type Refusal struct {
	ID  uint64
	Err error
}

// TakeRefused returns the requests the overload control dropped from the queue since the last call (they could
// no longer meet their deadline); the caller answers each with its error.
func (c *Controller) TakeRefused() []Refusal {
	out := c.ov.refused
	c.ov.refused = nil
	return out
}

// refusedError is the error for a request of function that the overload control refused.
func (c *Controller) refusedError(function string) error {
	fs := c.fns[function]
	episode := uint64(0)
	if fs != nil {
		episode = fs.episode
	}
	return &pool.OverloadedError{Function: function, RetryAfter: c.cfg.ShedEvery, Episode: episode,
		Reason: fmt.Sprintf("the node sheds %d of its functions (demand %.2f of %.0f GPUs), this one among the "+
			"costliest, and the request could not meet its deadline", len(c.ov.shedding), c.ov.demand,
			c.ov.capacity)}
}

// maybeDecideShed re-takes the shedding decision when an interval has passed.
func (c *Controller) maybeDecideShed(now time.Time) {
	if !c.tr.shed {
		return
	}
	if c.ov.last.IsZero() {
		c.ov.last = now
		return
	}
	if now.Sub(c.ov.last) < c.cfg.ShedEvery {
		return
	}
	span := now.Sub(c.ov.last).Seconds()
	c.ov.last = now
	c.ov.decisions++
	if c.ov.auto && len(c.ov.shedding) > 0 && c.ov.admDone >= minAdmitted {
		if float64(c.ov.admLate) > maxAdmittedLate*float64(c.ov.admDone) {
			// Shedding did not bring the admitted functions' requests back on time: their lateness is not the
			// GPU time the shed functions take (link contention, bursts), so demoting more would not help.
			c.ov.backoff = min(maxBackoff, max(1, 2*c.ov.backoff))
			c.ov.holdUntil = c.ov.decisions + c.ov.backoff
		} else {
			c.ov.backoff = 0
		}
	}
	c.ov.admDone, c.ov.admLate = 0, 0
	healthy := 0
	for _, g := range c.gpus {
		if !g.unhealthy {
			healthy++
		}
	}
	type fd struct {
		fs           *fnState
		demand, rate float64
	}
	ds := make([]fd, 0, len(c.ov.active))
	kept := c.ov.active[:0]
	total := 0.0
	for _, fs := range c.ov.active {
		fs.rate = (1-rateWeight)*fs.rate + rateWeight*float64(fs.arrivals)/span
		fs.arrivals = 0
		if fs.rate < minRate || c.fns[fs.Name] != fs { // idle, or deregistered
			c.setShed(fs, false)
			fs.rate, fs.ovActive = 0, false
			continue
		}
		kept = append(kept, fs)
		d := fs.rate * fs.hold.Mean().Seconds()
		ds = append(ds, fd{fs, d, fs.rate})
		total += d
	}
	clear(c.ov.active[len(kept):])
	c.ov.active = kept
	slices.SortFunc(ds, func(a, b fd) int {
		if a.demand != b.demand {
			return cmp.Compare(a.demand, b.demand)
		}
		return cmp.Compare(a.fs.Name, b.fs.Name)
	})
	capacity := float64(healthy)
	limit := c.ov.target * capacity
	c.ov.demand, c.ov.capacity = total, capacity
	c.q.SetPressed(total > pressedShare*capacity)
	// Admitted: the cheapest functions whose demand fits under the limit.
	admitted, aDemand, aRate := 0, 0.0, 0.0
	for _, d := range ds {
		if aDemand+d.demand > limit {
			break
		}
		admitted++
		aDemand += d.demand
		aRate += d.rate
	}
	shed := admitted < len(ds)
	if shed {
		c.ov.over++
	} else {
		c.ov.over = 0
	}
	if shed && c.ov.auto {
		sDemand, sRate := total-aDemand, 0.0
		for _, d := range ds[admitted:] {
			sRate += d.rate
		}
		without := (aRate + sRate) * min(1, capacity/total)
		with := aRate
		if sDemand > 0 {
			with += min(sRate, max(0, capacity-aDemand)/(sDemand/sRate))
		}
		shed = with >= without && c.ov.decisions >= c.ov.holdUntil &&
			(c.ov.over >= sustained || len(c.ov.shedding) > 0)
	}
	if !shed {
		admitted = len(ds)
	}
	for i, d := range ds {
		c.setShed(d.fs, i >= admitted)
	}
	if len(c.ov.shedding) == 0 && admitted < len(ds) {
		c.ov.since = now
	}
	c.ov.shedding = c.ov.shedding[:0]
	for _, d := range ds[admitted:] {
		c.ov.shedding = append(c.ov.shedding, d.fs)
	}
	slices.SortFunc(c.ov.shedding, func(a, b *fnState) int { return cmp.Compare(a.Name, b.Name) })
}

// setShed sheds or admits fs; a function shed anew starts an episode (OverloadedError.Episode).
func (c *Controller) setShed(fs *fnState, shed bool) {
	if fs.shed == shed {
		return
	}
	fs.shed = shed
	if shed {
		fs.episode++
	}
	if c.fns[fs.Name] == fs {
		c.q.SetDemoted(fs.Name, shed)
	}
}

// observeShed feeds the automatic mode's measured check with one finished request of fs that arrived at
// arrival: only requests that arrived while the node shed count (those queued before met the backlog shedding
// is to remove).
func (c *Controller) observeShed(fs *fnState, onTime bool, arrival time.Time) {
	if !c.ov.auto || fs.shed || len(c.ov.shedding) == 0 || fs.SLO == 0 || arrival.Before(c.ov.since) {
		return
	}
	c.ov.admDone++
	if !onTime {
		c.ov.admLate++
	}
}

// arrived counts a request of fs for the demand estimate.
func (c *Controller) arrived(fs *fnState) {
	fs.arrivals++
	if c.tr.shed && !fs.ovActive {
		fs.ovActive = true
		c.ov.active = append(c.ov.active, fs)
	}
}

// admitShed decides at Submit for a request of a shed function: queued behind the admitted requests unless the
// work queued ahead of it, spread over the healthy GPUs, already leaves no time to serve it before its deadline.
func (c *Controller) admitShed(now time.Time, fs *fnState) error {
	if !fs.shed || fs.SLO == 0 {
		return nil
	}
	healthy := 0
	var soonest time.Duration = -1
	for _, g := range c.gpus {
		if g.unhealthy {
			continue
		}
		healthy++
		left := time.Duration(0)
		if g.busy != 0 {
			left = max(0, g.busyUntil.Sub(now))
		}
		if soonest < 0 || left < soonest {
			soonest = left
		}
	}
	if healthy == 0 {
		return nil // the request fails as every request does on a node without a healthy GPU
	}
	start := max(0, soonest) + c.q.Cost()/time.Duration(healthy)
	if start+c.predictCost(fs) <= fs.SLO {
		return nil
	}
	c.counts.Shed++
	fs.refused++
	return c.refusedError(fs.Name)
}

// expireShed drops the waiting requests of shed functions that can no longer meet their deadline.
func (c *Controller) expireShed(now time.Time) {
	for _, fs := range c.ov.shedding {
		if !fs.shed || c.q.Waiting(fs.Name) == 0 {
			continue
		}
		for _, r := range c.q.Expire(now, fs.Name) {
			delete(c.reqs, r.ID)
			c.counts.Shed++
			fs.refused++
			c.ov.refused = append(c.ov.refused, Refusal{ID: r.ID, Err: c.refusedError(fs.Name)})
		}
	}
}
