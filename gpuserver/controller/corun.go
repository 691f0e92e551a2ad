package controller

import (
	"fmt"
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Defaults of Sharing.
const (
	DefaultMaxRequests = 1.0
	DefaultMaxLimits   = 1.5
)

// Sharing lets functions that asked for a compute share (pool.FunctionSpec.Shares, request < 1) co-run on one GPU
// (docs/design.md, decision 11): a request of such a function may be bound to a GPU another shared binding holds,
// while its model is resident there (or fits in the GPU's free memory without evicting anything), the requests of
// the GPU's bindings sum to at most MaxRequests and their limits to at most MaxLimits (Dilu's placement: 1 and 1.5).
// A function that asked for the whole GPU (the default) never shares: it is bound only to an idle GPU, and nothing
// joins it there. The zero value is off: every binding is exclusive, as before shares existed.
type Sharing struct {
	On bool
	// MaxRequests and MaxLimits bound the sums of a GPU's bindings' requests and limits; DefaultMaxRequests and
	// DefaultMaxLimits when 0. MaxRequests above 1 would promise more than the GPU has and is refused.
	MaxRequests float64
	MaxLimits   float64
}

func (s *Sharing) validate() error {
	if !s.On {
		return nil
	}
	if s.MaxRequests == 0 {
		s.MaxRequests = DefaultMaxRequests
	}
	if s.MaxLimits == 0 {
		s.MaxLimits = DefaultMaxLimits
	}
	switch {
	case !(s.MaxRequests > 0 && s.MaxRequests <= 1):
		return fmt.Errorf("%w: sharing: max requests %v must be in (0, 1]", ErrInvalidConfig, s.MaxRequests)
	case !(s.MaxLimits >= s.MaxRequests):
		return fmt.Errorf("%w: sharing: max limits %v must be at least max requests %v", ErrInvalidConfig,
			s.MaxLimits, s.MaxRequests)
	}
	return nil
}

// coRunner is a request bound to a GPU beside the GPU's first binding (gpuState.busy).
type coRunner struct {
	function       string
	request, limit float64
}

// coState is the controller's sharing state, apart from the exclusive path's.
type coState struct {
	runners map[int]map[uint64]*coRunner // per GPU: its co-runners (not its first binding)
	exec    map[string]*Predictor        // per function: its execution time when co-running
	ran     map[uint64]bool              // bound requests that ran beside another binding (so far)
	counts  CoRunCounts
}

// CoRunCounts are the sharing decisions so far.
type CoRunCounts struct {
	// Bound counts the requests bound beside another binding; Refused the times a shared request found a GPU it
	// could have joined but the GPU's requests or limits would have exceeded the caps.
	Bound   int64
	Refused int64
}

// CoRunCounts returns the sharing decisions so far.
func (c *Controller) CoRunCounts() CoRunCounts { return c.co.counts }

func (c *Controller) coRunners(gpu int) map[uint64]*coRunner {
	if c.co.runners == nil {
		c.co.runners = map[int]map[uint64]*coRunner{}
	}
	m := c.co.runners[gpu]
	if m == nil {
		m = map[uint64]*coRunner{}
		c.co.runners[gpu] = m
	}
	return m
}

// sharesOf is a function's compute shares; ok is false when it is exclusive.
func sharesOf(fs *fnState) (request, limit float64, ok bool) {
	r, l := fs.Shares()
	return r, l, !fs.Exclusive()
}

// gpuShares sums the requests and limits of g's bindings; ok is false when one of them is exclusive.
func (c *Controller) gpuShares(g *gpuState) (requests, limits float64, ok bool) {
	if g.busy == 0 {
		return 0, 0, true
	}
	first := c.reqs[g.busy]
	if first == nil {
		return 0, 0, false
	}
	fs := c.fns[first.decision.Function]
	if fs == nil {
		return 0, 0, false
	}
	r, l, shared := sharesOf(fs)
	if !shared {
		return 0, 0, false
	}
	requests, limits = r, l
	for _, cr := range c.co.runners[g.index] {
		requests += cr.request
		limits += cr.limit
	}
	return requests, limits, true
}

// coRunnable reports whether the controller places co-runners under its policy: the placements that bind a
// request where its model is resident (faas-gpu and its variants); native, static, keep-alive and the random and
// host-only baselines bind exclusively.
func (c *Controller) coRunnable() bool {
	if !c.cfg.Sharing.On {
		return false
	}
	switch c.tr.place {
	case placePinned, placeInstance, placeStatic, placeRandom, placeAnyHostOnly:
		return false
	}
	return true
}

// dispatchCoRunners binds waiting requests of shared functions beside the bindings of GPUs that hold only shared
// bindings, in queue order, after Dispatch bound what it could to idle GPUs.
func (c *Controller) dispatchCoRunners(now time.Time) []Decision {
	if !c.coRunnable() || c.q.Len() == 0 {
		return nil
	}
	var out []Decision
	tried := map[string]bool{}
	for c.q.Len() > 0 && len(tried) < maxBlockedPerDispatch {
		r, ok := c.q.Peek(now, func(f string) bool {
			fs := c.fns[f]
			if tried[f] || c.cfg.MaxInFlight > 0 && fs.inFlight >= c.cfg.MaxInFlight {
				return false
			}
			_, _, shared := sharesOf(fs)
			return shared
		})
		if !ok {
			break
		}
		fs := c.fns[r.Function]
		d, ok := c.placeCoRunner(fs)
		if !ok {
			tried[r.Function] = true
			continue
		}
		c.q.Remove(r.ID)
		d.Request, d.Function, d.Arrival = r.ID, r.Function, r.Arrival
		c.applyCoRun(now, fs, &d)
		out = append(out, d)
	}
	return out
}

// placeCoRunner chooses the GPU a request of shared function fs joins: a healthy GPU held by shared bindings only,
// where fs's model is resident (not loading) or fits in the free memory, and the caps hold with fs; the one with the
// smallest sum of requests, a resident copy first.
func (c *Controller) placeCoRunner(fs *fnState) (Decision, bool) {
	req, lim, _ := sharesOf(fs)
	best, bestReq, bestResident, capped := -1, 0.0, false, false
	for _, g := range c.gpus {
		if g.busy == 0 || g.unhealthy {
			continue
		}
		res := g.resident[fs.Name]
		resident := res != nil && !res.loading
		if res != nil && res.loading || !resident && (g.capacity-g.used < fs.footprint || g.partial[fs.Name] != nil) {
			continue
		}
		sumReq, sumLim, shared := c.gpuShares(g)
		if !shared {
			continue
		}
		if sumReq+req > c.cfg.Sharing.MaxRequests+1e-9 || sumLim+lim > c.cfg.Sharing.MaxLimits+1e-9 {
			capped = true
			continue
		}
		if best < 0 || resident && !bestResident || resident == bestResident && sumReq < bestReq {
			best, bestReq, bestResident = g.index, sumReq, resident
		}
	}
	if best < 0 {
		if capped {
			c.co.counts.Refused++
		}
		return Decision{}, false
	}
	if bestResident {
		return Decision{GPU: best, Swap: SwapNone, Source: best}, true
	}
	return Decision{GPU: best, Swap: SwapPCIe, Source: topology.Host}, true
}

// applyCoRun commits a co-runner's decision: as apply does, except that the GPU's first binding stays its first,
// and the execution time predicted is the function's when co-running (learnt; its exclusive time over its request
// until observed), the GPU's predicted end the later of its bindings'.
func (c *Controller) applyCoRun(now time.Time, fs *fnState, d *Decision) {
	g := c.gpus[d.GPU]
	busy, since, until := g.busy, g.busySince, g.busyUntil
	c.apply(now, fs, d)
	g.busy, g.busySince = busy, since
	d.PredictedExec = c.coRunExec(fs)
	g.busyUntil = later(until, now.Add(d.PredictedSwap+d.PredictedExec))
	if r := c.reqs[d.Request]; r != nil {
		r.decision = *d
	}
	req, lim, _ := sharesOf(fs)
	c.coRunners(d.GPU)[d.Request] = &coRunner{function: fs.Name, request: req, limit: lim}
	if c.co.ran == nil {
		c.co.ran = map[uint64]bool{}
	}
	c.co.ran[d.Request], c.co.ran[busy] = true, true // both run beside another from now on
	c.co.counts.Bound++
}

// coRunExec is fs's predicted execution time beside other bindings: learnt from its co-run requests, else its
// exclusive time stretched by its guaranteed share (an upper bound: it gets at least its request).
func (c *Controller) coRunExec(fs *fnState) time.Duration {
	if p := c.co.exec[fs.Name]; p != nil && p.Observations() > 0 {
		return p.Mean()
	}
	req, _, _ := sharesOf(fs)
	return time.Duration(float64(fs.exec.Mean()) / req)
}

// unbind frees request id's hold on g (Complete): a co-runner leaves; the first binding leaves and a co-runner
// takes its place, or the GPU becomes idle. It reports whether id ran beside another binding.
func (c *Controller) unbind(now time.Time, g *gpuState, id uint64) bool {
	coRan := c.co.ran[id]
	delete(c.co.ran, id)
	if runners := c.co.runners[g.index]; runners[id] != nil {
		delete(runners, id)
		return coRan
	}
	if g.busy != id {
		return coRan
	}
	if runners := c.co.runners[g.index]; len(runners) > 0 {
		ids := make([]uint64, 0, len(runners))
		for rid := range runners {
			ids = append(ids, rid)
		}
		next := slices.Min(ids)
		delete(runners, next)
		g.busy = next // the GPU stays busy: its busy time goes on
		return coRan
	}
	g.busy = 0
	g.busyTime += now.Sub(g.busySince)
	return coRan
}

// observeExec feeds a completed request's execution time to the predictor of how it ran: exclusive, or co-running.
func (c *Controller) observeExec(fs *fnState, coRan bool, exec time.Duration) {
	if !coRan {
		fs.exec.Observe(exec)
		return
	}
	if c.co.exec == nil {
		c.co.exec = map[string]*Predictor{}
	}
	p := c.co.exec[fs.Name]
	if p == nil {
		np := NewPredictor(c.coRunExec(fs))
		p = &np
		c.co.exec[fs.Name] = p
	}
	p.Observe(exec)
}

// CoRunners lists, per GPU, the functions bound there now with their shares (the first binding first); a GPU with
// one binding or none is absent.
func (c *Controller) CoRunners() map[int][]pool.FunctionSpec {
	out := map[int][]pool.FunctionSpec{}
	for gi, runners := range c.co.runners {
		if len(runners) == 0 {
			continue
		}
		g := c.gpus[gi]
		var list []pool.FunctionSpec
		if r := c.reqs[g.busy]; r != nil {
			if fs := c.fns[r.decision.Function]; fs != nil {
				list = append(list, fs.FunctionSpec)
			}
		}
		ids := make([]uint64, 0, len(runners))
		for id := range runners {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			if fs := c.fns[runners[id].function]; fs != nil {
				list = append(list, fs.FunctionSpec)
			}
		}
		out[gi] = list
	}
	return out
}

// coRunnerStatus is GPU gpu's shared bindings for its status (pool.GPUStatus.CoRunners), the first binding first:
// nil while the GPU is idle or held by an exclusive binding.
func (c *Controller) coRunnerStatus(gpu int) []pool.CoRunner {
	g := c.gpus[gpu]
	if _, _, shared := c.gpuShares(g); g.busy == 0 || !shared {
		return nil
	}
	ids := []uint64{g.busy}
	rest := make([]uint64, 0, len(c.co.runners[gpu]))
	for id := range c.co.runners[gpu] {
		rest = append(rest, id)
	}
	slices.Sort(rest)
	var out []pool.CoRunner
	for _, id := range append(ids, rest...) {
		r := c.reqs[id]
		if r == nil {
			continue
		}
		if fs := c.fns[r.decision.Function]; fs != nil {
			fn, _ := pool.SplitInstance(fs.Name)
			req, lim := fs.Shares()
			out = append(out, pool.CoRunner{Function: fn, Request: req, Limit: lim})
		}
	}
	return out
}
