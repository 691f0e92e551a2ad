package controller

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Overload control (the faas-gpu policy). The objective is the number of functions meeting their SLO, and every
// function counts the same, so when the node cannot serve every function the best it can do is to serve as many
// as fit: the functions with the smallest GPU demand first. Every ShedEvery the controller estimates each
// function's demand - its arrival rate times the GPU time its requests hold a GPU for (swap and execution, as
// observed) - and admits functions cheapest first while their summed demand fits ShedTarget of the healthy GPUs'
// time. The rest are shed: their requests are answered at once with pool.ErrOverloaded (HTTP 429 with
// Retry-After, so a caller or the queue worker can go elsewhere), unless the node idles when they arrive (nothing
// queued, half of the GPUs free, the model on a free GPU: no swap, no eviction), in which case they are served. The decision is re-taken every interval, so
// functions come back as load falls. At moderate load everything fits and nothing is shed.
//
// While demand is shed, the target is tuned by feedback on the objective itself, functions rather than requests.
// A late request is rare and each can cost its function the SLO, so the feedback is asymmetric: an interval in
// which an admitted function had a request miss its deadline lowers the target by 5% (at most to 0.5), and only
// 15 intervals in a row without one raise it by 1% (at most to 1).

// Defaults of the overload control.
const (
	DefaultShedEvery  = 2 * time.Second
	DefaultShedTarget = 0.85
	minShedTarget     = 0.5
	// calmIntervals: the target rises only after this many intervals without a late admitted function.
	calmIntervals = 15
	// rateWeight is the weight of the last interval in a function's arrival rate.
	rateWeight = 0.3
)

// overload is the state of the overload control.
type overload struct {
	last   time.Time // start of the current interval
	target float64
	shed   int // functions shed at the last decision
	// outcomes of admitted functions' requests in the current interval
	lateFns   int // admitted functions with a late request in the current interval
	calm      int // intervals since an admitted function was late or the target rose
	decisions int
	// active lists the functions with arrivals in the current interval or a weighted rate above minRate; the
	// others have no demand and are never shed.
	active []*fnState
}

// minRate: a function whose weighted arrival rate decays below it (per second) counts as idle.
const minRate = 1e-4

// OverloadStatus reports the overload control's state.
type OverloadStatus struct {
	// Target is the share of the healthy GPUs' time admitted demand may take.
	Target float64
	// Shed is the number of functions shed at the last decision.
	Shed int
	// Decisions counts the decisions taken.
	Decisions int
}

// Overload returns the overload control's state (zero when the policy sheds nothing).
func (c *Controller) Overload() OverloadStatus {
	return OverloadStatus{Target: c.ov.target, Shed: c.ov.shed, Decisions: c.ov.decisions}
}

// Shed reports whether function is shed at the last decision.
func (c *Controller) Shed(function string) bool {
	fs := c.fns[function]
	return fs != nil && fs.shed
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
	every := c.cfg.ShedEvery
	if now.Sub(c.ov.last) < every {
		return
	}
	span := now.Sub(c.ov.last).Seconds()
	c.ov.last = now
	c.ov.decisions++
	// Feedback on the target, while shedding (the admitted demand at the target): an admitted function late in
	// the interval lowers it, none late raises it.
	c.ov.calm++
	switch {
	case c.ov.shed > 0 && c.ov.lateFns > 0:
		c.ov.target = max(minShedTarget, c.ov.target*0.95)
		c.ov.calm = 0
	case c.ov.shed > 0 && c.ov.calm >= calmIntervals:
		c.ov.target = min(1, c.ov.target*1.01)
		c.ov.calm = 0
	}
	c.ov.lateFns = 0
	healthy := 0
	for _, g := range c.gpus {
		if !g.unhealthy {
			healthy++
		}
	}
	type fd struct {
		fs     *fnState
		demand float64
	}
	ds := make([]fd, 0, len(c.ov.active))
	kept := c.ov.active[:0]
	for _, fs := range c.ov.active {
		fs.rate = (1-rateWeight)*fs.rate + rateWeight*float64(fs.arrivals)/span
		fs.arrivals = 0
		if fs.rate < minRate || c.fns[fs.Name] != fs { // idle, or deregistered
			fs.rate, fs.shed, fs.ovActive = 0, false, false
			continue
		}
		kept = append(kept, fs)
		ds = append(ds, fd{fs, fs.rate * fs.hold.Mean().Seconds()})
	}
	clear(c.ov.active[len(kept):])
	c.ov.active = kept
	slices.SortFunc(ds, func(a, b fd) int {
		if a.demand != b.demand {
			return cmp.Compare(a.demand, b.demand)
		}
		return cmp.Compare(a.fs.Name, b.fs.Name)
	})
	capacity := c.ov.target * float64(healthy)
	sum := 0.0
	c.ov.shed = 0
	for _, d := range ds {
		sum += d.demand
		d.fs.shed = sum > capacity
		if d.fs.shed {
			c.ov.shed++
		}
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

// admitShed decides at Submit for a request of a shed function: served when the node idles (nothing queued and
// at least half of the healthy GPUs free, so admitted arrivals still find one), otherwise refused with an error
// wrapping pool.ErrOverloaded.
func (c *Controller) admitShed(fs *fnState) error {
	if !fs.shed {
		return nil
	}
	if c.q.Len() == 0 {
		idle, healthy := 0, 0
		for _, g := range c.gpus {
			if !g.unhealthy {
				healthy++
				if g.busy == 0 {
					idle++
				}
			}
		}
		if 2*idle >= healthy && c.residentIdle(fs) >= 0 {
			return nil
		}
	}
	c.counts.Shed++
	return &pool.OverloadedError{Function: fs.Name, RetryAfter: c.cfg.ShedEvery,
		Reason: fmt.Sprintf("the node sheds %d of its functions, this one among the costliest", c.ov.shed)}
}

// observeShed feeds the target's feedback with the outcome of one request of an admitted function: the first
// late one of a function in an interval counts it late.
func (c *Controller) observeShed(fs *fnState, onTime bool) {
	if !c.tr.shed || fs.shed || fs.SLO == 0 || onTime || fs.lateIn == c.ov.decisions+1 {
		return
	}
	fs.lateIn = c.ov.decisions + 1
	c.ov.lateFns++
}
