package server

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Compute shares (docs/design.md, decision 11; gpuserver/compute): with Config.ComputeSharing the controller
// co-runs functions that asked for a share (controller.Sharing), and every binding of such a function joins its
// GPU's arbiter in the gpuserver (compute.Coordinator) before the data plane holds it; the arbiter's grants reach
// the gates in the launch path of the function's executor (executor.DataPlane.ComputeShares: in this process, or
// the tenant's executor process over its control socket) every period, which issue tokens only from them, so that
// a GPU's co-runners in all processes together never get more than the GPU's time. A function without a share
// (the default) never joins and its stream passes no gate.
//
// Only a device whose streams measure their GPU time (device.ComputeMeter: the simulated GPUs) can enforce a
// share; on another (the cuda backend, which has no meter yet) sharing stays off and shared functions are bound
// exclusively, as the log says.

// sharing is the gpuserver's side of compute shares.
type sharing struct {
	co     *compute.Coordinator
	server *Server // its tracked pool's registry gives a function's shares (set before the first binding)

	mu  sync.Mutex
	ids map[sharedKey]map[string]bool // the request bindings of each binding name on its GPU (the bill's rate)
}

type sharedKey struct {
	binding string
	gpu     int
}

// startSharing starts compute sharing on plane when cfg asks for it and the device can enforce it: it returns the
// plane whose holds join the arbiter, and whether sharing is on (the controller's co-running).
func (s *Server) startSharing(ctx context.Context, cfg Config, plane executor.DataPlane) (executor.DataPlane, bool) {
	if !cfg.ComputeSharing || plane == nil || cfg.Policy == PolicyFCFS {
		return plane, false
	}
	if _, metered := s.dev.(*sim.Backend); !metered {
		s.cfg.Logger.Warn("compute shares are not enforced on this device (its streams do not measure their GPU "+
			"time): functions with a compute share are bound exclusively", "device", s.dev.Kind())
		return plane, false
	}
	period := compute.DefaultPeriod
	if cfg.SimTimeScale > 0 { // the timed virtual GPU's clock runs slower by its scale: so do the periods
		period = time.Duration(float64(period) * cfg.SimTimeScale)
	}
	sh := &sharing{server: s, ids: map[sharedKey]map[string]bool{}}
	log := s.cfg.Logger.With("component", "compute")
	co, err := compute.NewCoordinator(compute.CoordinatorConfig{GPUs: plane.GPUs(), Plane: plane,
		Arbiter: compute.Config{Clock: device.WallClock{}, Period: period},
		OnError: func(gpu int, err error) {
			log.Warn("a period's compute grants did not reach an executor", "gpu", gpu, "err", err)
		},
		OnShares: sh.bill})
	if err != nil { // a valid configuration: nothing of it comes from the outside
		log.Error("compute sharing off", "err", err)
		return plane, false
	}
	sh.co, s.sharing = co, sh
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = co.Run(rctx)
	}()
	s.closers = append(s.closers, func(context.Context) error { cancel(); <-done; return nil })
	s.metrics.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "faas_gpu_compute_grants_total",
			Help: "Periods' compute grants the gpuserver sent to the GPUs' shared bindings (one round trip each)."},
			func() float64 { n, _ := co.TickStats(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "faas_gpu_compute_grants_seconds_total",
			Help: "Time the periods' compute grants took, their round trips to the executors included."},
			func() float64 { _, d := co.TickStats(); return d.Seconds() }))
	log.Info("compute sharing on: functions with a compute share co-run", "period", period)
	return sharingPlane{DataPlane: plane, sh: sh}, true
}

// shares is function's compute shares; ok is false when it is exclusive or unknown.
func (sh *sharing) shares(function string) (request, limit float64, ok bool) {
	p := sh.server.pool
	if p == nil {
		return 0, 0, false
	}
	fn, _ := pool.SplitInstance(function)
	spec, known, _ := p.reg.lookup(fn)
	if !known || spec.Exclusive() {
		return 0, 0, false
	}
	request, limit = spec.Shares()
	return request, limit, true
}

// bill sets the bill's rate of the request bindings on gpu to their shares now (metering.Meter.SetShare).
func (sh *sharing) bill(gpu int, shares []compute.Share) {
	p := sh.server.pool
	if p == nil || p.opt.meter == nil {
		return
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, s := range shares {
		for id := range sh.ids[sharedKey{s.Binding, gpu}] {
			_ = p.opt.meter.SetShare(id, s.Share) // an id already ended is ignored
		}
	}
}

func (sh *sharing) track(k sharedKey, id string, on bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if on {
		if sh.ids[k] == nil {
			sh.ids[k] = map[string]bool{}
		}
		sh.ids[k][id] = true
		return
	}
	delete(sh.ids[k], id)
	if len(sh.ids[k]) == 0 {
		delete(sh.ids, k)
	}
}

// sharingPlane is the data plane whose holds of a shared function join its GPU's arbiter first, and leave it when
// they finish.
type sharingPlane struct {
	executor.DataPlane
	sh *sharing
}

func (p sharingPlane) Hold(ctx context.Context, name string, gpu int, source executor.Source, id string,
	request bool) (executor.Held, error) {
	req, lim, shared := p.sh.shares(name)
	if !shared {
		return p.DataPlane.Hold(ctx, name, gpu, source, id, request)
	}
	if err := p.sh.co.Join(ctx, gpu, name, req, lim); err != nil {
		return nil, err
	}
	h, err := p.DataPlane.Hold(ctx, name, gpu, source, id, request)
	if err != nil {
		_ = p.sh.co.Leave(context.WithoutCancel(ctx), gpu, name)
		return nil, err
	}
	k := sharedKey{name, gpu}
	if request {
		p.sh.track(k, id, true)
	}
	return &sharedHeld{Held: h, sh: p.sh, key: k, id: id, share: req}, nil
}

// sharedHeld is a shared binding held on the data plane: Finish leaves the GPU's arbiter.
type sharedHeld struct {
	executor.Held
	sh    *sharing
	key   sharedKey
	id    string
	share float64
	once  sync.Once
}

// Share is the binding's share when it was bound (its request), the bill's rate until the arbiter moves it.
func (h *sharedHeld) Share() float64 { return h.share }

func (h *sharedHeld) Finish() error {
	err := h.Held.Finish()
	h.once.Do(func() {
		h.sh.track(h.key, h.id, false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a release's, never its request's
		defer cancel()
		_ = h.sh.co.Leave(ctx, h.key.gpu, h.key.binding) // its gate gets no tokens any more either way
	})
	return err
}
