package compute

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// ErrNotMetered: a shared binding's stream cannot measure its work (device.ComputeMeter), so its share cannot be
// enforced; its launches are refused rather than run unmetered.
var ErrNotMetered = errors.New("compute share: the stream does not measure its GPU time")

// ErrLeft: the binding left its GPU's arbiter (Arbiter.Leave); its gate admits nothing more.
var ErrLeft = errors.New("compute share: the binding left its GPU")

// Gate releases one binding's work against its tokens. Its fields are guarded by its arbiter's lock.
type Gate struct {
	a       *Arbiter
	binding string

	request, limit float64
	share          float64 // current (controller.go)
	want           float64 // what the controller wants for it this period
	lastOps        uint64  // ops measured at the last issue
	state          State
	left           bool
	open           bool // no longer bound on the GPU (a grant said it left): launches pass (remote.go)
	woke           bool // it launched again after a period idle (this period)
	remotePending  bool // a remote gate: admitted launches were not measured yet (its report said)

	meter      device.ComputeMeter
	baseOps    uint64        // the meter's count when it was attached
	baseWork   time.Duration // and its time
	usedBefore time.Duration // GPU time measured on the meters attached before
	ops        uint64        // operations measured since attached
	used       time.Duration // GPU time measured, every meter attached so far
	issued     time.Duration // tokens issued so far
	admitted   uint64        // launches admitted since the meter was attached
	perOp      time.Duration // mean measured cost of a launch (what an unmeasured one is charged)

	// this period
	launches  int    // admitted
	blocked   bool   // a launch waited for tokens
	waiting   bool   // a launch waits for tokens now
	waitGen   uint64 // the arbiter's generation it waits in
	waited    time.Duration
	cycle     time.Duration // the last cycle reported (Cycle), 0 when none this period
	target    time.Duration // the cycle the binding should keep (its exclusive cycle), 0: learnt
	targetSet bool          // SetTarget gave it

	// totals
	admittedTotal uint64
	waitedTotal   time.Duration
}

// Binding names the gate's binding.
func (g *Gate) Binding() string { return g.binding }

// Attach makes m the stream whose work the gate measures (the binding's stream on its GPU). A binding's stream may
// be replaced (its context was torn down and made again): attaching the new one keeps what was measured.
func (g *Gate) Attach(m device.ComputeMeter) {
	a := g.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if g.meter == m {
		return
	}
	g.sampleLocked()
	g.meter = m
	g.usedBefore = g.used
	g.baseOps, g.baseWork = m.ComputeWork()
	g.ops, g.admitted = 0, 0 // launches of the old stream not measured yet are forgotten
}

// sampleLocked reads the meter: how many of the admitted launches were measured and what they used.
func (g *Gate) sampleLocked() {
	if g.meter == nil {
		return
	}
	n, w := g.meter.ComputeWork()
	if n < g.baseOps || w < g.baseWork { // a meter never goes back
		return
	}
	g.ops = n - g.baseOps
	g.used = g.usedBefore + (w - g.baseWork)
	if g.ops > 0 {
		g.perOp = (w - g.baseWork) / time.Duration(g.ops)
	}
}

// balanceLocked is the tokens left: issued, less what was measured, less the admitted launches not measured yet
// at the binding's mean cost.
func (g *Gate) balanceLocked() time.Duration {
	pending := time.Duration(0)
	if g.admitted > g.ops {
		if g.ops == 0 { // nothing measured yet: one launch at a time until the first measurement
			return min(0, g.issued-g.used)
		}
		pending = time.Duration(g.admitted-g.ops) * g.perOp
	}
	return g.issued - g.used - pending
}

// Admit waits until the binding has tokens and counts one launch against them; it returns ctx's error when ctx ends
// first, ErrLeft after Leave, ErrNotMetered when no meter is attached.
func (g *Gate) Admit(ctx context.Context) error {
	a := g.a
	a.mu.Lock()
	if g.meter == nil {
		a.mu.Unlock()
		return fmt.Errorf("%w: binding %s", ErrNotMetered, g.binding)
	}
	var since time.Time
	for {
		if g.left {
			a.mu.Unlock()
			return fmt.Errorf("%w: %s", ErrLeft, g.binding)
		}
		if g.open {
			a.mu.Unlock()
			return nil
		}
		g.sampleLocked()
		if g.state == StateIdle { // it launches again: its request is its own from now on (reclaimed at once)
			a.wakeLocked(g)
		}
		if g.balanceLocked() > 0 {
			g.admitted++
			g.admittedTotal++
			g.launches++
			if !since.IsZero() {
				w := a.cfg.Clock.Now().Sub(since)
				g.waited += w
				g.waitedTotal += w
			}
			a.mu.Unlock()
			return nil
		}
		g.blocked = true
		if since.IsZero() {
			since = a.cfg.Clock.Now()
		}
		tick := a.tick
		g.waiting, g.waitGen = true, a.gen
		a.mu.Unlock()
		select {
		case <-tick:
		case <-ctx.Done():
			a.mu.Lock()
			g.waiting = false
			a.mu.Unlock()
			return ctx.Err()
		}
		a.mu.Lock()
		g.waiting = false
	}
}

// Cycle reports one launch cycle of the binding: the GPU time of one request from its first launch to its
// completion (an inference batch, Dilu's cycle). A cycle stretched past the controller's threshold scales the
// binding up at once.
func (g *Gate) Cycle(d time.Duration) {
	a := g.a
	a.mu.Lock()
	defer a.mu.Unlock()
	g.cycle = max(g.cycle, d)
}

// SetTarget sets the cycle the binding should keep (its cycle when exclusive, from a profile); without one the
// gate learns it as the shortest cycle seen.
func (g *Gate) SetTarget(d time.Duration) {
	a := g.a
	a.mu.Lock()
	defer a.mu.Unlock()
	g.target, g.targetSet = d, d > 0
}
