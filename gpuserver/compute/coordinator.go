package compute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Allotment is one frame of grants: the grants of one GPU's bindings that run in one executor (remote.go), and
// whether it issues a period's tokens (Issue: the period's grant) or only changes who is bound (a join or a leave
// between two periods).
type Allotment struct {
	GPU    int           `json:"gpu"`
	Period time.Duration `json:"period_ns"`
	Issue  bool          `json:"issue"`
	Grants []Grant       `json:"grants"`
}

// Report answers an Allotment that issued tokens: what each gate granted saw since the last one.
type Report struct {
	Usage []Usage `json:"usage,omitempty"`
}

// Plane carries an allotment of a GPU's grants to the executors of the bindings it names (each executor its own
// bindings' grants) and brings their reports back, joined (executor.DataPlane's ComputeShares). An executor that
// fails to answer is an error; the reports of the others still come back.
type Plane interface {
	ComputeShares(ctx context.Context, a Allotment) (Report, error)
}

// Coordinator is the gpuserver's side of compute shares: one remote Arbiter per GPU over the shared bindings of
// every tenant there, whose grants it sends to the executors every period (Run) and when a binding joins or
// leaves. It is safe for concurrent use.
type Coordinator struct {
	plane   Plane
	period  time.Duration
	clock   Clock
	onError func(gpu int, err error)
	onShare func(gpu int, shares []Share)
	gpus    []*coGPU
}

type coGPU struct {
	index int
	arb   *Arbiter
	// mu orders the GPU's frames (a period's grant, a join's, a leave's) and guards refs and cuts
	mu   sync.Mutex
	refs map[string]int           // bindings joined per binding name (a function's implicit and request bindings)
	cuts map[string]time.Duration // the last Decide's cuts, sent with the next period's grant
	wake chan struct{}            // a binding joined: Run's loop of the GPU looks again
	// ticks counts the period's grants sent, tickTime the time their round trips took
	ticks    int64
	tickTime time.Duration
}

// CoordinatorConfig configures a Coordinator.
type CoordinatorConfig struct {
	GPUs  int
	Plane Plane
	// Arbiter configures each GPU's arbiter (its period, its controller); Clock is required, Remote is set.
	Arbiter Config
	// OnError receives the failures of the period's grants (an executor that did not answer); nil drops them.
	OnError func(gpu int, err error)
	// OnShares receives each GPU's shares after every period's decision (the bill's rate of each binding).
	OnShares func(gpu int, shares []Share)
}

// NewCoordinator makes a coordinator of cfg.GPUs GPUs; Run sends the periods' grants.
func NewCoordinator(cfg CoordinatorConfig) (*Coordinator, error) {
	if cfg.Plane == nil || cfg.GPUs < 0 {
		return nil, fmt.Errorf("%w: a coordinator needs a plane and a GPU count", ErrInvalid)
	}
	cfg.Arbiter.Remote = true
	cfg.Arbiter.Period = cmp.Or(cfg.Arbiter.Period, DefaultPeriod)
	c := &Coordinator{plane: cfg.Plane, period: cfg.Arbiter.Period, clock: cfg.Arbiter.Clock,
		onError: cfg.OnError, onShare: cfg.OnShares}
	for i := range cfg.GPUs {
		a, err := NewArbiter(cfg.Arbiter)
		if err != nil {
			return nil, err
		}
		c.gpus = append(c.gpus, &coGPU{index: i, arb: a, refs: map[string]int{}, wake: make(chan struct{}, 1)})
	}
	return c, nil
}

// Period is the coordinator's period (each GPU's).
func (c *Coordinator) Period() time.Duration { return c.period }

func (c *Coordinator) gpu(i int) (*coGPU, error) {
	if i < 0 || i >= len(c.gpus) {
		return nil, fmt.Errorf("%w: gpu %d", ErrInvalid, i)
	}
	return c.gpus[i], nil
}

