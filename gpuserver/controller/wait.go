package controller

import (
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// betterToWait reports whether request r of fs, which Algorithm 1 would swap in from host now with decision d,
// should rather stay queued: the swap now is predicted to miss r's deadline (its path shares a link with
// transfers in progress, which the link model says stretches it), while starting later is predicted to meet it
// - after the contending transfers end, on a busy GPU when its binding ends, or over NVLink from a copy of the
// model once that copy has loaded. Every option it waits for ends in an event that dispatches again (a swap or
// a binding finishing), so a waiting request is always reconsidered; once no later option can make its deadline
// it takes the swap now.
func (c *Controller) betterToWait(now time.Time, fs *fnState, r *reqState, d Decision) bool {
	if r == nil || r.deadline.IsZero() {
		return false
	}
	exec := fs.exec.Mean()
	if !now.Add(c.hostSwapTime(fs, d.GPU, c.transfersAt(now, now)) + exec).After(r.deadline) {
		return false
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
			at, ok := c.copyReady(now, fs, s)
			if !ok || c.node.NVLink(s, g.index) == 0 {
				continue
			}
			at = later(at, ready)
			p := topology.PeerPath(s, g.index)
			nv := scale(fs.swap[SwapNVLink].Mean(), c.node.SlowdownOf(p, c.transfersAt(now, at)))
			if !at.Add(nv).After(latest) {
				return true
			}
		}
		// From host, when g is ready or once a transfer in progress ends.
		starts := []time.Time{ready}
		for _, h := range c.gpus {
			for _, t := range h.transfers {
				if t.end.After(ready) {
					starts = append(starts, t.end)
				}
			}
		}
		for _, at := range starts {
			if g.busy == 0 && at.Equal(now) && g.index == d.GPU {
				continue // the swap now, already predicted to miss
			}
			if !at.Add(c.hostSwapTime(fs, g.index, c.transfersAt(now, at))).After(latest) {
				return true
			}
		}
	}
	return false
}

// hostSwapTime predicts the swap of fs from host into GPU gi while the transfers on active run.
func (c *Controller) hostSwapTime(fs *fnState, gi int, active []topology.Path) time.Duration {
	return scale(fs.swap[SwapPCIe].Mean(), c.node.SlowdownOf(topology.HostPath(gi), active))
}

// transfersAt lists the paths of the transfers predicted to be still running at at (every transfer in progress
// when at is now: one predicted to have ended but not yet reported still runs).
func (c *Controller) transfersAt(now, at time.Time) []topology.Path {
	var out []topology.Path
	for _, g := range c.gpus {
		for _, t := range g.transfers {
			if !at.After(now) || t.end.After(at) {
				out = append(out, t.path)
			}
		}
	}
	return out
}

// copyReady is when the copy of fs on GPU gi can serve as a swap source: now when complete, the predicted end of
// its load when loading; ok is false when no such time is known.
func (c *Controller) copyReady(now time.Time, fs *fnState, gi int) (time.Time, bool) {
	res := c.gpus[gi].resident[fs.Name]
	if res == nil {
		return time.Time{}, false
	}
	if !res.loading {
		return now, true
	}
	for _, t := range c.gpus[gi].transfers {
		if t.path.To == gi {
			return later(now, t.end), true
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

func scale(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }
