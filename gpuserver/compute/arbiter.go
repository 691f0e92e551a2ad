package compute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// DefaultPeriod is how often an arbiter issues tokens and moves shares (Dilu's 5 ms).
const DefaultPeriod = 5 * time.Millisecond

// Defaults of the controller (Config).
const (
	DefaultEmergencyStretch = 1.5
	DefaultIncrease         = 2.0
)

// ErrInvalid: a bad configuration or share.
var ErrInvalid = errors.New("compute share: invalid")

// ErrOvercommitted: the requests of a GPU's bindings would sum above 1 (the controller admits no such co-runner).
var ErrOvercommitted = errors.New("compute share: the requests of the GPU's bindings would exceed the GPU")

// Clock is the arbiter's time: sim.WallClock, or a test's clock.
type Clock interface {
	Now() time.Time
	SleepUntil(ctx context.Context, t time.Time) error
}

// Config configures an Arbiter.
type Config struct {
	// Period between token issues; DefaultPeriod when 0.
	Period time.Duration
	// Clock; required.
	Clock Clock
	// EmergencyStretch: a binding whose last launch cycle exceeds this times its target cycle is scaled up to its
	// limit at once; DefaultEmergencyStretch when 0.
	EmergencyStretch float64
	// Increase is the factor a binding held at its gate grows by per period while the GPU has room;
	// DefaultIncrease when 0.
	Increase float64
	// Remote makes the arbiter the gpuserver's for a GPU whose bindings' gates are in other processes (the
	// tenants' executors, remote.go): it admits nothing itself, its gates' usage comes from their reports
	// (Decide), and what it decides travels to them as Grants.
	Remote bool
}

// State is where the controller holds a binding (Dilu's Algorithm 2).
type State string

// The controller's states.
const (
	StateRequest   State = "request"   // at its request, or holding what it has: it needs no more
	StateIdle      State = "idle"      // it launched nothing last period: back at its request, lent to neighbours
	StateEmergency State = "emergency" // its cycle stretched past the threshold: scaled up to its limit
	StateIncrease  State = "increase"  // held at its gate while the GPU had room: grown multiplicatively
)

// Arbiter issues the tokens of one GPU's shared bindings. It is safe for concurrent use.
type Arbiter struct {
	cfg Config

	mu    sync.Mutex
	gates []*Gate
	tick  chan struct{} // closed at every issue (and at Leave): waiting gates look again
	gen   uint64        // counts the closes of tick
	last  time.Time     // the last issue
	// granted: the shares are another arbiter's (the gpuserver's), applied by Apply (remote.go): a binding that
	// wakes takes its request back from its own bucket only; its neighbours give back at the next grant
	granted bool
	// leftSince: the bindings that left a remote arbiter since its last grants (Decide, Grants)
	leftSince []string
}

// NewArbiter returns an arbiter with no bindings; Run (or the caller's Tick) issues its tokens.
func NewArbiter(cfg Config) (*Arbiter, error) {
	cfg.Period = cmp.Or(cfg.Period, DefaultPeriod)
	cfg.EmergencyStretch = cmp.Or(cfg.EmergencyStretch, DefaultEmergencyStretch)
	cfg.Increase = cmp.Or(cfg.Increase, DefaultIncrease)
	switch {
	case cfg.Clock == nil:
		return nil, fmt.Errorf("%w: arbiter without a clock", ErrInvalid)
	case cfg.Period < 0:
		return nil, fmt.Errorf("%w: period %v", ErrInvalid, cfg.Period)
	case !(cfg.EmergencyStretch > 1):
		return nil, fmt.Errorf("%w: emergency stretch %v must be above 1", ErrInvalid, cfg.EmergencyStretch)
	case !(cfg.Increase > 1):
		return nil, fmt.Errorf("%w: increase %v must be above 1", ErrInvalid, cfg.Increase)
	}
	return &Arbiter{cfg: cfg, tick: make(chan struct{}), last: cfg.Clock.Now()}, nil
}

// Period is the arbiter's period.
func (a *Arbiter) Period() time.Duration { return a.cfg.Period }

