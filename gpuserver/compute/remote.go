package compute

import (
	"fmt"
	"time"
)

// Across processes (docs/design.md, decision 7: a process per tenant): the gpuserver holds one Arbiter per GPU
// with Config.Remote over every tenant's shared bindings there (Coordinator), and each tenant executor one Arbiter
// per GPU over its own bindings' gates, whose shares are the gpuserver's (Apply). Every period the gpuserver sends
// each executor with a shared binding on the GPU its bindings' Grants (one frame per executor and period, answered
// with the Usage its gates saw since the last one); the executor's gates get a period's tokens at the share
// granted and no others: tokens are issued only when a grant arrives, so the tokens of a GPU's bindings in all
// processes together never exceed one period's GPU time per period. Shares move by Dilu's controller in the
// gpuserver's arbiter (controller.go) from the reports, one period late.
//
// An idle binding's bucket stays full while its share is lent (as in one process): when it launches again it runs
// at once on it, and the neighbours that borrowed give back what they were issued beyond their new share at the
// next grant (Grant.Cut), so that over any two periods the GPU time granted is at most two periods'.

// Grant is one binding's share on a GPU as the gpuserver's arbiter decided it (Decide), for its executor's gate.
type Grant struct {
	// Binding names the binding (the function, or its instance, bound on the GPU).
	Binding string  `json:"binding"`
	Request float64 `json:"request"`
	Limit   float64 `json:"limit"`
	// Share is what its gate issues tokens for each period, State why (the controller's state: a gate granted in
	// the idle state reclaims its request at its next launch).
	Share float64 `json:"share"`
	State State   `json:"state"`
	// Cut is GPU time taken back from its tokens: issued beyond its new share while a neighbour it borrowed from
	// woke.
	Cut time.Duration `json:"cut_ns,omitempty"`
	// Left says that the binding left the GPU: its gate lets its launches pass (a launch still waiting there when
	// its binding ended, which the executor refuses or lets finish) until it joins again.
	Left bool `json:"left,omitempty"`
}

// Usage is what one binding's gate saw since the last period's grant (Apply's answer), for the gpuserver's
// controller.
type Usage struct {
	Binding string `json:"binding"`
	// Launches it admitted; Blocked: a launch waited for tokens (or waits now); Pending: launches it admitted are
	// not measured yet; Woke: it launched again after it was granted idle; Cycle: the longest launch cycle
	// reported (Gate.Cycle).
	Launches int           `json:"launches"`
	Blocked  bool          `json:"blocked,omitempty"`
	Pending  bool          `json:"pending,omitempty"`
	Woke     bool          `json:"woke,omitempty"`
	Cycle    time.Duration `json:"cycle_ns,omitempty"`
	// Totals: the GPU time its work occupied, its launches' wait at the gate, the launches it admitted.
	Used     time.Duration `json:"used_ns"`
	Waited   time.Duration `json:"waited_ns"`
	Admitted uint64        `json:"admitted"`
}

// MaxGrants bounds the grants of one GPU in one frame (a size read from the wire): more bindings than this never
// share a GPU (their requests sum to at most 1, each at least MinShare).
const MaxGrants = 1024

// MinShare is the smallest request a shared binding holds (contract.Shares' percentages: 1%).
const MinShare = 0.001

func (gr Grant) validate() error {
	switch {
	case gr.Binding == "":
		return fmt.Errorf("%w: a grant without its binding", ErrInvalid)
	case gr.Left:
		return nil
	case !(gr.Request > 0 && gr.Request < 1) || !(gr.Limit >= gr.Request && gr.Limit <= 1):
		return fmt.Errorf("%w: grant of %s: request %v, limit %v (want 0 < request < 1, request <= limit <= 1)",
			ErrInvalid, gr.Binding, gr.Request, gr.Limit)
	case !(gr.Share >= gr.Request && gr.Share <= gr.Limit):
		return fmt.Errorf("%w: grant of %s: share %v outside [%v, %v]", ErrInvalid, gr.Binding, gr.Share, gr.Request,
			gr.Limit)
	case gr.Cut < 0:
		return fmt.Errorf("%w: grant of %s: cut %v", ErrInvalid, gr.Binding, gr.Cut)
	}
	switch gr.State {
	case StateRequest, StateIdle, StateEmergency, StateIncrease:
		return nil
	}
	return fmt.Errorf("%w: grant of %s: state %q", ErrInvalid, gr.Binding, gr.State)
}

// Apply is the executor's side: its gates take the shares of al's grants. With Issue (a period's grant) each gate
// granted is issued the period's tokens at its share (less its Cut) and the answer is what each saw since the
// last tick; without (a binding joined or left between two periods) gates are added, opened or closed and given
// their shares, and no tokens are issued but a joining binding's first bucket (its request's period). A gate
// granted for the first time, or again after it left, starts idle at its request with a full bucket.
func (a *Arbiter) Apply(al Allotment) ([]Usage, error) {
	tick, grants := al.Issue, al.Grants
	if al.Period < 0 {
		return nil, fmt.Errorf("%w: period %v", ErrInvalid, al.Period)
	}
	if len(grants) > MaxGrants {
		return nil, fmt.Errorf("%w: %d grants for one GPU (at most %d)", ErrInvalid, len(grants), MaxGrants)
	}
	sum := 0.0
	for _, gr := range grants {
		if err := gr.validate(); err != nil {
			return nil, err
		}
		if !gr.Left {
			sum += gr.Share
		}
	}
	if sum > 1+1e-6 {
		return nil, fmt.Errorf("%w: grants sum to %.4f of the GPU", ErrOvercommitted, sum)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.granted = true
	if al.Period > 0 {
		a.cfg.Period = al.Period // the gpuserver's
	}
	period := float64(a.cfg.Period)
	var out []Usage
	for _, gr := range grants {
		g := a.gateLocked(gr.Binding)
		if gr.Left {
			if g != nil {
				g.open = true
			}
			continue
		}
		if g == nil {
			g = &Gate{a: a, binding: gr.Binding, open: true}
			a.gates = append(a.gates, g)
		}
		if g.open { // (re)joins: idle at its request, a full bucket
			g.sampleLocked()
			g.open, g.state, g.share, g.woke = false, StateIdle, gr.Request, false
			g.request, g.limit = gr.Request, gr.Limit
			g.issued += time.Duration(gr.Request*period) - g.balanceLocked()
			g.launches, g.blocked, g.waited, g.cycle = 0, g.waiting, 0, 0
			if !tick {
				continue
			}
		}
		if tick {
			pending := g.pendingLocked(false)
			out = append(out, Usage{Binding: g.binding, Launches: g.launches, Blocked: g.blocked || g.waiting,
				Pending: pending, Woke: g.woke, Cycle: g.cycle, Used: g.used, Waited: g.waitedTotal,
				Admitted: g.admittedTotal})
		}
		g.request, g.limit = gr.Request, gr.Limit
		if g.woke && gr.State == StateIdle { // it woke after the gpuserver decided: its request is its own
			g.share, g.state = gr.Request, StateRequest
		} else {
			g.share, g.state = gr.Share, gr.State
		}
		if tick {
			cap := time.Duration(g.share * period)
			g.issued += cap - gr.Cut
			if bal := g.balanceLocked(); bal > cap {
				g.issued -= bal - cap
			}
			g.launches, g.blocked, g.waited, g.cycle, g.woke = 0, g.waiting, 0, 0, false
		}
	}
	a.last = a.cfg.Clock.Now()
	a.broadcastLocked()
	return out, nil
}

func (a *Arbiter) gateLocked(binding string) *Gate {
	for _, g := range a.gates {
		if g.binding == binding {
			return g
		}
	}
	return nil
}

// Decide is the gpuserver's side (an arbiter with Config.Remote), once per period: it takes the bindings' usage
// since the last grant (their executors' answers), moves their shares (controller.go) and returns the grants of
// the next period, the bindings that left since the last call among them (Left). A neighbour that woke (it
// launched again after it was granted idle, on its full bucket) is paid for by the bindings whose share it takes
// back: each is cut what it was issued beyond its new share.
func (a *Arbiter) Decide(now time.Time, usage []Usage) []Grant {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = now
	woke := false
	for _, u := range usage {
		g := a.gateLocked(u.Binding)
		if g == nil {
			continue // it left meanwhile
		}
		g.launches, g.blocked, g.cycle, g.remotePending = u.Launches, u.Blocked, u.Cycle, u.Pending
		g.used, g.waitedTotal, g.admittedTotal = u.Used, u.Waited, u.Admitted
		if u.Launches > 0 && (u.Woke || g.state == StateIdle) {
			woke = true
		}
	}
	before := make(map[*Gate]float64, len(a.gates))
	for _, g := range a.gates {
		before[g] = g.share
	}
	a.controlLocked()
	out := a.grantsLocked()
	for i, g := range a.gates {
		if cut := before[g] - g.share; woke && cut > 0 {
			out[i].Cut = time.Duration(cut * float64(a.cfg.Period))
		}
		g.launches, g.blocked, g.cycle = 0, false, 0
	}
	return append(out, a.takeLeftLocked()...)
}

// Grants are the bindings' current grants (no cut), the bindings that left since the last call or Decide among
// them (Left): what a join or a leave between two periods sends.
func (a *Arbiter) Grants() []Grant {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append(a.grantsLocked(), a.takeLeftLocked()...)
}

// grantsLocked are the bindings' grants: each its share; an idle binding its request and its part of what the
// active ones leave of the GPU (up to its limit), so that when it launches again it finds the room there is in its
// bucket (a lone binding its limit at once) instead of waiting a period for the controller to grow it. What it
// spends beyond its request when it wakes is room no one was granted; its request, lent to its neighbours, they
// give back at the next grant (Cut), as before.
func (a *Arbiter) grantsLocked() []Grant {
	left, idle := 1.0, 0
	for _, g := range a.gates {
		if g.state == StateIdle {
			left -= g.request
			idle++
		} else {
			left -= g.share
		}
	}
	out := make([]Grant, 0, len(a.gates))
	for _, g := range a.gates {
		share := g.share
		if g.state == StateIdle && left > 0 {
			share = min(g.limit, g.request+left/float64(idle))
		}
		out = append(out, Grant{Binding: g.binding, Request: g.request, Limit: g.limit, Share: share,
			State: g.state})
	}
	return out
}

func (a *Arbiter) takeLeftLocked() []Grant {
	out := make([]Grant, 0, len(a.leftSince))
	for _, b := range a.leftSince {
		out = append(out, Grant{Binding: b, Left: true})
	}
	a.leftSince = nil
	return out
}

// Bound reports how many bindings the arbiter holds.
func (a *Arbiter) Bound() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.gates)
}
