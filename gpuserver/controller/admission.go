package controller

import (
	"fmt"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Admission control, separate from the policy. Overload is the node's problem, not the scheduler's: one rule,
// offered to every policy (Config.Admission), refuses the requests that cannot meet their deadline, so that a
// policy is judged on what it schedules and a benchmark can report each policy with and without the rule. The
// rule has no tuned constant; it uses the controller's own predictions.
//
// AdmissionDeadline refuses (pool.ErrOverloaded, HTTP 429) a request at Submit when its predicted completion -
// the soonest a GPU it can run on frees, plus its function's queued requests spread over those GPUs, plus
// its own predicted swap and execution - falls after its deadline, and drops a waiting request once its deadline
// minus its predicted cost now has passed (it can no longer make it; Dispatch hands it back through TakeRefused). A
// request whose predicted cost alone exceeds its deadline is never refused, at Submit or in the queue: no retry
// could do better (a cold swap of a large model under a short deadline is served late, not answered 429).
// The Retry-After of a refusal is how much later the work now queued ahead of it will have drained far enough for
// it to fit (predicted completion minus deadline): a retry then, with no new work queued ahead of it, is predicted
// to make its deadline. Every request a GPU starts could still make its deadline when it started, so the queue
// of admitted requests stays bounded at any load: admitted requests finish within their deadline up to the
// prediction's error (a swap slowed by contention), never thousands of deadlines late.
//
// The work ahead counted is the work certainly ahead of it: its own function's queued requests (every order
// serves a function's requests in their own order), spread over the GPUs it can run on (at most Config.MaxInFlight
// of them). Other functions' queued work is left out: the policy's order decides whether it goes first, and
// counting it refused requests a policy would have served in time (Azure hour 2, models drawn with seed 3: torpor
// with the rule kept 353 of 378 functions within SLO counting the queued work due no later, and all 378 counting
// only its own). A request admitted that then cannot make its deadline is dropped from the queue before it takes a GPU.

// Admission names an admission rule.
type Admission string

// The admission rules.
const (
	// AdmissionNone admits every request (the policy's own overload control, if any, still applies).
	AdmissionNone Admission = "none"
	// AdmissionDeadline refuses a request whose predicted completion misses its deadline.
	AdmissionDeadline Admission = "deadline"
)

// DefaultAdmission is the rule the gpuserver runs unless told otherwise (`faas-gpu gpuserver -admission`, `up`,
// `sim`): the deadline rule. With it the faas-gpu policy keeps as many functions within SLO and serves as many
// requests on the Azure trace's hour 1 as without it, and the queue of admitted requests stays bounded where,
// without it, bursts left it hundreds of deadlines long (docs/bench/policy-notes.md). controller.Config's zero
// value is AdmissionNone, for the baselines a benchmark runs without it.
const DefaultAdmission = AdmissionDeadline

// ParseAdmission reads an admission rule: "none" (also empty) or "deadline".
func ParseAdmission(s string) (Admission, error) {
	switch Admission(strings.TrimSpace(s)) {
	case "", AdmissionNone:
		return AdmissionNone, nil
	case AdmissionDeadline:
		return AdmissionDeadline, nil
	}
	return "", fmt.Errorf("%w: admission %q (want none or deadline)", ErrInvalidConfig, s)
}

// admits reports whether the deadline admission rule is on.
func (c *Controller) admits() bool { return c.cfg.Admission == AdmissionDeadline }

// predictDone is the predicted time from now until a new request of fs would finish: the soonest one of the GPUs
// it can run on frees, its function's queued requests spread over them, and its own cost. ok is false when no GPU
// can run it (the request then fails as it would without the rule).
func (c *Controller) predictDone(now time.Time, fs *fnState) (done time.Duration, ok bool) {
	pinned := c.tr.place == placePinned || c.tr.place == placeStatic
	n := 0
	soonest := time.Duration(-1)
	for _, g := range c.gpus {
		if g.unhealthy || pinned && !c.holds(fs, g.index) {
			continue
		}
		n++
		left := time.Duration(0)
		if g.busy != 0 {
			left = max(0, g.busyUntil.Sub(now))
		}
		if soonest < 0 || left < soonest {
			soonest = left
		}
	}
	if n == 0 {
		return 0, false
	}
	cost := c.predictCost(fs)
	if k := c.cfg.MaxInFlight; k > 0 {
		n = min(n, k)
	}
	return soonest + time.Duration(c.q.Waiting(fs.Name))*cost/time.Duration(n) + cost, true
}

// holds reports whether fs's model is resident on GPU i (its pinned GPU for native binding).
func (c *Controller) holds(fs *fnState, i int) bool {
	if c.tr.place == placePinned {
		return fs.pinnedGPU == i
	}
	for _, r := range fs.replicas {
		if r == i {
			return true
		}
	}
	return false
}

// admit applies the deadline rule at Submit.
func (c *Controller) admit(now time.Time, fs *fnState) error {
	if !c.admits() || fs.SLO == 0 || c.predictCost(fs) > fs.SLO {
		return nil
	}
	done, ok := c.predictDone(now, fs)
	if !ok || done <= fs.SLO {
		return nil
	}
	c.counts.Refused++
	fs.refused++
	if c.tr.countRefused {
		c.q.ObserveMissed(fs.Name)
	}
	return c.admissionError(fs, done)
}

// admissionError is the refusal of a request of fs predicted to finish done from now: Retry-After is when the
// work ahead of it will have drained by as much as it misses its deadline by (at least a millisecond).
func (c *Controller) admissionError(fs *fnState, done time.Duration) error {
	retry := max(time.Millisecond, (done - fs.SLO).Round(time.Millisecond))
	if retry < done-fs.SLO {
		retry += time.Millisecond
	}
	return &pool.OverloadedError{Function: fs.Name, RetryAfter: retry,
		Reason: fmt.Sprintf("predicted to finish in %v, after its deadline of %v (admission rule %q)",
			done.Round(time.Microsecond), fs.SLO, c.cfg.Admission)}
}

// expireAdmitted drops the waiting requests that can no longer meet their deadline (admission rule).
func (c *Controller) expireAdmitted(now time.Time) {
	if !c.admits() || c.q.Len() == 0 {
		return
	}
	cost := func(f string) time.Duration {
		if fs := c.fns[f]; fs != nil {
			if cost := c.predictCost(fs); cost <= fs.SLO {
				return cost
			}
			return -1 // its cost alone exceeds its deadline: no retry could do better, as at Submit
		}
		return 0
	}
	for _, r := range c.q.ExpireAll(now, cost) {
		if rs := c.reqs[r.ID]; rs != nil && rs.initialisation { // never dropped (SubmitInitialisation): back in
			if err := c.q.Push(r); err == nil {
				continue
			}
		}
		delete(c.reqs, r.ID)
		fs := c.fns[r.Function]
		c.counts.Refused++
		done := fs.SLO + time.Millisecond
		if d, ok := c.predictDone(now, fs); ok {
			done = max(done, d)
		}
		fs.refused++
		if c.tr.countRefused {
			c.q.ObserveMissed(fs.Name)
		}
		c.ov.refused = append(c.ov.refused, Refusal{ID: r.ID, Err: c.admissionError(fs, done)})
	}
}
