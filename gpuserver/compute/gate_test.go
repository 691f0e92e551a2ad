package compute

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Two busy co-runners at 0.3 and 0.7 of one timed virtual GPU receive those shares of its time within 5%, and the
// GPU stays busy: with limits equal to their requests (static shares) and with room to grow that neither gets
// (Dilu's controller: both are busy, so neither grows).
func TestGateFairnessBusyCoRunners(t *testing.T) {
	for _, tc := range []struct {
		name       string
		limA, limB float64
	}{{"static", 0.3, 0.7}, {"elastic", 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			a := r.corunner("a", 0.3, tc.limA, 200*time.Microsecond)
			b := r.corunner("b", 0.7, tc.limB, 200*time.Microsecond)
			for range 5 { // warm up: the gates learn their launches' cost
				r.period()
			}
			ua, ub := a.used(), b.used()
			const periods = 100
			for range periods {
				r.period()
			}
			da, db := a.used()-ua, b.used()-ub
			got := float64(da) / float64(da+db)
			t.Logf("a received %.4f of the GPU's work (a %v, b %v over %d periods)", got, da, db, periods)
			if math.Abs(got-0.3) > 0.05*0.3 {
				t.Errorf("a received %.4f of the GPU's work (a %v, b %v), want 0.3 within 5%%", got, da, db)
			}
			window := periods * r.arb.Period()
			if util := float64(da+db) / float64(window); util < 0.95 || util > 1.05 {
				t.Errorf("the co-runners used %.3f of the GPU over %v, want it busy (1 within 5%%)", util, window)
			}
			if sa, _ := a.share(); sa != 0.3 {
				t.Errorf("a's share moved to %v with its neighbour busy, want its request 0.3", sa)
			}
		})
	}
}

// A burst is absorbed by vertical scaling: while its neighbour is idle a busy binding at request 0.5 grows to its
// limit and gets the whole GPU; when the neighbour launches again it gets its request at once, and over the
// periods after it receives at least its request, with its work never further than a period behind.
func TestBurstAbsorbedWithoutViolatingNeighboursRequest(t *testing.T) {
	r := newRig(t)
	const kernel = 200 * time.Microsecond
	a := r.corunner("a", 0.5, 1, kernel)
	b := r.corunner("b", 0.5, 1, kernel)
	b.set(false)
	for range 10 {
		r.period()
	}
	if sa, st := a.share(); sa != 1 || st != StateIncrease {
		t.Fatalf("alone, a holds %v (%s), want its limit 1 (increase)", sa, st)
	}
	ua := a.used()
	for range 10 {
		r.period()
	}
	window := 10 * r.arb.Period()
	if got := a.used() - ua; float64(got) < 0.95*float64(window) {
		t.Errorf("a's burst used %v of %v alone on the GPU, want nearly all of it", got, window)
	}

	b.set(true)
	ub := b.used()
	const periods = 40
	for i := range periods {
		r.period()
		if lag := r.dev.ComputeEnd(0).Sub(r.clk.Now()); lag > r.arb.Period()+kernel {
			t.Fatalf("period %d after b's return: the GPU's queued work ends %v ahead, want at most a period", i, lag)
		}
	}
	window = periods * r.arb.Period()
	if got := b.used() - ub; float64(got) < 0.95*0.5*float64(window) {
		t.Errorf("back from idle, b received %v of %v, want at least its request 0.5 (within 5%%)", got, window)
	}
	if sa, _ := a.share(); sa != 0.5 {
		t.Errorf("with b back, a holds %v, want its request 0.5", sa)
	}
}

