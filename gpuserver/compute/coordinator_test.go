package compute

import (
	"context"
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// procs stands for the tenants' executor processes: each its own timed virtual GPU (so that nothing but the
// grants makes their work contend) and its registry, on one manual clock.
type procs struct {
	t     *testing.T
	clk   *manualClock
	regs  map[string]*Registry // process -> its registry
	owner map[string]string    // binding -> its process
	devs  map[string]*sim.Backend
	co    *Coordinator
	run   []*remoteRunner
	calls int
}

func (p *procs) ComputeShares(_ context.Context, al Allotment) (Report, error) {
	p.calls++
	by := map[string][]Grant{}
	for _, g := range al.Grants {
		by[p.owner[g.Binding]] = append(by[p.owner[g.Binding]], g)
	}
	var rep Report
	var errs []error
	for proc, gs := range by {
		r, err := p.regs[proc].Apply(Allotment{GPU: al.GPU, Period: al.Period, Issue: al.Issue, Grants: gs})
		errs = append(errs, err)
		rep.Usage = append(rep.Usage, r.Usage...)
	}
	return rep, errors.Join(errs...)
}

func newProcs(t *testing.T, names ...string) *procs {
	t.Helper()
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	p := &procs{t: t, clk: newManualClock(), regs: map[string]*Registry{}, owner: map[string]string{},
		devs: map[string]*sim.Backend{}}
	ctx, cancel := context.WithCancel(context.Background())
	for _, n := range names {
		dev, err := sim.New(sim.Options{Node: node, TimeScale: 1, Clock: p.clk})
		if err != nil {
			t.Fatal(err)
		}
		reg, err := NewRegistry(ctx, 1, Config{Clock: p.clk})
		if err != nil {
			t.Fatal(err)
		}
		p.regs[n], p.devs[n] = reg, dev
	}
	if p.co, err = NewCoordinator(CoordinatorConfig{GPUs: 1, Plane: p, Arbiter: Config{Clock: p.clk},
		OnError: func(gpu int, err error) { t.Errorf("gpu %d: a grant refused: %v", gpu, err) }}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel() // the gates' waits end with their registries' context
		for _, r := range p.run {
			r.stop()
		}
		for _, d := range p.devs {
			if err := d.Close(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
	return p
}

// remoteRunner is a busy binding in one of the processes: it joins at the coordinator, gets its stream through
// its process's registry (Wrap) and launches kernels back to back while on.
type remoteRunner struct {
	corunner
	reg  *Registry
	name string
}

func (p *procs) runner(proc, name string, request, limit float64, kernel time.Duration) *remoteRunner {
	p.t.Helper()
	p.owner[name] = proc
	if err := p.co.Join(context.Background(), 0, name, request, limit); err != nil {
		p.t.Fatal(err)
	}
	dev := p.devs[proc]
	mod, err := dev.LoadModule(0, kernels.PTX())
	if err != nil {
		p.t.Fatal(err)
	}
	busy, err := mod.Function("busy")
	if err != nil {
		p.t.Fatal(err)
	}
	raw, err := dev.NewStream(0)
	if err != nil {
		p.t.Fatal(err)
	}
	st, err := p.regs[proc].Wrap(name, 0, raw, raw.(device.ComputeMeter))
	if err != nil {
		p.t.Fatal(err)
	}
	if _, gated := st.(*gatedStream); !gated {
		p.t.Fatalf("%s's stream is not gated after its join", name)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &remoteRunner{reg: p.regs[proc], name: name}
	r.gate, r.st, r.wake, r.cancel, r.done = st.(*gatedStream).g, st, make(chan struct{}, 1), cancel,
		make(chan struct{})
	r.on.Store(true)
	p.run = append(p.run, r)
	go func() {
		defer close(r.done)
		for ctx.Err() == nil {
			if !r.on.Load() {
				r.parked.Store(true)
				select {
				case <-r.wake:
				case <-ctx.Done():
				}
				r.parked.Store(false)
				continue
			}
			if err := st.Launch(busy, device.Dim3{X: 132}, device.Dim3{X: 256}, 0, busyArgs(kernel)); err != nil {
				if ctx.Err() == nil {
					r.err = err
				}
				return
			}
		}
	}()
	return r
}

func (r *remoteRunner) quiet() bool {
	a := r.gate.a
	a.mu.Lock()
	defer a.mu.Unlock()
	r.gate.sampleLocked()
	measured := r.gate.admitted == r.gate.ops
	held := r.gate.waiting && r.gate.waitGen == a.gen
	if r.on.Load() {
		return held && measured
	}
	return (r.parked.Load() || held) && measured // off: parked, or held at its gate by a launch from before
}

// period waits until every runner is quiet, moves the clock by one period and sends the period's grant.
func (p *procs) period() {
	p.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range p.run {
		for !r.quiet() {
			if r.err != nil {
				p.t.Fatalf("%s: %v", r.name, r.err)
			}
			if time.Now().After(deadline) {
				p.t.Fatalf("%s never waited at its gate", r.name)
			}
			runtime.Gosched()
			time.Sleep(20 * time.Microsecond)
		}
	}
	p.clk.advance(p.co.Period())
	p.co.tick(context.Background(), p.co.gpus[0])
}

// Two busy bindings in two processes, each on a virtual GPU of its own, at 0.3 and 0.7 of the GPU receive those
// shares within 5%, and together never more than the one GPU: the tokens come only from the gpuserver's grants.
// Elastic limits (1 each) change nothing while both are busy: neither grows past what the other leaves.
func TestCoordinatorSharesAGPUAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		name       string
		limA, limB float64
	}{{"static", 0.3, 0.7}, {"elastic", 1, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProcs(t, "tenant-a", "tenant-b")
			a := p.runner("tenant-a", "a", 0.3, tc.limA, 200*time.Microsecond)
			b := p.runner("tenant-b", "b", 0.7, tc.limB, 200*time.Microsecond)
			for range 5 {
				p.period()
			}
			ua, ub := a.used(), b.used()
			const periods = 100
			for range periods {
				p.period()
			}
			da, db := a.used()-ua, b.used()-ub
			got := float64(da) / float64(da+db)
			window := periods * p.co.Period()
			util := float64(da+db) / float64(window)
			t.Logf("a received %.4f (a %v, b %v over %v: %.3f of one GPU)", got, da, db, window, util)
			if math.Abs(got-0.3) > 0.05*0.3 {
				t.Errorf("a received %.4f of the work, want 0.3 within 5%%", got)
			}
			if util > 1.02 || util < 0.95 {
				t.Errorf("the two processes used %.3f of one GPU, want 1 (at most one GPU's time, and busy)", util)
			}
		})
	}
}

// A binding alone on the GPU (its neighbour in the other process idle) grows to its limit; when the neighbour
// launches again it runs at once on its full bucket, and the borrower gives back at the next grant: over the
// periods after, the two together never receive more than the GPU.
func TestCoordinatorLendsAnIdleShareAndTakesItBack(t *testing.T) {
	p := newProcs(t, "tenant-a", "tenant-b")
	a := p.runner("tenant-a", "a", 0.5, 1, 200*time.Microsecond)
	b := p.runner("tenant-b", "b", 0.5, 0.75, 200*time.Microsecond)
	a.set(false)
	for range 8 {
		p.period()
	}
	if sh := p.co.Shares(0); sh[1].Share != 0.75 {
		t.Fatalf("b's share with its neighbour idle: %+v, want its limit 0.75", sh)
	}
	ua, ub := a.used(), b.used()
	a.set(true)
	const periods = 40
	for range periods {
		p.period()
	}
	da, db := a.used()-ua, b.used()-ub
	window := periods * p.co.Period()
	t.Logf("after a woke: a %v, b %v over %v", da, db, window)
	if da+db > window+window/50 {
		t.Errorf("after a woke the two received %v in %v: more than the GPU", da+db, window)
	}
	if float64(da) < 0.5*0.95*float64(window) {
		t.Errorf("a received %v in %v after it woke, want at least its request 0.5", da, window)
	}
	if sh := p.co.Shares(0); sh[0].Share != 0.5 || sh[1].Share != 0.5 {
		t.Errorf("shares with both busy: %+v, want 0.5 each", sh)
	}
}

// A leave opens the binding's gate in its process (a launch waiting there passes); a join again closes it.
func TestCoordinatorLeaveOpensTheGate(t *testing.T) {
	p := newProcs(t, "tenant-a")
	a := p.runner("tenant-a", "a", 0.5, 0.5, 10*time.Millisecond) // a kernel longer than its bucket: it waits
	p.period()
	if err := p.co.Leave(context.Background(), 0, "a"); err != nil {
		t.Fatal(err)
	}
	before := a.used()
	deadline := time.Now().Add(10 * time.Second)
	for a.gate.admittedTotal == 0 || a.used() == before { // launches pass with no grant
		if time.Now().After(deadline) {
			t.Fatal("a's launches still wait at its gate after it left")
		}
		p.clk.advance(time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	if err := p.co.Join(context.Background(), 0, "a", 0.5, 0.5); err != nil {
		t.Fatal(err)
	}
	if a.gate.open {
		t.Error("a's gate stayed open after it joined again")
	}
	if n := p.co.Shares(0); len(n) != 1 {
		t.Errorf("shares after the join again: %+v", n)
	}
}

// An idle binding is granted its request and its part of the room the active ones leave (up to its limit): alone
// on its GPU, its limit, so that its next burst runs at once on its bucket instead of waiting a period to grow.
// Beside a busy neighbour that borrowed its request it is granted its request only.
func TestCoordinatorGrantsAnIdleBindingTheRoomLeft(t *testing.T) {
	p := newProcs(t, "tenant-a", "tenant-b")
	a := p.runner("tenant-a", "a", 0.5, 1, 200*time.Microsecond)
	a.set(false)
	for range 3 {
		p.period()
	}
	if g := p.co.gpus[0].arb.Grants(); len(g) != 1 || g[0].State != StateIdle || g[0].Share != 1 {
		t.Fatalf("a alone and idle is granted %+v, want its limit 1", g)
	}
	p.runner("tenant-b", "b", 0.5, 0.75, 200*time.Microsecond)
	for range 6 {
		p.period()
	}
	if g := p.co.gpus[0].arb.Grants(); len(g) != 2 || g[0].Share != 0.5 || g[1].Share != 0.75 {
		t.Fatalf("a idle beside b busy: %+v, want a its request 0.5, b its limit 0.75", g)
	}
}
