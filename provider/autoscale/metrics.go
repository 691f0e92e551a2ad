package autoscale

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics exports the autoscaler's view of each function (named name.namespace, as the OpenFaaS gateway names
// functions in its metrics). It is a prometheus.Collector; a nil *Metrics records nothing.
type Metrics struct {
	decisions *prometheus.CounterVec
	replicas  *prometheus.GaugeVec
	load      *prometheus.GaugeVec
}

// NewMetrics returns the autoscaler's metrics, to register on a registry.
func NewMetrics() *Metrics {
	return &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faas_gpu_autoscaler_decisions_total",
			Help: "Replica counts the autoscaler set, by function and direction (up, down, zero).",
		}, []string{"function", "direction"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "faas_gpu_autoscaler_replicas",
			Help: "Replicas of an autoscaled function after the autoscaler's last look.",
		}, []string{"function"}),
		load: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "faas_gpu_autoscaler_inflight_requests",
			Help: "The most requests an autoscaled function had in flight at once (proxied or waiting for a replica) between the autoscaler's last two looks.",
		}, []string{"function"}),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.decisions.Describe(ch)
	m.replicas.Describe(ch)
	m.load.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.decisions.Collect(ch)
	m.replicas.Collect(ch)
	m.load.Collect(ch)
}

// Observed records a look at a function: its load and the replicas it has after the look.
func (m *Metrics) Observed(function string, load, replicas uint64) {
	if m == nil {
		return
	}
	m.load.WithLabelValues(function).Set(float64(load))
	m.replicas.WithLabelValues(function).Set(float64(replicas))
}

// Decided counts a decision that was applied.
func (m *Metrics) Decided(function string, d Decision) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(function, string(d.Direction)).Inc()
}

// Forget drops a function that is gone (deleted, or no longer autoscaled).
func (m *Metrics) Forget(function string) {
	if m == nil {
		return
	}
	m.replicas.DeleteLabelValues(function)
	m.load.DeleteLabelValues(function)
	m.decisions.DeletePartialMatch(prometheus.Labels{"function": function})
}

// DecisionCount is how many decisions in direction d were applied to function (tests, checks).
func (m *Metrics) DecisionCount(function string, d Direction) float64 {
	var out dto.Metric
	if err := m.decisions.WithLabelValues(function, string(d)).Write(&out); err != nil {
		return 0
	}
	return out.GetCounter().GetValue()
}