// A non-preemptible kernel longer than many periods is paid for afterwards: its binding is held at its gate until
// its share has covered it, so over a window its neighbour loses at most that kernel's length.
func TestLongKernelIsPaidForAsDebt(t *testing.T) {
	r := newRig(t)
	const long = 20 * time.Millisecond // four periods
	a := r.corunner("a", 0.5, 0.5, 200*time.Microsecond)
	b := r.corunner("b", 0.5, 0.5, 200*time.Microsecond)
	for range 5 {
		r.period()
	}
	ua, ub := a.used(), b.used()
	// a's next launch is a long one: launched through its own gate from the test (a's loop is off meanwhile)
	a.set(false)
	r.period()
	if err := a.st.Launch(r.busy, device.Dim3{X: 132}, device.Dim3{X: 256}, 0, busyArgs(long)); err != nil {
		t.Fatal(err)
	}
	a.set(true)
	const periods = 40
	for range periods {
		r.period()
	}
	window := (periods + 1) * r.arb.Period()
	da, db := a.used()-ua, b.used()-ub
	if over := da - window/2; over > long/4 { // paid back within a few of its own kernels
		t.Errorf("a used %v of %v with a %v kernel, want at most its share plus a little", da, window, long)
	}
	if short := window/2 - db; short > long {
		t.Errorf("b received %v of %v, %v short of its request: more than the long kernel (%v)", db, window, short, long)
	}
}

// fakeMeter is a stream's meter the test writes.
type fakeMeter struct {
	ops  uint64
	work time.Duration
}

func (m *fakeMeter) ComputeWork() (uint64, time.Duration) { return m.ops, m.work }

