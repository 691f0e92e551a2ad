package autoscale

import (
	"testing"
	"time"
)

// clock is a test's virtual time: the autoscaler has no clock of its own.
type clock struct{ now time.Time }

func (c *clock) tick(d time.Duration) time.Time { c.now = c.now.Add(d); return c.now }

// look is one observation of a test and what it expects.
type look struct {
	s       *Scaler
	p       Policy
	c       *clock
	current uint64
	t       *testing.T
}

// observe advances the clock by d, observes load and applies the decision; it returns the decision (ok false:
// none).
func (l *look) observe(d time.Duration, load uint64) (Decision, bool) {
	l.t.Helper()
	dec, ok := l.s.Observe(l.c.tick(d), l.p, l.current, load)
	if ok {
		if dec.From != l.current {
			l.t.Fatalf("decision %+v: from %d, but the count is %d", dec, dec.From, l.current)
		}
		l.current = dec.To
	}
	return dec, ok
}

func newLook(t *testing.T, p Policy, window time.Duration, current uint64) *look {
	return &look{s: NewScaler(window), p: p, c: &clock{now: time.Unix(1000, 0)}, current: current, t: t}
}

var minOneMaxEight = Policy{Autoscaled: true, Min: 1, Max: 8, Target: 1, Proportion: 0.9,
	ZeroDuration: 15 * time.Minute}

// TestScalerUpAtOnceDownAfterTheWindow: 20 requests in flight take min 1 / max 8 to 8 at the first look; once the
// load ends the count stays for the 40 s window, then drops to 1.
func TestScalerUpAtOnceDownAfterTheWindow(t *testing.T) {
	l := newLook(t, minOneMaxEight, 40*time.Second, 1)
	if d, ok := l.observe(time.Second, 0); ok {
		t.Fatalf("idle at min: %+v", d)
	}
	d, ok := l.observe(time.Second, 20)
	if !ok || d.To != 8 || d.Direction != Up {
		t.Fatalf("20 in flight: %+v %v, want up to 8", d, ok)
	}
	for range 30 { // steady load
		if d, ok := l.observe(time.Second, 20); ok {
			t.Fatalf("steady load: %+v", d)
		}
	}
	for i := range 40 { // the load has ended: the window holds the count
		if d, ok := l.observe(time.Second, 0); ok {
			t.Fatalf("%d s after the load: %+v, want nothing before 40 s", i+1, d)
		}
	}
	d, ok = l.observe(time.Second, 0)
	if !ok || d.To != 1 || d.Direction != Down {
		t.Fatalf("41 s after the load: %+v %v, want down to 1", d, ok)
	}
}

// TestScalerKeepsReplicasThroughABriefDip: a dip shorter than the window scales nothing down; a partial drop
// scales down to the highest count of the window.
func TestScalerKeepsReplicasThroughABriefDip(t *testing.T) {
	l := newLook(t, minOneMaxEight, 40*time.Second, 1)
	l.observe(time.Second, 20)
	for range 20 {
		if d, ok := l.observe(time.Second, 0); ok {
			t.Fatalf("dip: %+v", d)
		}
	}
	l.observe(time.Second, 20)
	for range 39 {
		if d, ok := l.observe(time.Second, 4); ok { // ceil(4/0.9) = 5 wanted
			t.Fatalf("within the window: %+v", d)
		}
	}
	d, ok := l.observe(2*time.Second, 4)
	if !ok || d.To != 5 {
		t.Fatalf("after the window: %+v %v, want down to 5", d, ok)
	}
}

// TestScalerFormula: OpenFaaS's example (capacity, target 5, proportion 1.0, 15 in flight: 3 replicas), and a load
// at exactly target x proportion per replica asks for no extra replica.
func TestScalerFormula(t *testing.T) {
	for _, c := range []struct {
		target, proportion float64
		load, want         uint64
	}{
		{5, 1, 15, 3},
		{1, 0.9, 9, 10},
		{1, 0.9, 1, 2},
		{50, 0.9, 20, 1},
		{1, 1, 30, 20},
		{1e-300, 1e-300, 1, 20}, // no overflow: the most
		{1, 1, 0, 1},
	} {
		p := Policy{Autoscaled: true, Min: 1, Max: 20, Target: c.target, Proportion: c.proportion}
		l := newLook(t, p, 0, 1)
		l.observe(time.Second, c.load)
		if l.current != c.want {
			t.Errorf("target %g x %g, %d in flight: %d replicas, want %d", c.target, c.proportion, c.load,
				l.current, c.want)
		}
	}
}

