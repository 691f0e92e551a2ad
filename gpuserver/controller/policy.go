package controller

import (
	"fmt"
	"sort"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/queueing"
)

// Policy names a set of queueing, placement and eviction choices.
type Policy string

// The policies of the controller.
const (
	// PolicyFaaSGPU is faas-gpu's default: SLO-aware queueing with late requests demoted and the requests of
	// functions that can spare a miss after those that cannot (queueing.Config.SpareLast; most needy first while
	// the demand exceeds 0.75 of the GPUs; the admission rule's refusals count as misses there), Torpor's
	// interference-aware placement preferring GPUs that need no eviction, heaviness-aware eviction.
	PolicyFaaSGPU Policy = "faas-gpu"
	// PolicyTorpor is Torpor as published: RRC groups, Algorithm 1, heaviness-aware eviction.
	PolicyTorpor Policy = "torpor"
	// PolicyFIFO is Torpor with first-in-first-out queueing (ablation).
	PolicyFIFO Policy = "fifo"
	// PolicyRandomPlacement is Torpor with a random idle GPU instead of Algorithm 1 (ablation).
	PolicyRandomPlacement Policy = "random-placement"
	// PolicyLRUEviction is Torpor with least-recently-used eviction (ablation).
	PolicyLRUEviction Policy = "lru-eviction"
	// PolicyGShareDQLS is gShare: least-slack-first queueing, any idle GPU, swaps from host only, LRU eviction.
	PolicyGShareDQLS Policy = "gshare-dqls"
	// PolicyNative is early binding: each function pinned to one GPU with its own context while memory lasts;
	// the rest cannot run.
	PolicyNative Policy = "native"
	// PolicyKeepAlive is INFless-style keep-alive: a function instance with its own context is started (cold
	// start) on a GPU at its first request and kept until memory is needed.
	PolicyKeepAlive Policy = "keepalive"
	// PolicyStatic is static packing on shared GPUs (MPS, or one serving process per GPU holding several models):
	// each function's model resident for good on the GPUs Function.Pin lists (else on the least used GPU with
	// room), no swapping, no per-function context, native execution; a request runs on an idle GPU holding its
	// model, in arrival order.
	PolicyStatic Policy = "static"
	// PolicyStaticDeadline is static packing with the waiting requests in least-slack (deadline) order instead of
	// arrival order.
	PolicyStaticDeadline Policy = "static-deadline"
)

// DefaultRescueShare is the faas-gpu policy's queueing.Config.RescueShare: while at least 80% of the functions
// meet their SLO, a request competes until its predicted cost alone no longer fits before its deadline; on a node
// failing more than a fifth of its functions, the margined slack demotes it earlier.
const DefaultRescueShare = 0.8

// Policies lists every policy name, faas-gpu first.
func Policies() []Policy {
	return []Policy{PolicyFaaSGPU, PolicyTorpor, PolicyFIFO, PolicyRandomPlacement, PolicyLRUEviction,
		PolicyGShareDQLS, PolicyNative, PolicyKeepAlive, PolicyStatic, PolicyStaticDeadline}
}

// ParsePolicy checks a policy name.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies() {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, 0, len(Policies()))
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	sort.Strings(names)
	return "", fmt.Errorf("%w: unknown policy %q (known: %s)", ErrInvalidConfig, s, strings.Join(names, ", "))
}

type placement int

const (
	placeInterference placement = iota // Torpor Algorithm 1
	placeRandom                        // a random idle GPU
	placeAnyHostOnly                   // resident idle GPU, else the first idle GPU, from host only
	placePinned                        // native: fixed GPU per function
	placeInstance                      // keep-alive: an instance per function, cold started
	placeStatic                        // static: resident copies only, never swapped or evicted
)

type traits struct {
	order         queueing.Order
	place         placement
	heavyEviction bool
	avoidEviction bool    // among equally good GPUs, prefer the one needing the fewest evictions
	deadlineAware bool    // predict swaps under link contention; wait when that meets a deadline a swap now misses
	rescueShare   float64 // queueing.Config.RescueShare
	spareLast     bool    // queueing.Config.SpareLast
	countRefused  bool    // the admission rule's refusals are misses in the queue's record (Queue.ObserveMissed)
	ownContext    bool    // each function carries its own CUDA context (native, keep-alive)
	native        bool    // exec time is the native (not remoted) time
	shed          bool    // overload control: shed the costliest functions when the node cannot serve all
}

func (p Policy) traits() traits {
	switch p {
	case PolicyFaaSGPU:
		return traits{order: queueing.OrderSLOAware, place: placeInterference, heavyEviction: true, avoidEviction: true,
			deadlineAware: true, rescueShare: DefaultRescueShare, spareLast: true, countRefused: true, shed: true}
	case PolicyTorpor:
		return traits{order: queueing.OrderTorpor, place: placeInterference, heavyEviction: true}
	case PolicyFIFO:
		return traits{order: queueing.OrderFIFO, place: placeInterference, heavyEviction: true}
	case PolicyRandomPlacement:
		return traits{order: queueing.OrderTorpor, place: placeRandom, heavyEviction: true}
	case PolicyLRUEviction:
		return traits{order: queueing.OrderTorpor, place: placeInterference}
	case PolicyGShareDQLS:
		return traits{order: queueing.OrderDQLS, place: placeAnyHostOnly}
	case PolicyNative:
		return traits{order: queueing.OrderFIFO, place: placePinned, ownContext: true, native: true}
	case PolicyKeepAlive:
		return traits{order: queueing.OrderFIFO, place: placeInstance, ownContext: true, native: true}
	case PolicyStatic:
		return traits{order: queueing.OrderFIFO, place: placeStatic, native: true}
	case PolicyStaticDeadline:
		return traits{order: queueing.OrderDQLS, place: placeStatic, native: true}
	}
	return traits{order: queueing.OrderFIFO, place: placeInterference}
}

// Pinned reports whether the policy pins each function to one GPU for good (native, static).
func (p Policy) Pinned() bool { pl := p.traits().place; return pl == placePinned || pl == placeStatic }

// NativeExec reports whether the policy runs functions natively (own process and context, no remoting), so a
// simulator uses native execution times for it.
func (p Policy) NativeExec() bool { return p.traits().native }
