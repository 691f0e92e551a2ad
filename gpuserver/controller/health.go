package controller

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"
)

// SetHealthy takes GPU gpu out of service (healthy false) or returns it to service (true).
//
// An unhealthy GPU is never chosen by any policy's placement and offers no capacity: its residencies are dropped
// (the models there are gone, so copies elsewhere that were pinned as swap sources there are unpinned), and the
// transfers from and to it count as ended in the link model. Requests bound there stay bound until the caller
// ends them with Complete (which then reports pool.ErrGPUUnhealthy), as do requests swapping from it over NVLink.
// Under native binding, each function pinned there is pinned again onto a healthy GPU with room; the waiting
// requests of one that finds none are returned (they will never be bound), and its later requests are refused
// until a GPU returns. A GPU returned to service is empty. Setting the state a GPU already has changes nothing.
func (c *Controller) SetHealthy(now time.Time, gpu int, healthy bool) ([]uint64, error) {
	if gpu < 0 || gpu >= len(c.gpus) {
		return nil, fmt.Errorf("%w: %d (node has %d)", ErrUnknownGPU, gpu, len(c.gpus))
	}
	g := c.gpus[gpu]
	if g.unhealthy == !healthy {
		return nil, nil
	}
	g.unhealthy = !healthy
	if healthy {
		if c.tr.place == placePinned || c.tr.place == placeStatic {
			for _, fs := range c.sortedFunctions() {
				if c.tr.place == placePinned && fs.pinnedGPU < 0 || c.tr.place == placeStatic && len(fs.replicas) == 0 {
					c.pin(now, fs)
				}
			}
		}
		return nil, nil
	}
	// Requests bound to it, or reading their model from it, lose their work; their transfers end now.
	for _, r := range c.reqs {
		if !r.bound {
			continue
		}
		d := r.decision
		if d.GPU != gpu && !(r.swapping && d.Swap == SwapNVLink && d.Source == gpu) {
			continue
		}
		r.broken = true
		if !r.swapping || d.Swap == SwapCold {
			continue
		}
		c.links.End(now, r.id)
		if d.Swap == SwapNVLink && !r.released {
			r.released = true
			if src := c.gpus[d.Source].resident[d.sourceName()]; src != nil {
				src.pinned--
			}
		}
	}
	clear(g.loading)
	for _, name := range slices.Sorted(maps.Keys(g.resident)) {
		c.removeResident(c.fns[name], g)
	}
	c.dropPartials(g)
	if c.tr.place != placePinned && c.tr.place != placeStatic {
		return nil, nil
	}
	var dropped []uint64
	for _, fs := range c.sortedFunctions() {
		switch {
		case c.tr.place == placeStatic: // its copies elsewhere serve; with none left, one on a GPU with room
			if len(fs.replicas) > 0 {
				continue
			}
			if c.pin(now, fs); len(fs.replicas) > 0 {
				continue
			}
		case fs.pinnedGPU != gpu:
			continue
		default:
			fs.pinnedGPU = -1
			if c.pin(now, fs); fs.pinnedGPU >= 0 {
				continue
			}
		}
		for id, r := range c.reqs {
			if r.function == fs.Name && !r.bound {
				c.q.Remove(id)
				delete(c.reqs, id)
				dropped = append(dropped, id)
			}
		}
	}
	slices.Sort(dropped)
	return dropped, nil
}

// sortedFunctions lists the registered functions by name.
func (c *Controller) sortedFunctions() []*fnState {
	out := make([]*fnState, 0, len(c.fns))
	for _, fs := range c.fns {
		out = append(out, fs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// broken reports whether request id is bound and a GPU of its binding failed since.
func (c *Controller) broken(id uint64) bool {
	r := c.reqs[id]
	return r != nil && r.broken
}