// TestScalerBoundsAndCountsSetFromOutside: a count above max goes to max at once, one below min to min; a count
// faas-cli scale set is kept for a window before the load's count replaces it.
func TestScalerBoundsAndCountsSetFromOutside(t *testing.T) {
	l := newLook(t, minOneMaxEight, 40*time.Second, 10)
	if d, ok := l.observe(time.Second, 0); !ok || d.To != 8 {
		t.Fatalf("10 replicas, max 8: %+v %v", d, ok)
	}
	l.p.Min = 2
	if d, ok := l.observe(time.Second, 0); ok { // 8 stays for the window
		t.Fatalf("%+v", d)
	}
	l.current = 4 // faas-cli scale --replicas 4
	for range 40 {
		if d, ok := l.observe(time.Second, 0); ok {
			t.Fatalf("a count set from outside: %+v, want it kept for the window", d)
		}
	}
	if d, ok := l.observe(2*time.Second, 0); !ok || d.To != 2 {
		t.Fatalf("after the window: %+v %v, want down to min 2", d, ok)
	}
	l.current = 1 // below min
	if d, ok := l.observe(time.Second, 0); !ok || d.To != 2 || d.Direction != Up {
		t.Fatalf("below min: %+v %v", d, ok)
	}
}

// TestScalerScalesToZeroAfterTheIdlePeriod: only with Zero; never before ZeroDuration without a request; a
// function at zero stays there until a request wakes it, and its idle period starts again then.
func TestScalerScalesToZeroAfterTheIdlePeriod(t *testing.T) {
	l := newLook(t, minOneMaxEight, 40*time.Second, 1)
	for range 20 {
		if d, ok := l.observe(time.Minute, 0); ok {
			t.Fatalf("without %s: %+v", LabelZero, d)
		}
	}
	p := minOneMaxEight
	p.Zero, p.ZeroDuration = true, 10*time.Minute
	l = newLook(t, p, 40*time.Second, 1)
	l.observe(time.Second, 3) // busy: 4 replicas
	for range 9 {
		if d, ok := l.observe(time.Minute, 0); ok && d.Direction == Zero {
			t.Fatalf("before 10 min idle: %+v", d)
		}
	}
	d, ok := l.observe(time.Minute, 0)
	if !ok || d.To != 0 || d.Direction != Zero {
		t.Fatalf("10 min idle: %+v %v, want zero", d, ok)
	}
	for range 30 {
		if d, ok := l.observe(time.Minute, 0); ok {
			t.Fatalf("at zero: %+v", d)
		}
	}
	l.current = 1             // a request woke it
	l.observe(time.Second, 1) // its request: up to 2 (a replica is full at 0.9 requests), down again later
	for range 9 {
		if d, ok := l.observe(time.Minute, 0); ok && d.Direction != Down {
			t.Fatalf("woken %+v", d)
		}
	}
	if d, ok := l.observe(time.Minute, 0); !ok || d.To != 0 {
		t.Fatalf("10 min after the wake: %+v %v, want zero", d, ok)
	}
}

// TestScalerDefaultsOneReplicaPerRequest: with the labels' defaults (Parse of a function that asks for autoscaling
// with max alone), N requests in flight ask for N replicas: one GPU replica (one model copy) per request, not
// OpenFaaS Pro's ceil(N / 0.9).
func TestScalerDefaultsOneReplicaPerRequest(t *testing.T) {
	p, err := Parse(map[string]string{LabelMax: "10"}, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, load := range []uint64{1, 2, 5, 9, 10} {
		l := newLook(t, p, 0, 1)
		l.observe(time.Second, load)
		if l.current != load {
			t.Errorf("defaults %+v, %d in flight: %d replicas, want %d", p, load, l.current, load)
		}
	}
}
