package server

import (
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// dataPlaneEvictions carries the copies the data plane drops on its own (executor.Config.OnEvict in this process,
// handoff.KindEvicted from an executor process) to the controller, which forgets them and counts them
// (controller.Pool.Evicted): the pool's status, /metrics and the simulator then count the same evictions
// (docs/design.md, decision 12). The data plane starts before the pool: reports before it exists find no copy to
// forget and are counted once it does.
type dataPlaneEvictions struct {
	log *slog.Logger

	mu      sync.Mutex
	to      evictedReceiver
	pending []evictedCopy
}

// evictedReceiver is the controller's pool (controller.Pool.Evicted).
type evictedReceiver interface {
	Evicted(function string, gpu int, reason string)
}

type evictedCopy struct {
	function, reason string
	gpu              int
}

// report is executor.Config.OnEvict and tenant.Config.OnEvict. It may be called with the executors' lock held:
// the controller's pool never calls the executors under its own lock, so this lock order is the only one.
func (e *dataPlaneEvictions) report(gpu int, function, reason string) {
	e.log.Debug("the data plane evicted a copy on its own", "function", function, "gpu", gpu, "reason", reason)
	e.mu.Lock()
	to := e.to
	if to == nil {
		e.pending = append(e.pending, evictedCopy{function: function, reason: reason, gpu: gpu})
	}
	e.mu.Unlock()
	if to != nil {
		to.Evicted(function, gpu, reason)
	}
}

// attach sends the reports to the pool from now on (with those that came before); a pool without a controller
// (fcfs) keeps no count.
func (e *dataPlaneEvictions) attach(p pool.Pool) {
	to, ok := p.(evictedReceiver)
	if !ok {
		return
	}
	e.mu.Lock()
	pending := e.pending
	e.pending, e.to = nil, to
	e.mu.Unlock()
	for _, c := range pending {
		to.Evicted(c.function, c.gpu, c.reason)
	}
}

// evictionsCollector exports the pool's eviction counts as faas_gpu_evictions_total{by}: "controller" (its
// decisions), "pressure" and "reclaim" (the data plane's own, reported).
type evictionsCollector struct {
	p    pool.Pool
	desc *prometheus.Desc
}

func newEvictionsCollector(p pool.Pool) *evictionsCollector {
	return &evictionsCollector{p: p, desc: prometheus.NewDesc("faas_gpu_evictions_total",
		"Copies dropped from GPUs: by=controller for the controller's decisions, by=pressure and by=reclaim for "+
			"those the data plane made on its own (a swap-in out of chunks; another tenant's chunks back), reported "+
			"to and counted by the controller.", []string{"by"}, nil)}
}

func (c *evictionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *evictionsCollector) Collect(ch chan<- prometheus.Metric) {
	cp, ok := c.p.(interface{ EvictionCounts() pool.EvictionCounts })
	if !ok {
		return
	}
	ev := cp.EvictionCounts()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(ev.Controller), "controller")
	for _, by := range []string{"pressure", "reclaim"} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(ev.DataPlane[by]), by)
	}
}
