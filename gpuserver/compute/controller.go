package compute

// controlLocked is Dilu's vertical scaling (its Algorithm 2), once per period, for each binding from what its gate
// saw in the period that ends:
//
//   - idle: it launched nothing: back to its request, lent to its neighbours until it launches again;
//   - emergency: its last launch cycle stretched past EmergencyStretch times its target: up to its limit at once;
//   - increase: it waited at its gate: its share grows by Increase, up to its limit;
//   - request (hold): it had what it needed: it keeps its share.
//
// Then the active bindings' shares are fitted to the GPU (fitLocked).
func (a *Arbiter) controlLocked() {
	for _, g := range a.gates {
		pending := g.pendingLocked(a.cfg.Remote)
		if g.cycle > 0 && !g.targetSet && (g.target == 0 || g.cycle < g.target) {
			g.target = g.cycle // learnt: the shortest cycle seen
		}
		switch {
		case g.launches == 0 && !g.blocked && !pending:
			g.state, g.want = StateIdle, g.request
		case g.cycle > 0 && g.target > 0 && float64(g.cycle) > a.cfg.EmergencyStretch*float64(g.target):
			g.state, g.want = StateEmergency, g.limit
		case g.blocked:
			g.state, g.want = StateIncrease, min(g.limit, g.share*a.cfg.Increase)
		default:
			g.state, g.want = StateRequest, g.share
		}
	}
	a.fitLocked()
}

// fitLocked sets the shares of the active (not idle) bindings: each its request (the requests of a GPU's bindings
// sum to at most 1: Join), then what is left of the GPU to those that want more, emergencies first, each in
// proportion to what it asks beyond its request. Idle bindings hold their request nominally and use none of it.
func (a *Arbiter) fitLocked() {
	room := 1.0
	for _, g := range a.gates {
		if g.state != StateIdle {
			room -= g.request
		}
		g.want = max(g.request, min(g.limit, g.want))
	}
	room = max(0, room)
	for _, pass := range []func(*Gate) bool{
		func(g *Gate) bool { return g.state == StateEmergency },
		func(g *Gate) bool { return g.state != StateEmergency && g.state != StateIdle },
	} {
		ask := 0.0
		for _, g := range a.gates {
			if pass(g) {
				ask += g.want - g.request
			}
		}
		scale := 1.0
		if ask > room {
			scale = room / ask
		}
		for _, g := range a.gates {
			if pass(g) {
				extra := (g.want - g.request) * scale
				g.share = g.request + extra
				room -= extra
			}
		}
	}
	for _, g := range a.gates {
		if g.state == StateIdle {
			g.share = g.request
		}
	}
}

// pendingLocked reports whether launches the gate admitted are not measured yet: as its report said for a remote
// gate; from its meter here, where launches never measured in a period without launches (their stream failed)
// are charged no longer.
func (g *Gate) pendingLocked(remote bool) bool {
	if remote {
		return g.remotePending
	}
	g.sampleLocked()
	pending := g.admitted > g.ops
	if g.launches == 0 && pending && g.ops == g.lastOps {
		g.admitted = g.ops
		pending = false
	}
	g.lastOps = g.ops
	return pending
}