// Join adds a shared binding at its request; its gate has its request's tokens for the current period. A binding
// whose request is the whole GPU needs no gate (its launches bypass: pool.FunctionSpec.Exclusive) and is refused
// here, as are shares outside (0, 1], a request above the limit, and a request the GPU's others leave no room for
// (ErrOvercommitted).
func (a *Arbiter) Join(binding string, request, limit float64) (*Gate, error) {
	if !(request > 0 && request < 1) || !(limit >= request && limit <= 1) {
		return nil, fmt.Errorf("%w: binding %s: request %v, limit %v (want 0 < request < 1, request <= limit <= 1)",
			ErrInvalid, binding, request, limit)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	sum := request
	for _, g := range a.gates {
		if g.binding == binding {
			return nil, fmt.Errorf("%w: binding %s joined twice", ErrInvalid, binding)
		}
		sum += g.request
	}
	if sum > 1+1e-9 {
		return nil, fmt.Errorf("%w: binding %s: requests would sum to %.3f", ErrOvercommitted, binding, sum)
	}
	g := &Gate{a: a, binding: binding, request: request, limit: limit, share: request, state: StateIdle,
		issued: time.Duration(request * float64(a.cfg.Period))} // a period's tokens at once
	a.gates = append(a.gates, g)
	return g, nil
}

// Leave removes a binding (its request ended); its gate admits nothing more, and what it used is no one's.
func (a *Arbiter) Leave(g *Gate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i := slices.Index(a.gates, g); i >= 0 {
		a.gates = slices.Delete(a.gates, i, i+1)
		if a.cfg.Remote {
			a.leftSince = append(a.leftSince, g.binding)
		}
	}
	g.left = true
	a.broadcastLocked()
}

func (a *Arbiter) broadcastLocked() {
	a.gen++
	close(a.tick)
	a.tick = make(chan struct{})
}

// Run issues tokens every period until ctx ends (ctx's error).
func (a *Arbiter) Run(ctx context.Context) error {
	a.mu.Lock()
	next := a.last
	a.mu.Unlock()
	for {
		next = next.Add(a.cfg.Period)
		if err := a.cfg.Clock.SleepUntil(ctx, next); err != nil {
			return err
		}
		a.Tick(next)
	}
}

// remainingLocked is the part of the current period still to come at now, in [0, 1].
func (a *Arbiter) remainingLocked(now time.Time) float64 {
	left := a.last.Add(a.cfg.Period).Sub(now)
	return min(1, max(0, float64(left)/float64(a.cfg.Period)))
}

// wakeLocked gives an idle binding that launches again its request at once (its bucket of tokens stayed full),
// taking back from the neighbours that borrowed it what they were issued beyond their new share for the rest of
// the period.
func (a *Arbiter) wakeLocked(g *Gate) {
	g.state, g.share = StateRequest, g.request
	if a.granted {
		g.woke = true // its neighbours, maybe in other processes, give back at the next grant (Decide)
		return
	}
	frac := a.remainingLocked(a.cfg.Clock.Now())
	before := map[*Gate]float64{}
	for _, o := range a.gates {
		before[o] = o.share
	}
	a.fitLocked()
	for _, o := range a.gates {
		if cut := before[o] - o.share; o != g && cut > 0 {
			o.issued -= time.Duration(cut * frac * float64(a.cfg.Period))
		}
	}
}

// Tick issues the tokens of the period starting at now and moves each binding's share (controller.go).
func (a *Arbiter) Tick(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = now
	a.controlLocked()
	period := float64(a.cfg.Period)
	for _, g := range a.gates {
		// An idle binding's share is lent to its neighbours (controlLocked leaves it out of the sum), but its
		// bucket stays full: when it launches again it runs at once, and the borrowers give back (wakeLocked).
		cap := time.Duration(g.share * period)
		g.issued += cap
		if bal := g.balanceLocked(); bal > cap { // tokens do not pile up beyond one period's
			g.issued -= bal - cap
		}
		// a launch still waiting at the gate is demand of the new period too
		g.launches, g.blocked, g.waited, g.cycle = 0, g.waiting, 0, 0
	}
	a.broadcastLocked()
}

// Share is one binding's state at an arbiter.
type Share struct {
	Binding string  `json:"binding"`
	Request float64 `json:"request"`
	Limit   float64 `json:"limit"`
	// Share is the share the binding holds now, State why.
	Share float64 `json:"share"`
	State State   `json:"state"`
	// Used is the GPU time its work occupied, Waited how long its launches waited at the gate, Launches how
	// many it admitted.
	Used     time.Duration `json:"used_ns"`
	Waited   time.Duration `json:"waited_ns"`
	Launches uint64        `json:"launches"`
}

// Shares lists the bindings in the order they joined.
func (a *Arbiter) Shares() []Share {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Share, 0, len(a.gates))
	for _, g := range a.gates {
		g.sampleLocked()
		out = append(out, Share{Binding: g.binding, Request: g.request, Limit: g.limit, Share: round(g.share),
			State: g.state, Used: g.used, Waited: g.waitedTotal, Launches: g.admittedTotal})
	}
	return out
}

func round(v float64) float64 { return math.Round(v*1e6) / 1e6 }
