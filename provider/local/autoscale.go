package local

import (
	"sync/atomic"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// The autoscaler of the local backend (Config.Autoscale): one goroutine, owned by the Backend and stopped by
// Close, looks at every autoscaled function each interval, hands package autoscale its replica count and its load
// (the most requests it had in flight at once since the last look, counted by Route from the moment a request
// finds the function until it ends, waiting for a replica included) and applies each decision through
// setReplicasLocked, the code path of PUT /system/scale-function. Each decision is logged (function, from, to,
// reason), written to the function's events and counted in the metrics.

// loadGauge counts a function's requests in flight and the most there were at once since the last sample.
type loadGauge struct {
	inflight atomic.Int64
	peak     atomic.Int64
}

func (g *loadGauge) enter() {
	n := g.inflight.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (g *loadGauge) leave() { g.inflight.Add(-1) }

// sample returns the most requests in flight at once since the previous sample, and starts the next period at the
// count in flight now.
func (g *loadGauge) sample() uint64 {
	p := g.peak.Swap(g.inflight.Load())
	return uint64(max(p, 0))
}

// runAutoscaler looks at the functions every cfg.Interval until the backend closes.
func (b *Backend) runAutoscaler(cfg autoscale.Config) {
	defer b.wg.Done()
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	scalers := map[*function]*autoscale.Scaler{}
	for {
		select {
		case <-b.base.Done():
			return
		case now := <-t.C:
			b.autoscaleOnce(now, cfg, scalers)
		}
	}
}

// autoscaleOnce is one look at every function: decide, apply, log, count. scalers holds each autoscaled
// function's Scaler (a function deleted or redeployed is a new *function, so its state starts afresh).
func (b *Backend) autoscaleOnce(now time.Time, cfg autoscale.Config, scalers map[*function]*autoscale.Scaler) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	seen := make(map[*function]bool, len(b.fns))
	for _, fn := range b.fns {
		if !fn.scaling.Autoscaled {
			continue
		}
		seen[fn] = true
		s := scalers[fn]
		if s == nil {
			s = autoscale.NewScaler(cfg.ScaleDownWindow)
			scalers[fn] = s
		}
		load := fn.load.sample()
		d, ok := s.Observe(now, fn.scaling, fn.rec.Replicas, load)
		if ok {
			if _, err := b.setReplicasLocked(fn, d.To); err != nil {
				b.log.Error("autoscaling failed", "function", fn.name, "namespace", fn.ns, "from", d.From,
					"to", d.To, "err", err)
			} else {
				fn.event("", "autoscaled from %d to %d replicas: %s", d.From, d.To, d.Reason)
				b.log.Info("function autoscaled", "function", fn.name, "namespace", fn.ns, "from", d.From,
					"to", d.To, "reason", d.Reason)
				cfg.Metrics.Decided(metricName(fn), d)
			}
		}
		cfg.Metrics.Observed(metricName(fn), load, fn.rec.Replicas)
	}
	for fn := range scalers {
		if !seen[fn] {
			delete(scalers, fn)
			if b.fns[fn.key] == nil || !b.fns[fn.key].scaling.Autoscaled {
				cfg.Metrics.Forget(metricName(fn))
			}
		}
	}
}

// metricName is a function's name in metrics: name.namespace, as the OpenFaaS gateway names it.
func metricName(fn *function) string { return fn.name + "." + fn.ns }
