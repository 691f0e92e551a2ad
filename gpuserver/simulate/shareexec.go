package simulate

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
)

// The execution of shared bindings (share.go): each GPU with a shared binding has a shareGPU; a request of a
// function that asked for a share computes there from when its execution starts (after its swap) until its work,
// its exclusive execution time, is done at the rate its share gives it. Between two changes (a request starts or
// ends, Dilu's arbiter moves a share) the rates are constant, so the completions are exact, not stepped. Dilu's
// arbiter (gpuserver/compute, the product's code) is ticked every period on the virtual clock while its shares
// move; once two ticks in a row leave every share and state as they were, the ticks pause until the next change
// (the arbiter would decide the same every period until then).

// evShare is a shareGPU's next change (completion, start, arbiter tick); its id is the shareGPU's generation (a
// stale event is ignored), its fn the GPU.
const evShare = evReady + 1

// shareKey names a GPU of a node.
type shareKey struct{ node, gpu int }

// shareJob is one shared request's execution.
type shareJob struct {
	id      uint64
	start   time.Duration // its execution starts (after its swap)
	began   time.Duration // when it was handed over (its compute overlapped before that: overlap)
	left    float64       // exclusive execution left, ns
	overlap time.Duration // execution already done pipelined behind its transfer
	prof    ShareProfile
	request float64
	limit   float64
	active  bool
	rate    float64 // progress per ns
	share   float64 // share granted now
	gate    *compute.Gate
	meter   *shareMeter
}

// shareGPU is one GPU's shared bindings.
type shareGPU struct {
	node *simNode
	gpu  int
	jobs []*shareJob
	last time.Duration // progress settled up to here
	gen  uint64
	// Dilu: the GPU's arbiter, its next tick (never while paused) and how many ticks in a row changed nothing.
	arb    *compute.Arbiter
	clock  *shareClock
	tickAt time.Duration
	steady int
	sig    string
}

// shareClock is the arbiter's clock: the engine's virtual time. Nothing sleeps on it (the engine ticks).
type shareClock struct{ e *engine }

func (c *shareClock) Now() time.Time { return epoch.Add(c.e.now) }
func (c *shareClock) SleepUntil(ctx context.Context, _ time.Time) error {
	return fmt.Errorf("simulated clock: nothing sleeps on it: %w", context.Canceled)
}

// shareMeter is a shared binding's stream as its gate measures it (device.ComputeMeter): the GPU time its work
// occupied, in share-time (its granted share, at most what its kernels can use, times the time).
type shareMeter struct {
	ops  uint64
	work time.Duration
}

func (m *shareMeter) ComputeWork() (uint64, time.Duration) { return m.ops, m.work }

// noWait is the context of the gates' admissions: the engine never blocks, a launch without tokens is refused at
// once (and counted as held at the gate: Dilu's increase).
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// execute schedules request ri's completion: at at when exclusive (as before sharing), else its execution of exec
// joins its GPU's shared bindings from at-exec (never before now: the part before, pipelined behind its transfer, is
// done).
func (e *engine) execute(n *simNode, ri *reqInfo, at, exec time.Duration) {
	req, lim, prof, ok := e.shareOf(ri.fn)
	if !ok {
		e.push(n, event{at: at, kind: evComplete, id: ri.id, exec: exec})
		return
	}
	start := max(e.now, at-exec)
	work := at - start
	g := e.shareGPUOf(n, ri.gpu)
	g.settle(e.now)
	g.jobs = append(g.jobs, &shareJob{id: ri.id, start: start, began: start, left: float64(work),
		overlap: exec - work, prof: prof, request: req, limit: lim})
	if err := g.update(e); err != nil && e.err == nil {
		e.err = err
	}
}

func (e *engine) shareGPUOf(n *simNode, gpu int) *shareGPU {
	if e.shares == nil {
		e.shares = map[shareKey]*shareGPU{}
	}
	k := shareKey{n.index, gpu}
	g := e.shares[k]
	if g == nil {
		g = &shareGPU{node: n, gpu: gpu, last: e.now, tickAt: never}
		e.shares[k] = g
	}
	return g
}

// shareEvent handles a shareGPU's event.
func (e *engine) shareEvent(n *simNode, ev event) error {
	g := e.shares[shareKey{n.index, ev.fn}]
	if g == nil || ev.id != g.gen {
		return nil // stale
	}
	g.settle(e.now)
	return g.update(e)
}

// settle advances the active jobs' progress to now at their rates.
func (g *shareGPU) settle(now time.Duration) {
	dt := float64(now - g.last)
	if dt > 0 {
		for _, j := range g.jobs {
			if j.active {
				j.left -= j.rate * dt
			}
		}
	}
	g.last = max(g.last, now)
}

