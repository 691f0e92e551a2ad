package simulate

import (
	"fmt"
	"strconv"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// Instances and the autoscaler, as `faas-gpu up` runs them (provider/local, provider/autoscale).
//
// A function's instances are its replicas: each is a controller entry of its own (pool.InstanceKey,
// "function@instance"), with its own image and copies, and the controller binds one request of each at a time
// (Config.MaxInFlight, the product's 1). A request goes to a ready instance round robin, as the local backend's
// proxy routes (provider/local route.go); with none ready it waits for one. With Config.Autoscale, every
// AutoscaleInterval the function's load (the most requests it had in flight at once since the previous look,
// counted from arrival to end, waiting included, as the proxy counts it) goes to the product's decision code,
// autoscale.Scaler.Observe, with the function's com.openfaas.scale.* policy: a higher count starts instances that
// serve after InstanceStart (registered with the controller then, without a copy: the first request they serve
// swaps the model in), a lower one stops the newest instances, which take no new request and leave the controller
// (their copies dropped) once their requests have ended.

// DefaultInstanceStart is how long a new instance takes to serve after the autoscaler asks for it: measured on the
// product by TestAutoscalingThroughUp (test/e2e, docs/operations.md): 8 replicas wanted 50-200 ms after the load
// started, all 8 ready 1.5-3.2 s after it (a CPU function on the 2-core development VM; three runs), so about 2 s
// from the decision. A GPU function's process also imports its framework and initialises its model, which that
// figure does not include.
const DefaultInstanceStart = 2 * time.Second

// DefaultScaling is the scaling policy of every function the simulator autoscales: what autoscale.Parse gives a
// function deployed with com.openfaas.scale.max set to the local backend's most replicas (10, its default), the
// product's defaults otherwise (min 1, target 1 request in flight per instance, proportion 1.0, no scale to
// zero). `up` autoscales only the functions whose labels ask for it; a function without any scale label keeps
// one replica (Config.Instances 1 without Autoscale).
func DefaultScaling() autoscale.Policy {
	p, err := autoscale.Parse(map[string]string{autoscale.LabelMax: strconv.Itoa(DefaultMaxInstances)}, nil,
		DefaultMaxInstances)
	if err != nil {
		panic(err) // constant labels
	}
	return p
}

// DefaultMaxInstances is the local backend's most replicas of a function (provider/local Config.MaxReplicas).
const DefaultMaxInstances = 10

// instance is one replica of a function.
type instance struct {
	name     string
	inFlight int // requests submitted to it and not ended
	ready    bool
	stopping bool // takes no new request; leaves the controller once inFlight is 0
	gone     bool
}

// Product sets cfg to what `faas-gpu up` and the gpuserver do: one request in flight per instance, the
// autoscaler with the product's defaults (DefaultScaling, a 40 s scale-down window, a 1 s interval,
// DefaultInstanceStart) and the data plane's own evictions (Config.DataPlane).
func Product(cfg Config) Config {
	cfg.MaxInFlight, cfg.Instances, cfg.Autoscale, cfg.DataPlane = DefaultMaxInFlight, 0, true, true
	return cfg
}

// scaling is the engine's autoscaler state (Config.Autoscale).
type scaling struct {
	policy   autoscale.Policy
	start    time.Duration
	interval time.Duration
	scalers  []*autoscale.Scaler
	ups      int64
	downs    int64
	started  int64
	peak     int
	events   []ScaleEvent
	instSecs float64 // instance-seconds provisioned, up to the last change
	count    int     // instances provisioned (not gone) now, all functions
	since    time.Duration
}

// ScaleEvent is one decision of the autoscaler (kept with a run's outcomes).
type ScaleEvent struct {
	At       time.Duration
	Function int
	From, To uint64
	Reason   string
}

// autoscaleDefaults fills the autoscaler's zero settings and checks them.
func (cfg *Config) autoscaleDefaults() error {
	if !cfg.Autoscale {
		return nil
	}
	if cfg.Scaling == (autoscale.Policy{}) {
		cfg.Scaling = DefaultScaling()
	}
	if cfg.Scaling.Max == 0 || cfg.Scaling.Min > cfg.Scaling.Max || !(cfg.Scaling.Target > 0) ||
		!(cfg.Scaling.Proportion > 0) {
		return fmt.Errorf("%w: scaling: min %d, max %d, target %g, proportion %g: want 0 <= min <= max, max > 0, "+
			"target and proportion > 0", ErrInvalidInput, cfg.Scaling.Min, cfg.Scaling.Max, cfg.Scaling.Target,
			cfg.Scaling.Proportion)
	}
	if cfg.Instances > 1 {
		return fmt.Errorf("%w: instances: %d static instances and the autoscaler: give one of them", ErrInvalidInput,
			cfg.Instances)
	}
	if cfg.InstanceStart == 0 {
		cfg.InstanceStart = DefaultInstanceStart
	}
	if cfg.InstanceStart < 0 {
		cfg.InstanceStart = 0
	}
	return nil
}

// newInstance adds an instance to function fi (ready now when ready is set).
func (e *engine) newInstance(fi int, ready bool) *instance {
	fm := &e.fns[fi]
	name := fm.name
	if e.cfg.Autoscale || e.cfg.Instances > 1 {
		name = pool.InstanceKey(fm.name, strconv.Itoa(fm.nextInst))
	}
	fm.nextInst++
	in := &instance{name: name, ready: ready}
	fm.insts = append(fm.insts, in)
	e.instFn[name] = fi
	if s := e.scale; s != nil {
		s.account(e.now, 1)
		s.started++
	}
	return in
}

// account adds delta instances provisioned at now.
func (s *scaling) account(now time.Duration, delta int) {
	s.instSecs += float64(s.count) * (now - s.since).Seconds()
	s.count += delta
	s.since = now
}

// pick is the instance a request of fm goes to: round robin over the ready instances that are not stopping, as
// the local backend's proxy routes; nil when none is ready.
func (fm *fnModel) pick() *instance {
	var ready []*instance
	for _, in := range fm.insts {
		if in.ready && !in.stopping {
			ready = append(ready, in)
		}
	}
	if len(ready) == 0 {
		return nil
	}
	fm.rr++
	return ready[fm.rr%uint64(len(ready))]
}

// provisioned counts fm's instances that are neither stopping nor gone: the replica count the autoscaler sees.
func (fm *fnModel) provisioned() int {
	k := 0
	for _, in := range fm.insts {
		if !in.stopping && !in.gone {
			k++
		}
	}
	return k
}

// spec is the controller's registration of instance name of fm.
func (e *engine) spec(fi int, name string) controller.Function {
	fm := &e.fns[fi]
	m := fm.model
	spec := controller.Function{
		FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: e.cfg.quota(m.WeightsBytes), SLO: fm.slo,
			Percentile: m.Percentile},
		ModelBytes: m.WeightsBytes, ExecSeed: e.cfg.exec(*fm),
	}
	if e.cfg.ModelShared {
		spec.Model = pool.ModelShared
	}
	if e.pin != nil {
		spec.Pin = e.pin(fi)
	}
	e.shareSpec(fi, &spec)
	return spec
}

