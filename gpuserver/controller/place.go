package controller

import (
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// place chooses a GPU for one request of fs without changing any state; ok is false when the request cannot be
// bound now.
func (c *Controller) place(now time.Time, fs *fnState, r *reqState) (Decision, bool) {
	switch c.tr.place {
	case placePinned:
		if fs.pinnedGPU < 0 { // its GPU failed and no other had room
			return Decision{}, false
		}
		g := c.gpus[fs.pinnedGPU]
		if g.busy != 0 || g.unhealthy {
			return Decision{}, false
		}
		return Decision{GPU: g.index, Swap: SwapNone, Source: g.index}, true
	case placeInstance:
		return c.placeInstance(fs)
	case placeStatic:
		if g := c.residentIdle(fs); g >= 0 {
			return Decision{GPU: g, Swap: SwapNone, Source: g}, true
		}
		return Decision{}, false
	case placeRandom:
		return c.placeRandom(fs)
	case placeAnyHostOnly:
		if g := c.residentIdle(fs); g >= 0 {
			return Decision{GPU: g, Swap: SwapNone, Source: g}, true
		}
		var best *gpuState
		var bestEv []Eviction
		for _, g := range c.gpus {
			if g.busy != 0 || g.unhealthy || best != nil && !c.lessUsed(g, best) {
				continue
			}
			if ev, ok := c.evictionPlan(g, fs); ok {
				best, bestEv = g, ev
			}
		}
		if best == nil {
			return Decision{}, false
		}
		return Decision{GPU: best.index, Swap: SwapPCIe, Source: topology.Host, Evict: bestEv}, true
	}
	d, ok := c.placeInterference(fs)
	if ok && c.tr.deadlineAware && d.Swap == SwapPCIe && c.betterToWait(now, fs, r, d) {
		return Decision{}, false
	}
	return d, ok
}

// residentIdle is the least used idle GPU holding a usable copy of fs, or -1.
func (c *Controller) residentIdle(fs *fnState) int {
	best := -1
	for _, gi := range fs.replicas {
		g := c.gpus[gi]
		if g.busy == 0 && !g.resident[fs.Name].loading && (best < 0 || c.lessUsed(g, c.gpus[best])) {
			best = gi
		}
	}
	return best
}

// lessUsed orders GPUs that a placement finds equally good: the one bound for less time so far first (as Torpor's
// node simulator does), then the lower index, so that uniform load spreads evenly instead of piling onto GPU 0.
func (c *Controller) lessUsed(a, b *gpuState) bool {
	if a.busyTime != b.busyTime {
		return a.busyTime < b.busyTime
	}
	return a.index < b.index
}

// sources are the GPUs holding a complete copy of fs: its own, then (Config.SiblingSources) its sibling instances'
// on other GPUs; of names says whose copy a GPU's is ("" for fs's own).
func (c *Controller) sources(fs *fnState) (gpus []int, of map[int]string) {
	for _, gi := range fs.replicas {
		if !c.gpus[gi].resident[fs.Name].loading {
			gpus = append(gpus, gi)
		}
	}
	if !c.cfg.SiblingSources || fs.Model != pool.ModelShared { // the executors read only such siblings' copies
		return gpus, nil
	}
	for _, sib := range c.family[fs.family] {
		if sib == fs.Name {
			continue
		}
		for _, gi := range c.fns[sib].replicas {
			if r := c.gpus[gi].resident[sib]; !r.loading && !slices.Contains(gpus, gi) {
				if of == nil {
					of = map[int]string{}
				}
				gpus, of[gi] = append(gpus, gi), sib
			}
		}
	}
	return gpus, of
}

type candidate struct {
	g        *gpuState
	evict    []Eviction
	evictCnt int
	heavyEv  int
}

func (c *Controller) idleCandidates(fs *fnState) []candidate {
	var out []candidate
	for _, g := range c.gpus {
		if g.busy != 0 || g.unhealthy {
			continue
		}
		ev, ok := c.evictionPlan(g, fs)
		if !ok {
			continue
		}
		cand := candidate{g: g, evict: ev, evictCnt: len(ev)}
		for _, e := range ev {
			if c.heavy(c.fns[e.Function]) {
				cand.heavyEv++
			}
		}
		out = append(out, cand)
	}
	return out
}

// placeInterference is Torpor's Algorithm 1: resident on an idle GPU: run there; resident only on busy GPUs:
// copy over the fastest NVLink into an idle GPU; otherwise from host into an idle GPU whose PCIe-switch
// neighbours are not loading, else whose neighbours load only light models, else any; among those, the GPU
// holding most of the model already (partial residency). With avoidEviction, ties go to the GPU that evicts
// fewer heavy models, then fewer models; remaining ties to the least used GPU.
func (c *Controller) placeInterference(fs *fnState) (Decision, bool) {
	if g := c.residentIdle(fs); g >= 0 {
		return Decision{GPU: g, Swap: SwapNone, Source: g}, true
	}
	cands := c.idleCandidates(fs)
	if len(cands) == 0 {
		return Decision{}, false
	}
	better := func(a, b candidate) bool { // a better than b on eviction cost, then on use so far
		if c.tr.avoidEviction {
			if a.heavyEv != b.heavyEv {
				return a.heavyEv < b.heavyEv
			}
			if a.evictCnt != b.evictCnt {
				return a.evictCnt < b.evictCnt
			}
		}
		return c.lessUsed(a.g, b.g)
	}
	if srcs, of := c.sources(fs); len(srcs) > 0 {
		var best *candidate
		bestSrc, bestBW := -1, 0.0
		for i := range cands {
			src, bw := c.node.FastestPeer(cands[i].g.index, srcs)
			if src < 0 {
				continue
			}
			if best == nil || bw > bestBW || (bw == bestBW && better(cands[i], *best)) {
				best, bestSrc, bestBW = &cands[i], src, bw
			}
		}
		if best != nil {
			return Decision{GPU: best.g.index, Swap: SwapNVLink, Source: bestSrc, SourceFunction: of[bestSrc],
				Evict: best.evict}, true
		}
	}
	var best *candidate
	bestClass, bestMissing := 0, uint64(0)
	for i := range cands {
		class, missing := c.neighbourClass(cands[i].g.index), c.missing(fs, cands[i].g)
		if best == nil || class < bestClass || class == bestClass && (missing < bestMissing ||
			missing == bestMissing && better(cands[i], *best)) {
			best, bestClass, bestMissing = &cands[i], class, missing
		}
	}
	return Decision{GPU: best.g.index, Swap: SwapPCIe, Source: topology.Host, Evict: best.evict}, true
}

// neighbourClass: 0 when no other GPU behind gi's PCIe switch is loading from host, 1 when they load only light
// models, 2 otherwise.
func (c *Controller) neighbourClass(gi int) int {
	class := 0
	for _, g := range c.gpus {
		if g.index == gi || !c.node.SameSwitch(gi, g.index) {
			continue
		}
		for _, heavy := range g.loading {
			if heavy {
				return 2
			}
			class = 1
		}
	}
	return class
}

func (c *Controller) placeRandom(fs *fnState) (Decision, bool) {
	cands := c.idleCandidates(fs)
	if len(cands) == 0 {
		return Decision{}, false
	}
	pick := cands[c.rng.IntN(len(cands))]
	gi := pick.g.index
	if r := pick.g.resident[fs.Name]; r != nil && !r.loading {
		return Decision{GPU: gi, Swap: SwapNone, Source: gi}, true
	}
	srcs, of := c.sources(fs)
	if src, bw := c.node.FastestPeer(gi, srcs); src >= 0 && bw > 0 {
		return Decision{GPU: gi, Swap: SwapNVLink, Source: src, SourceFunction: of[src], Evict: pick.evict}, true
	}
	return Decision{GPU: gi, Swap: SwapPCIe, Source: topology.Host, Evict: pick.evict}, true
}

// placeInstance is keep-alive: a warm instance runs where it is (waiting while its GPU is busy); otherwise an
// instance is cold started on an idle GPU, evicting least recently used idle instances.
func (c *Controller) placeInstance(fs *fnState) (Decision, bool) {
	if len(fs.replicas) > 0 {
		if g := c.residentIdle(fs); g >= 0 {
			return Decision{GPU: g, Swap: SwapNone, Source: g}, true
		}
		return Decision{}, false
	}
	cands := c.idleCandidates(fs)
	if len(cands) == 0 {
		return Decision{}, false
	}
	best := cands[0]
	for _, cand := range cands[1:] {
		if cand.evictCnt < best.evictCnt || cand.evictCnt == best.evictCnt && c.lessUsed(cand.g, best.g) {
			best = cand
		}
	}
	return Decision{GPU: best.g.index, Swap: SwapCold, Source: topology.Host, Evict: best.evict}, true
}

// evictionPlan lists the models to drop from g so that fs fits, in the policy's eviction order; ok is false
// when even evicting every unpinned model would not make room. With partial residency, the blocks left of models
// evicted earlier go first, and the last victim is only trimmed to what fs needs (its first blocks stay: a later
// swap-in copies only the rest); the order puts the blocks cheapest to bring back first (a copy on another GPU,
// then light models, then heavy ones; the least recently used first within each).
func (c *Controller) evictionPlan(g *gpuState, fs *fnState) ([]Eviction, bool) {
	if _, ok := g.resident[fs.Name]; ok {
		return nil, true
	}
	need := fs.footprint
	if pc := g.partial[fs.Name]; pc != nil {
		need -= min(need, pc.bytes)
	}
	free := g.capacity - g.used
	if need <= free {
		return nil, true
	}
	if fs.footprint > g.capacity {
		return nil, false
	}
	type victim struct {
		f       *fnState
		partial bool
		charge  uint64
		class   int
		last    time.Time
	}
	class := func(v *fnState) int {
		if !c.tr.heavyEviction {
			return 0
		}
		switch {
		case c.modelCopies(v) > 1: // the model stays on another GPU (its own copy, or a sibling instance's)
			return 0
		case !c.heavy(v):
			return 1
		default:
			return 2
		}
	}
	vs := make([]victim, 0, len(g.resident)+len(g.partial))
	for name, r := range g.resident {
		v := c.fns[name]
		// A sibling instance's copy (the same function's model) is never a victim for another instance's copy:
		// that only moves the model from one instance to the other, and the sibling's next request swaps it back.
		if r.pinned > 0 || r.loading || v.family == fs.family && v != fs {
			continue
		}
		vs = append(vs, victim{f: v, charge: v.footprint, class: class(v), last: r.lastUsed})
	}
	for name, pc := range g.partial {
		if name != fs.Name {
			v := c.fns[name]
			vs = append(vs, victim{f: v, partial: true, charge: pc.bytes, class: class(v), last: pc.lastUsed})
		}
	}
	evictable := free
	for _, v := range vs {
		evictable += v.charge
	}
	if evictable < need {
		return nil, false
	}
	less := func(a, b *victim) bool {
		if a.partial != b.partial {
			return a.partial
		}
		if a.class != b.class {
			return a.class < b.class
		}
		if !a.last.Equal(b.last) {
			return a.last.Before(b.last)
		}
		return a.f.Name < b.f.Name
	}
	// The victims in eviction order, the next one selected as needed: a plan usually takes one or two of a GPU's
	// hundred models, so selecting beats sorting them all (the order is total - names are unique - so both give
	// the same plan).
	var out []Eviction
	for i := range vs {
		m := i
		for j := i + 1; j < len(vs); j++ {
			if less(&vs[j], &vs[m]) {
				m = j
			}
		}
		vs[i], vs[m] = vs[m], vs[i]
		v := vs[i]
		e := Eviction{Function: v.f.Name, GPU: g.index}
		if c.cfg.PartialResidency && free+v.charge > need {
			// Trim: the workspace first, then the model's last blocks; keep the rest unless it is a sliver.
			if keep := min(v.f.ModelBytes, v.charge-(need-free)); keep >= v.f.ModelBytes/minKeptFraction {
				e.Keep = keep
			}
		}
		out = append(out, e)
		free += v.charge - e.Keep
		if need <= free {
			return out, true
		}
	}
	return nil, false
}

// modelCopies counts the copies of fs's model on the GPUs: its own, and with Config.SiblingSources its sibling
// instances' (the same weights).
func (c *Controller) modelCopies(fs *fnState) int {
	n := len(fs.replicas)
	if c.cfg.SiblingSources && fs.Model == pool.ModelShared {
		for _, sib := range c.family[fs.family] {
			if sib != fs.Name {
				n += len(c.fns[sib].replicas)
			}
		}
	}
	return n
}

// minKeptFraction: a partial copy keeps at least 1/minKeptFraction of its model, or nothing.
const minKeptFraction = 20