// update ends the jobs done, starts those due, ticks Dilu's arbiter when due, sets the rates and schedules the
// next change.
func (g *shareGPU) update(e *engine) error {
	now := e.now
	policy := e.cfg.Sharing.Policy
	changed := false
	g.jobs = slices.DeleteFunc(g.jobs, func(j *shareJob) bool {
		if !j.active || j.left > 0.5 {
			return false
		}
		exec := now - j.began + j.overlap
		if j.gate != nil {
			j.gate.Cycle(now - j.began)
			g.arb.Leave(j.gate)
		}
		e.push(g.node, event{at: now, kind: evComplete, id: j.id, exec: exec})
		changed = true
		return true
	})
	for _, j := range g.jobs {
		if j.active || j.start > now {
			continue
		}
		j.active, changed = true, true
		if policy == ShareDilu {
			if err := g.join(e, j); err != nil {
				return err
			}
		}
	}
	if policy == ShareDilu {
		if g.tickAt <= now {
			g.tick(e)
		} else if changed {
			g.drive(now, false)
		}
		if changed && g.tickAt == never {
			g.tickAt, g.steady = now+g.arb.Period(), 0
		}
	}
	g.setRates(e)
	g.schedule(e)
	return nil
}

// join adds job j's binding to the GPU's arbiter at its request, its target cycle its exclusive execution.
func (g *shareGPU) join(e *engine, j *shareJob) error {
	if g.arb == nil {
		g.clock = &shareClock{e: e}
		a, err := compute.NewArbiter(compute.Config{Clock: g.clock, Period: e.cfg.Sharing.Period})
		if err != nil {
			return err
		}
		g.arb = a
	}
	gate, err := g.arb.Join(strconv.FormatUint(j.id, 10), j.request, j.limit)
	if err != nil {
		return fmt.Errorf("co-runner %d on gpu %d of node %d: %w", j.id, g.gpu, g.node.index, err)
	}
	j.gate, j.meter = gate, &shareMeter{}
	gate.Attach(j.meter)
	gate.SetTarget(time.Duration(j.left) + j.overlap)
	return nil
}

// tick is one period of Dilu's arbiter: it moves the shares from what the gates saw in the period that ends, then
// each binding launches its period's work.
func (g *shareGPU) tick(e *engine) {
	now := e.now
	g.arb.Tick(epoch.Add(now))
	g.drive(now, true)
	sig := ""
	for _, s := range g.arb.Shares() {
		sig += fmt.Sprintf("%s:%g:%s;", s.Binding, s.Share, s.State)
	}
	if sig == g.sig {
		g.steady++
	} else {
		g.sig, g.steady = sig, 0
	}
	g.tickAt = now + g.arb.Period()
	if g.steady >= 2 || !slices.ContainsFunc(g.jobs, func(j *shareJob) bool { return j.active }) {
		g.tickAt = never // nothing would move until the next change
	}
}

// drive has every active binding launch its work for the rest of the period at its share: one launch, measured
// at once as min(share, u) of the time; a binding whose kernels could use more than its share launches again and
// is held at its gate (the arbiter's increase). full is a whole period (a tick), else what is left of it.
func (g *shareGPU) drive(now time.Duration, full bool) {
	period := g.arb.Period()
	frac := 1.0
	if !full && g.tickAt != never {
		frac = min(1, max(0, float64(g.tickAt-now)/float64(period)))
	}
	shares := map[string]float64{}
	for _, s := range g.arb.Shares() {
		shares[s.Binding] = s.Share
	}
	for _, j := range g.jobs {
		if !j.active || j.gate == nil {
			continue
		}
		if err := j.gate.Admit(noWait); err != nil {
			continue // held at its gate: its balance is spent (its neighbours' long kernels: debt)
		}
		// refresh the share after the admission: an idle binding waking takes its request back
		s := shares[j.gate.Binding()]
		for _, sh := range g.arb.Shares() {
			if sh.Binding == j.gate.Binding() {
				s = sh.Share
			}
		}
		j.meter.ops++
		j.meter.work += time.Duration(min(s, j.prof.U) * frac * float64(period))
		if j.prof.U > s+1e-9 {
			if j.gate.Admit(noWait) == nil { // tokens left over from before: measured as nothing more
				j.meter.ops++
			}
		}
	}
}

// setRates gives each active job its share and its rate of progress (share.go's model).
func (g *shareGPU) setRates(e *engine) {
	active := 0
	for _, j := range g.jobs {
		if j.active {
			active++
		}
	}
	slow := 1.0
	if active >= 2 {
		slow += e.cfg.Sharing.slowdown()
	}
	var shares map[string]float64
	if g.arb != nil {
		shares = map[string]float64{}
		for _, s := range g.arb.Shares() {
			shares[s.Binding] = s.Share
		}
	}
	for _, j := range g.jobs {
		if !j.active {
			continue
		}
		switch e.cfg.Sharing.Policy {
		case ShareGShare: // the whole GPU for its slice of each round
			j.share = j.request
			j.rate = j.request / slow
		case ShareDilu:
			j.share = shares[j.gate.Binding()]
			j.rate = j.prof.Speed(j.share) / slow
		default: // static: its request, fixed
			j.share = j.request
			j.rate = j.prof.Speed(j.request) / slow
		}
	}
}

// schedule pushes the GPU's next change: the earliest completion, start or tick.
func (g *shareGPU) schedule(e *engine) {
	next := g.tickAt
	for _, j := range g.jobs {
		switch {
		case !j.active:
			next = min(next, j.start)
		case j.rate > 0:
			next = min(next, e.now+time.Duration(math.Ceil(max(0, j.left)/j.rate)))
		}
	}
	g.gen++
	if next == never {
		return
	}
	e.push(g.node, event{at: cmp.Or(max(next, e.now), e.now), kind: evShare, id: g.gen, fn: g.gpu})
}
