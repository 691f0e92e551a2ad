package controller

import (
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// betterToWait reports whether request r of fs, which Algorithm 1 would swap in from host now with decision d,
// should rather stay queued. Contention is two-sided: a transfer that starts slows the transfers in progress as
// much as they slow it. So r waits when the swap now is predicted to make a request whose transfer is in progress
// miss a deadline it would otherwise meet (unless r would meet its own deadline only by going now), or when the
// swap now is predicted to miss r's own deadline while starting later is predicted to meet it - after the
// contending transfers end, on a busy GPU when its binding ends, or over NVLink from a copy of the model once that
// copy has loaded. Every option it waits for ends in an event that dispatches again (a swap or a binding
// finishing), so a waiting request is always reconsidered; once no later option can make its deadline and it
// harms no one, it takes the swap now.
func (c *Controller) betterToWait(now time.Time, fs *fnState, r *reqState, d Decision) bool {
	if r == nil {
		return false
	}
	ends := c.links.Ends(now)
	harm := c.harms(now, fs, topology.HostPath(d.GPU), ends)
	if r.deadline.IsZero() {
		return harm
	}
	exec := fs.exec.Mean()
	nowOK := !now.Add(c.swapTime(fs, SwapPCIe, topology.HostPath(d.GPU), c.missing(fs, c.gpus[d.GPU]), now,
		now) + exec).After(r.deadline)
	switch {
	case nowOK && !harm:
		return false
	case !nowOK && harm: // late either way: spoil no one else
		return true
	}
	latest := r.deadline.Add(-exec) // a start-plus-swap later than this misses
	for _, g := range c.gpus {
		if g.unhealthy {
			continue
		}
		ready := now
		if g.busy != 0 {
			ready = later(now, g.busyUntil)
		}
		if ready.After(latest) {
			continue
		}
		if g.resident[fs.Name] != nil {
			// Resident (or loading, which ends with the binding) on a GPU that frees in time: run there.
			return g.busy != 0
		}
		if _, ok := c.evictionPlan(g, fs); !ok {
			continue
		}
		// Over NVLink from a copy, complete now or once its load ends.
		for _, s := range fs.replicas {
			at, ok := c.copyReady(now, fs, s, ends)
			if !ok || c.node.NVLink(s, g.index) == 0 {
				continue
			}
			at = later(at, ready)
			if !at.Add(c.swapTime(fs, SwapNVLink, topology.PeerPath(s, g.index), c.missing(fs, g), now,
				at)).After(latest) {
				return true
			}
		}
		// From host, when g is ready or once a transfer in progress ends.
		starts := []time.Time{ready}
		for _, e := range ends {
			if e.At.After(ready) {
				starts = append(starts, e.At)
			}
		}
		for _, at := range starts {
			if g.busy == 0 && at.Equal(now) && g.index == d.GPU {
				continue // the swap now, already predicted to miss
			}
			if !at.Add(c.swapTime(fs, SwapPCIe, topology.HostPath(g.index), c.missing(fs, g), now,
				at)).After(latest) {
				return true
			}
		}
	}
	return false
}

// harms reports whether a transfer of fs over p starting now is predicted to make a request whose transfer is in
// progress (projected to end at ends without it) miss a deadline it would otherwise meet.
func (c *Controller) harms(now time.Time, fs *fnState, p topology.Path, ends []topology.TransferEnd) bool {
	if len(ends) == 0 {
		return false
	}
	for _, e := range c.links.EndsWith(now, p, c.missing(fs, c.gpus[p.To])) {
		r := c.reqs[e.ID]
		if r == nil || r.deadline.IsZero() || r.broken {
			continue
		}
		for _, b := range ends {
			if b.ID == e.ID && !c.finish(r, b.At).After(r.deadline) && c.finish(r, e.At).After(r.deadline) {
				return true
			}
		}
	}
	return false
}

// finish predicts when bound request r, whose transfer ends at end, finishes: it swaps for its swap time learned
// alone plus what contention stretched its transfer by, and executes for its predicted time, never ending before
// its transfer does.
func (c *Controller) finish(r *reqState, end time.Time) time.Time {
	fs, d := c.fns[r.function], r.decision
	if fs == nil {
		return end
	}
	ran := end.Sub(r.swapStart)
	swap := fs.swap[d.Swap].Mean() + max(0, ran-c.node.TransferTime(d.Bytes, d.Path(), nil))
	return r.swapStart.Add(max(ran, swap+fs.exec.Mean()))
}

// swapTime predicts what a swap of fs of the given kind over p, starting at at (not before now), adds to its
// request: the swap time learned alone, plus what the transfers in progress (each running to its predicted end,
// the rates recomputed as they end) stretch its transfer beyond its time alone.
func (c *Controller) swapTime(fs *fnState, kind string, p topology.Path, bytes uint64, now, at time.Time) time.Duration {
	d := c.links.Predict(now, at, p, bytes)
	return c.scaleSwap(fs, fs.swap[kind].Mean(), bytes) + max(0, d-c.node.TransferTime(bytes, p, nil))
}

// copyReady is when the copy of fs on GPU gi can serve as a swap source: now when complete, the predicted end of
// its load (among ends, the projected ends of the transfers in progress) when loading; ok is false when no such
// time is known.
func (c *Controller) copyReady(now time.Time, fs *fnState, gi int, ends []topology.TransferEnd) (time.Time, bool) {
	res := c.gpus[gi].resident[fs.Name]
	if res == nil {
		return time.Time{}, false
	}
	if !res.loading {
		return now, true
	}
	for _, e := range ends {
		if e.Path.To == gi {
			return later(now, e.At), true
		}
	}
	return time.Time{}, false
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
