package api

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

type metrics struct {
	acquires      *prometheus.CounterVec
	wait          *prometheus.HistogramVec
	leasesExpired *prometheus.CounterVec
	denied        *prometheus.CounterVec
	// connections (conns.go)
	connsRefused    *prometheus.CounterVec
	connsIdleClosed prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, p pool.Pool) (*metrics, error) {
	m := &metrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faas_gpu_acquire_total",
			Help: "Acquire requests by function and result (ok, timeout, canceled, unknown, too_large, error).",
		}, []string{"function", "result"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "faas_gpu_acquire_wait_seconds",
			Help:    "Time from acquire to binding, by function.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"function"}),
	}
	m.leasesExpired = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "faas_gpu_binding_leases_expired_total",
		Help: "Bindings released because the connection that acquired them closed first, by function.",
	}, []string{"function"})
	m.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "faas_gpu_api_denied_total",
		Help: "API calls refused for their credential, by status (unauthorized, forbidden).",
	}, []string{"status"})
	m.connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "faas_gpu_api_connections_refused_total",
		Help: "API connections refused at accept, by reason (per_peer: the peer's bound, total: the listener's).",
	}, []string{"reason"})
	m.connsIdleClosed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "faas_gpu_api_connections_idle_closed_total",
		Help: "API connections closed after their idle timeout without holding a binding.",
	})
	for _, c := range []prometheus.Collector{m.acquires, m.wait, m.leasesExpired, m.denied, m.connsRefused,
		m.connsIdleClosed, newPoolCollector(p)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observeAcquire(function string, d time.Duration, err error) {
	result := "ok"
	switch {
	case err == nil:
		m.wait.WithLabelValues(function).Observe(d.Seconds())
	case errors.Is(err, context.DeadlineExceeded):
		result = "timeout"
	case errors.Is(err, context.Canceled):
		result = "canceled"
	case errors.Is(err, pool.ErrUnknownFunction):
		result, function = "unknown", "" // unbounded names stay out of the label set
	case errors.Is(err, pool.ErrTooLarge):
		result = "too_large"
	default:
		result = "error"
	}
	m.acquires.WithLabelValues(function, result).Inc()
}

// poolCollector turns a pool's status into gauges at scrape time.
type poolCollector struct {
	pool                                pool.Pool
	gpuBusy, gpuUsed, gpuTotal, healthy *prometheus.Desc
	gpuBindings, gpuRequested           *prometheus.Desc // compute shares: bindings on a GPU, their requests' sum
	queued, running, served, onTime     *prometheus.Desc
	refused, shed, fnsActive, fnsMet    *prometheus.Desc
	demand                              *prometheus.Desc
}

func newPoolCollector(p pool.Pool) *poolCollector {
	gpu := []string{"gpu"}
	fn := []string{"function"}
	return &poolCollector{
		pool: p,
		gpuBusy: prometheus.NewDesc("faas_gpu_gpu_busy", "1 while a binding runs on the GPU.",
			[]string{"gpu", "name"}, nil),
		gpuUsed: prometheus.NewDesc("faas_gpu_gpu_memory_used_bytes", "GPU memory held by resident functions.",
			gpu, nil),
		gpuTotal: prometheus.NewDesc("faas_gpu_gpu_memory_bytes", "GPU memory the pool manages.", gpu, nil),
		healthy:  prometheus.NewDesc("faas_gpu_gpu_healthy", "1 while the GPU is healthy.", gpu, nil),
		gpuBindings: prometheus.NewDesc("faas_gpu_gpu_bindings",
			"Bindings on the GPU now: 0 idle, 1 exclusive or alone, more while co-runners share it.", gpu, nil),
		gpuRequested: prometheus.NewDesc("faas_gpu_gpu_compute_requested",
			"Sum of the compute requests of the GPU's bindings (1 for an exclusive one).", gpu, nil),
		queued:  prometheus.NewDesc("faas_gpu_queued_requests", "Requests waiting for a GPU, by function.", fn, nil),
		running: prometheus.NewDesc("faas_gpu_running_requests", "Requests bound to a GPU, by function.", fn, nil),
		served:  prometheus.NewDesc("faas_gpu_served_requests_total", "Requests released, by function.", fn, nil),
		onTime: prometheus.NewDesc("faas_gpu_on_time_requests_total",
			"Requests released within the function's SLO, by function.", fn, nil),
		refused: prometheus.NewDesc("faas_gpu_refused_requests_total",
			"Requests the overload control refused (429 with Retry-After), by function.", fn, nil),
		shed: prometheus.NewDesc("faas_gpu_function_shed",
			"1 while the overload control sheds the function (its requests wait behind the others').", fn, nil),
		fnsActive: prometheus.NewDesc("faas_gpu_functions_with_requests",
			"Functions with at least one request served or refused since the gpuserver started.", nil, nil),
		fnsMet: prometheus.NewDesc("faas_gpu_functions_within_slo",
			"Functions with at least their SLO percentile of requests on time (refused ones count as missed).", nil, nil),
		demand: prometheus.NewDesc("faas_gpu_overload_demand_gpus",
			"The functions' estimated demand in GPUs at the overload control's last decision.", nil, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.gpuBusy, c.gpuUsed, c.gpuTotal, c.healthy, c.gpuBindings, c.gpuRequested, c.queued, c.running,
		c.served, c.onTime, c.refused, c.shed, c.fnsActive, c.fnsMet, c.demand} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.pool.Status(context.Background()) // scrapes carry no context; Status does not block on I/O
	for _, g := range st.GPUs {
		idx := strconv.Itoa(g.Index)
		ch <- prometheus.MustNewConstMetric(c.gpuBusy, prometheus.GaugeValue, b2f(g.Busy), idx, g.Name)
		ch <- prometheus.MustNewConstMetric(c.gpuUsed, prometheus.GaugeValue, float64(g.UsedBytes), idx)
		ch <- prometheus.MustNewConstMetric(c.gpuTotal, prometheus.GaugeValue, float64(g.MemoryBytes), idx)
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, b2f(g.Healthy), idx)
		bindings, requested := gpuBindings(g)
		ch <- prometheus.MustNewConstMetric(c.gpuBindings, prometheus.GaugeValue, bindings, idx)
		ch <- prometheus.MustNewConstMetric(c.gpuRequested, prometheus.GaugeValue, requested, idx)
	}
	for _, f := range st.Functions {
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(f.Queued), f.Name)
		ch <- prometheus.MustNewConstMetric(c.running, prometheus.GaugeValue, float64(f.Running), f.Name)
		ch <- prometheus.MustNewConstMetric(c.served, prometheus.CounterValue, float64(f.Served), f.Name)
		ch <- prometheus.MustNewConstMetric(c.onTime, prometheus.CounterValue, float64(f.OnTime), f.Name)
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(f.Refused), f.Name)
		ch <- prometheus.MustNewConstMetric(c.shed, prometheus.GaugeValue, b2f(f.Shed), f.Name)
	}
	sum := pool.Summarize(st.Functions)
	ch <- prometheus.MustNewConstMetric(c.fnsActive, prometheus.GaugeValue, float64(sum.Functions))
	ch <- prometheus.MustNewConstMetric(c.fnsMet, prometheus.GaugeValue, float64(sum.FunctionsMet))
	if st.Overload != nil {
		ch <- prometheus.MustNewConstMetric(c.demand, prometheus.GaugeValue, st.Overload.Demand)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