func TestControllerStates(t *testing.T) {
	clk := newManualClock()
	arb, err := NewArbiter(Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, _ := arb.Join("a", 0.2, 0.8)
	b, _ := arb.Join("b", 0.4, 0.5)
	ma, mb := &fakeMeter{}, &fakeMeter{}
	a.Attach(ma)
	b.Attach(mb)
	tick := func() { arb.Tick(clk.advance(arb.Period())) }
	shareOf := func(g *Gate) (float64, State) {
		for _, s := range arb.Shares() {
			if s.Binding == g.binding {
				return s.Share, s.State
			}
		}
		t.Fatalf("%s not listed", g.binding)
		return 0, ""
	}
	// a launches and would launch more (waits at its gate); b launches nothing: idle, its request lent
	exhaust := func(g *Gate, m *fakeMeter) {
		for { // the first Admit wakes an idle gate (which has no tokens until it launches)
			if err := g.Admit(ctx); err != nil {
				t.Fatal(err)
			}
			m.ops++
			m.work += 100 * time.Microsecond
			arb.mu.Lock()
			g.sampleLocked()
			bal := g.balanceLocked()
			arb.mu.Unlock()
			if bal <= 0 {
				break
			}
		}
		arb.mu.Lock()
		g.blocked = true
		arb.mu.Unlock()
	}
	exhaust(a, ma)
	tick()
	if s, st := shareOf(a); st != StateIncrease || math.Abs(s-0.4) > 1e-9 {
		t.Fatalf("a held at its gate: %v %s, want 0.4 increase (doubled)", s, st)
	}
	if s, st := shareOf(b); st != StateIdle || s != 0.4 {
		t.Fatalf("b idle: %v %s, want its request 0.4, idle", s, st)
	}
	exhaust(a, ma)
	tick()
	if s, _ := shareOf(a); math.Abs(s-0.8) > 1e-9 {
		t.Fatalf("a doubled again to its limit: %v, want 0.8 (b idle lends its request)", s)
	}
	// b launches again: it gets its request at once, a is cut back to what is left
	exhaust(b, mb)
	if s, _ := shareOf(a); math.Abs(s-0.6) > 1e-9 {
		t.Fatalf("b back: a holds %v, want 1 - 0.4 = 0.6", s)
	}
	// b's cycle stretches past 1.5 times its target: emergency, up to its limit 0.5, taken from a's extra
	b.SetTarget(10 * time.Millisecond)
	b.Cycle(16 * time.Millisecond)
	exhaust(a, ma)
	tick()
	if s, st := shareOf(b); st != StateEmergency || math.Abs(s-0.5) > 1e-9 {
		t.Fatalf("b's stretched cycle: %v %s, want its limit 0.5, emergency", s, st)
	}
	if s, _ := shareOf(a); math.Abs(s-0.5) > 1e-9 {
		t.Fatalf("a beside b's emergency: %v, want 0.5", s)
	}
	var sum float64
	for _, s := range arb.Shares() {
		sum += s.Share
	}
	if sum > 1+1e-9 {
		t.Fatalf("shares sum to %v", sum)
	}
}

func TestJoinRefusals(t *testing.T) {
	arb, err := NewArbiter(Config{Clock: newManualClock()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := arb.Join("x", 1, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("an exclusive binding joined: %v (it needs no gate)", err)
	}
	if _, err := arb.Join("x", 0.5, 0.4); !errors.Is(err, ErrInvalid) {
		t.Errorf("request above limit joined: %v", err)
	}
	if _, err := arb.Join("a", 0.6, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := arb.Join("b", 0.5, 1); !errors.Is(err, ErrOvercommitted) {
		t.Errorf("requests summing to 1.1 joined: %v", err)
	}
	if _, err := arb.Join("a", 0.1, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("a binding joined twice: %v", err)
	}
}

type unmetered struct{ device.Stream }

func (unmetered) GPU() int { return 0 }

func TestGatedRefusesAStreamThatCannotMeasure(t *testing.T) {
	arb, _ := NewArbiter(Config{Clock: newManualClock()})
	g, _ := arb.Join("a", 0.5, 1)
	if _, err := Gated(context.Background(), unmetered{}, nil, g); !errors.Is(err, ErrNotMetered) {
		t.Fatalf("Gated on a stream without a meter: %v, want ErrNotMetered", err)
	}
	if err := g.Admit(context.Background()); !errors.Is(err, ErrNotMetered) {
		t.Fatalf("Admit without a meter: %v, want ErrNotMetered", err)
	}
	arb.Leave(g)
}

// Every kind of compute work passes the gate (kernel launches, extended launches, graph launches, memsets,
// device-to-device copies); copies to and from the host, events and synchronisation do not.
func TestGatedCountsEveryKindOfComputeWork(t *testing.T) {
	r := newRig(t)
	g, err := r.arb.Join("a", 0.5, 1)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := r.dev.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Gated(context.Background(), raw, raw.(device.ComputeMeter), g)
	if err != nil {
		t.Fatal(err)
	}
	ptr, err := r.dev.ReserveAddress(2<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	phys, err := r.dev.CreatePhysical(0, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.dev.Map(ptr, phys); err != nil {
		t.Fatal(err)
	}
	if err := r.dev.SetAccess(ptr, 2<<20, []int{0}); err != nil {
		t.Fatal(err)
	}
	capture, err := r.dev.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	gc := capture.(device.GraphCapture)
	if err := gc.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := capture.Launch(r.busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(time.Microsecond)); err != nil {
		t.Fatal(err)
	}
	graph, err := gc.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	launches := func() uint64 { return r.arb.Shares()[0].Launches }
	steps := []struct {
		what  string
		do    func() error
		gated bool
	}{
		{"launch", func() error {
			return st.Launch(r.busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(time.Microsecond))
		}, true},
		{"extended launch", func() error {
			return st.(device.ExtendedLauncher).LaunchEx(r.busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, nil,
				busyArgs(time.Microsecond))
		}, true},
		{"graph launch", func() error { return st.(graphLauncher).LaunchGraph(graph) }, true},
		{"memset8", func() error { return st.Memset8(ptr, 0, 1<<20) }, true},
		{"memset32", func() error { return st.Memset32(ptr, 7, 1024) }, true},
		{"device-to-device copy", func() error { return st.CopyDtoD(ptr+1<<20, ptr, 4096) }, true},
		{"host-to-device copy", func() error { return st.CopyHtoD(ptr, make([]byte, 64)) }, false},
		{"device-to-host copy", func() error { return st.CopyDtoH(make([]byte, 64), ptr) }, false},
	}
	var compute uint64
	for _, s := range steps {
		before := launches()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if got := launches() - before; got != map[bool]uint64{true: 1, false: 0}[s.gated] {
			t.Errorf("%s: the gate admitted %d, want gated %v", s.what, got, s.gated)
		}
		if !s.gated {
			continue
		}
		compute++
		deadline := time.Now().Add(10 * time.Second)
		for { // measured before the next is admitted (the manual clock never moves: no period ends here)
			if ops, _ := raw.(device.ComputeMeter).ComputeWork(); ops >= compute {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never measured", s.what)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
}
