package autoscale

import (
	"fmt"
	"math"
	"time"
)

// DefaultScaleDownWindow is how long a lower replica count must be all that is wanted before the function scales
// down to it: Dilu scales in after 40 s.
const DefaultScaleDownWindow = 40 * time.Second

// Direction says which way a decision goes.
type Direction string

const (
	Up   Direction = "up"
	Down Direction = "down"
	Zero Direction = "zero"
)

// Decision is a new replica count for a function and why.
type Decision struct {
	From, To  uint64
	Direction Direction
	Reason    string
}

// recommendation is a replica count wanted at a moment.
type recommendation struct {
	at       time.Time
	replicas uint64
}

// Scaler decides one function's replica count. It remembers the counts recommended over the last window (a
// count set from outside, by faas-cli scale or a wake from zero, counts as recommended when it is first seen) and
// when the function last had a request. It is not safe for concurrent use: one driver owns it.
type Scaler struct {
	window   time.Duration
	recs     []recommendation
	lastBusy time.Time
	last     uint64 // the count after the previous observation
	started  bool
}

// NewScaler returns a Scaler whose scale-down stabilisation window is window (0: scale down at once).
func NewScaler(window time.Duration) *Scaler { return &Scaler{window: window} }

// Observe takes, at now, the function's policy, its replica count and its load (the most requests it had in flight
// at once since the previous observation: proxied and waiting for a replica), and returns the count it should have
// (ok false: keep the count). The rules:
//
//   - a function at zero stays there: a request wakes it (scale from zero, the proxy's job);
//   - with Zero, a function without a request for ZeroDuration goes to zero;
//   - a count above Max or below max(Min, 1) is brought within them at once;
//   - the count wanted is ceil(load / (Target x Proportion)) within those bounds (OpenFaaS Pro's formula): a
//     higher count is applied at once, a lower one only once no higher count was wanted over the window, and then
//     the highest count wanted over the window.
func (s *Scaler) Observe(now time.Time, p Policy, current, load uint64) (Decision, bool) {
	if !s.started {
		s.started, s.lastBusy = true, now
	}
	if s.last == 0 && current > 0 { // woken from zero (or first seen): a request just came
		s.lastBusy = now
	}
	if current != s.last || len(s.recs) == 0 {
		s.recs = append(s.recs, recommendation{now, current})
	}
	s.last = current
	if load > 0 {
		s.lastBusy = now
	}
	if current == 0 {
		s.recs = s.recs[:0]
		return Decision{}, false
	}
	if p.Zero && load == 0 && now.Sub(s.lastBusy) >= p.ZeroDuration {
		s.recs = s.recs[:0]
		return s.set(current, 0, Zero, fmt.Sprintf("no request for %s (%s %s)", now.Sub(s.lastBusy).Round(time.Second),
			LabelZeroDuration, p.ZeroDuration))
	}
	floor := p.Wake()
	perReplica := p.Target * p.Proportion
	wanted := p.Max
	if w := math.Ceil(float64(load)/perReplica - 1e-9); w < float64(p.Max) { // NaN and +Inf: Max
		wanted = uint64(max(w, 0))
	}
	wanted = min(max(wanted, floor), p.Max)
	s.recs = append(s.recs, recommendation{now, wanted})
	s.expire(now)
	switch {
	case current > p.Max:
		return s.set(current, p.Max, Down, fmt.Sprintf("above %s %d", LabelMax, p.Max))
	case current < floor:
		return s.set(current, floor, Up, fmt.Sprintf("below %s %d", LabelMin, floor))
	case wanted > current:
		return s.set(current, wanted, Up, fmt.Sprintf("%d requests in flight, %g per replica (target %g x %g)",
			load, perReplica, p.Target, p.Proportion))
	case wanted < current:
		highest := wanted
		for _, r := range s.recs {
			highest = max(highest, r.replicas)
		}
		if highest < current {
			return s.set(current, highest, Down, fmt.Sprintf("at most %d replicas wanted over %s (%d requests in "+
				"flight now)", highest, s.window, load))
		}
	}
	return Decision{}, false
}

// set records a decision's count and returns the decision.
func (s *Scaler) set(from, to uint64, dir Direction, reason string) (Decision, bool) {
	s.last = to
	return Decision{From: from, To: to, Direction: dir, Reason: reason}, true
}

// expire drops the recommendations older than the window.
func (s *Scaler) expire(now time.Time) {
	keep := s.recs[:0]
	for _, r := range s.recs {
		if now.Sub(r.at) <= s.window {
			keep = append(keep, r)
		}
	}
	s.recs = keep
}

// Config is how a backend drives its autoscaler.
type Config struct {
	// Interval between two looks at the functions' load; 0 means 1s.
	Interval time.Duration
	// ScaleDownWindow: a function scales down only to the highest count wanted over this long; 0 means
	// DefaultScaleDownWindow, negative scales down at once.
	ScaleDownWindow time.Duration
	// Metrics, when set, receives every look and decision.
	Metrics *Metrics
}

// DefaultInterval is how often the autoscaler looks at the functions by default.
const DefaultInterval = time.Second

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	switch {
	case c.ScaleDownWindow == 0:
		c.ScaleDownWindow = DefaultScaleDownWindow
	case c.ScaleDownWindow < 0:
		c.ScaleDownWindow = 0
	}
	return c
}
