package worker

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Dead-letter reasons (label "reason" of faas_gpu_queue_dead_letters_total, and the head of the
// Faas-Dead-Letter-Reason header).
const (
	ReasonMalformed        = "malformed"
	ReasonOversized        = "oversized"
	ReasonUnknownFunction  = "unknown_function"
	ReasonRetriesExhausted = "retries_exhausted"
	ReasonMaxDeliveries    = "max_deliveries"
	ReasonCallbackFailed   = "callback_failed"
	// ReasonCallbackRefused: the callback URL leads to a forbidden address (the gateway's own); not retried.
	ReasonCallbackRefused = "callback_refused"
)

// metrics are the worker's Prometheus collectors.
type metrics struct {
	depth         *prometheus.GaugeVec     // queue
	held          prometheus.Gauge         // messages held (window + running + calling back)
	inflight      prometheus.Gauge         // invocations running
	waitSeconds   *prometheus.HistogramVec // function: from entering the system to dispatch
	dispatched    *prometheus.CounterVec   // function
	invocations   *prometheus.CounterVec   // function, code
	retries       *prometheus.CounterVec   // function
	deadLetters   *prometheus.CounterVec   // queue, reason
	callbacks     *prometheus.CounterVec   // result: ok, retried, failed
	served        *prometheus.CounterVec   // function: completed calls of functions with an SLO
	onTime        *prometheus.CounterVec   // function: of which within the SLO
	redeliveries  prometheus.Counter       // messages delivered more than once
	orderingNanos prometheus.Counter       // time spent in the ordering policy (push + pop)
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faas_gpu_queue_depth",
			Help: "Messages waiting in the queue's stream, not yet delivered to a worker."}, []string{"queue"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faas_gpu_queue_held_messages",
			Help: "Messages this worker holds: waiting in its lookahead window, running, or calling back."}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faas_gpu_queue_inflight",
			Help: "Invocations running."}),
		waitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faas_gpu_queue_wait_seconds",
			Help:    "Time from the call entering the system (X-Start-Time) to its dispatch.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .08, .1, .2, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"function"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_dispatched_total",
			Help: "Invocations dispatched (every attempt)."}, []string{"function"}),
		invocations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_invocations_total",
			Help: "Finished invocation attempts by function and HTTP status (0: no response)."}, []string{"function", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_retries_total",
			Help: "Invocation attempts scheduled for retry."}, []string{"function"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_dead_letters_total",
			Help: "Messages written to the dead-letter stream, by reason."}, []string{"queue", "reason"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_callbacks_total",
			Help: "Callback attempts by result (ok, retried, failed: given up)."}, []string{"result"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_slo_served_total",
			Help: "Completed calls of functions with an SLO."}, []string{"function"}),
		onTime: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_queue_slo_on_time_total",
			Help: "Completed calls that finished within their SLO from X-Start-Time."}, []string{"function"}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{Name: "faas_gpu_queue_redeliveries_total",
			Help: "Messages received with a delivery count above 1 (retries and redeliveries after a crash or ack wait)."}),
		orderingNanos: prometheus.NewCounter(prometheus.CounterOpts{Name: "faas_gpu_queue_ordering_seconds_total",
			Help: "Time spent in the ordering policy (push and pop), in seconds."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.depth, m.held, m.inflight, m.waitSeconds, m.dispatched,
			m.invocations, m.retries, m.deadLetters, m.callbacks, m.served, m.onTime, m.redeliveries, m.orderingNanos} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("worker: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}