// scaleTick is one look of the autoscaler at every function of the single node n.
func (e *engine) scaleTick(n *simNode) error {
	s := e.scale
	at := epoch.Add(e.now)
	for fi := range e.fns {
		fm := &e.fns[fi]
		load := fm.peak
		fm.peak = fm.load
		current := uint64(fm.provisioned())
		// An idle function at its floor, without scale to zero, is left out of this look: Observe would only
		// record the floor as wanted, which never raises a later scale-down's count (it takes the most wanted over
		// the window, at least the floor) and decides nothing; most functions are idle most seconds.
		if load == 0 && !s.policy.Zero && current == s.policy.Wake() && fm.observed == current {
			continue
		}
		fm.observed = current
		d, ok := s.scalers[fi].Observe(at, s.policy, current, uint64(load))
		if !ok {
			continue
		}
		if e.keep {
			s.events = append(s.events, ScaleEvent{At: e.now, Function: fi, From: d.From, To: d.To, Reason: d.Reason})
		}
		switch {
		case d.To > current:
			s.ups++
			for range d.To - current {
				in := e.newInstance(fi, false)
				e.push(n, event{at: e.now + s.start, kind: evReady, fn: fi, inst: in})
			}
		case d.To < current:
			s.downs++
			stop := current - d.To
			for k := len(fm.insts) - 1; k >= 0 && stop > 0; k-- { // the newest first, as the local backend stops them
				in := fm.insts[k]
				if in.stopping || in.gone {
					continue
				}
				in.stopping = true
				stop--
				if err := e.retire(n, fi, in); err != nil {
					return err
				}
			}
		}
		s.peak = max(s.peak, fm.provisioned())
	}
	return nil
}

// ready makes instance in of function fi serve: registered with node n's controller (without a copy), then the
// requests waiting for an instance are routed again.
func (e *engine) ready(n *simNode, fi int, in *instance) error {
	if in.gone {
		return nil
	}
	spec := e.spec(fi, in.name)
	spec.Cold = true
	if err := n.ctl.Register(epoch.Add(e.now), spec); err != nil {
		return fmt.Errorf("register %s: %w", in.name, err)
	}
	in.ready = true
	fm := &e.fns[fi]
	parked := fm.parked
	fm.parked = nil
	for _, ri := range parked {
		delete(e.reqs, ri.id)
		e.arrive(ri)
	}
	return nil
}

// retire takes a stopping instance out once its requests have ended: out of the controller (its copies
// dropped, as the gpuserver forgets an ended instance's copies) and out of the data plane.
func (e *engine) retire(n *simNode, fi int, in *instance) error {
	if !in.stopping || in.gone || in.inFlight > 0 {
		return nil
	}
	in.gone = true
	if e.scale != nil {
		e.scale.account(e.now, -1)
	}
	fm := &e.fns[fi]
	keep := fm.insts[:0]
	for _, x := range fm.insts {
		if !x.gone {
			keep = append(keep, x)
		}
	}
	clear(fm.insts[len(keep):])
	fm.insts = keep
	if !in.ready { // it never served: nothing registered
		return nil
	}
	if ids, err := n.ctl.Deregister(in.name); err != nil {
		return fmt.Errorf("deregister %s: %w", in.name, err)
	} else if len(ids) > 0 {
		return fmt.Errorf("deregister %s: %d requests still queued", in.name, len(ids))
	}
	if n.dp != nil {
		n.dp.dropAll(in.name)
	}
	return nil
}