// Join gives binding a share of gpu from now until Leave: its executor's gate has its request's tokens before
// Join returns. A binding name joined already (a function's implicit binding and its request's) is counted once
// more and keeps its share. An executor that does not take the grant is an error and the binding is not joined.
func (c *Coordinator) Join(ctx context.Context, gpu int, binding string, request, limit float64) error {
	g, err := c.gpu(gpu)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refs[binding] > 0 {
		g.refs[binding]++
		return nil
	}
	gate, err := g.arb.Join(binding, request, limit)
	if err != nil {
		return err
	}
	if _, err := c.plane.ComputeShares(ctx, Allotment{GPU: gpu, Period: c.period, Grants: g.arb.Grants()}); err != nil {
		g.arb.Leave(gate)
		g.arb.Grants() // the leave needs no frame: no executor took the join
		return fmt.Errorf("compute share of %s on gpu %d: %w", binding, gpu, err)
	}
	g.refs[binding] = 1
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return nil
}

// Leave ends one join of binding on gpu; the last one removes it from the GPU and opens its gate (its executor
// is told at once). A failure to tell the executor is returned (its gate gets no tokens any more either way).
func (c *Coordinator) Leave(ctx context.Context, gpu int, binding string) error {
	g, err := c.gpu(gpu)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refs[binding] == 0 {
		return nil
	}
	if g.refs[binding]--; g.refs[binding] > 0 {
		return nil
	}
	delete(g.refs, binding)
	g.arb.mu.Lock()
	gate := g.arb.gateLocked(binding)
	g.arb.mu.Unlock()
	if gate == nil {
		return nil
	}
	g.arb.Leave(gate)
	_, err = c.plane.ComputeShares(ctx, Allotment{GPU: gpu, Period: c.period, Grants: g.arb.Grants()})
	return err
}

// Shares lists gpu's shared bindings and their shares now (nil for an unknown GPU).
func (c *Coordinator) Shares(gpu int) []Share {
	g, err := c.gpu(gpu)
	if err != nil {
		return nil
	}
	return g.arb.Shares()
}

// TickStats are the periods' grants sent so far on every GPU and the time their round trips took in all.
func (c *Coordinator) TickStats() (ticks int64, took time.Duration) {
	for _, g := range c.gpus {
		g.mu.Lock()
		ticks += g.ticks
		took += g.tickTime
		g.mu.Unlock()
	}
	return ticks, took
}

// Run sends every GPU's period's grants while it has shared bindings, until ctx ends (ctx's error).
func (c *Coordinator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, g := range c.gpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.runGPU(ctx, g)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

func (c *Coordinator) runGPU(ctx context.Context, g *coGPU) {
	next := c.clock.Now()
	for {
		if g.arb.Bound() == 0 {
			select {
			case <-g.wake:
				next = c.clock.Now()
				continue
			case <-ctx.Done():
				return
			}
		}
		next = next.Add(c.period)
		if now := c.clock.Now(); next.Before(now) {
			next = now // a late period is not made up for: its tokens are lost, never issued twice
		}
		if err := c.clock.SleepUntil(ctx, next); err != nil {
			return
		}
		c.tick(ctx, g)
	}
}

// tick sends one period's grant of g and decides the next from the reports.
func (c *Coordinator) tick(ctx context.Context, g *coGPU) {
	g.mu.Lock()
	defer g.mu.Unlock()
	grants := g.arb.Grants()
	if len(grants) == 0 {
		return
	}
	for i := range grants {
		grants[i].Cut = g.cuts[grants[i].Binding]
	}
	start := time.Now()
	// an executor restarting is no reason to hold the GPU's other grants back
	ctx, cancel := context.WithTimeout(ctx, max(time.Second, 4*c.period))
	defer cancel()
	rep, err := c.plane.ComputeShares(ctx, Allotment{GPU: g.index, Period: c.period, Issue: true, Grants: grants})
	g.ticks++
	g.tickTime += time.Since(start)
	if err != nil && c.onError != nil && !errors.Is(err, context.Canceled) {
		c.onError(g.index, err)
	}
	next := g.arb.Decide(c.clock.Now(), rep.Usage)
	g.cuts = map[string]time.Duration{}
	for _, gr := range next {
		if gr.Cut > 0 {
			g.cuts[gr.Binding] = gr.Cut
		}
	}
	if c.onShare != nil {
		c.onShare(g.index, g.arb.Shares())
	}
}
