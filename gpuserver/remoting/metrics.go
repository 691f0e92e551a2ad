package remoting

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metrics are the remoting server's counters; registered with Config.Metrics when set.
type metrics struct {
	acceptErrors prometheus.Counter
	panics       prometheus.Counter
	refused      *prometheus.CounterVec
	sessions     prometheus.Gauge
	records      prometheus.Counter
	late         prometheus.Counter
	busy         prometheus.Counter
	boundPoll    prometheus.Counter
	boundSleeps  prometheus.Counter
	sleeps       prometheus.Counter
	handedOff    prometheus.Counter
}

// Reasons a connection is refused (the label of faas_gpu_remoting_refused_total).
var refuseReasons = []string{"protocol", "version", "identity", "shared_memory", "sessions_per_function",
	"pending_hellos", "pending_hellos_per_peer", "internal", "handoff", "instance"}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		acceptErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_accept_errors_total",
			Help: "Failed accepts on the remoting socket (EMFILE and the like), each retried after a back-off.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_session_panics_total",
			Help: "Remoting sessions ended by a panic (the session is closed, the server goes on).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_refused_total",
			Help: "Remoting connections refused, by reason.",
		}, []string{"reason"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "faas_gpu_remoting_sessions",
			Help: "Open remoting sessions.",
		}),
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_records_total",
			Help: "Call records executed by remoting sessions (synchronous and asynchronous).",
		}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_late_records_total",
			Help: "Asynchronous call records that reached their session together with the synchronous call after " +
				"them (the same publication of the ring): work that waited for the client's next synchronisation " +
				"instead of running while the client went on issuing.",
		}),
		busy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_record_seconds_total",
			Help: "Time sessions spent executing asynchronous call records (decoding them and handing their work " +
				"to the device): the server's cost per launch, memset or copy the client does not wait for.",
		}),
		boundPoll: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_bound_poll_seconds_total",
			Help: "Time sessions spent polling an empty ring while their function held a binding instead of " +
				"sleeping on the socket: the CPU the server spends so that a request's calls need no wake-up.",
		}),
		boundSleeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_bound_sleeps_total",
			Help: "Times a session slept on its socket although its function held a binding (it polled for the " +
				"whole BoundSpin without a record): each costs the request a doorbell and a wake-up.",
		}),
		sleeps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_sleeps_total",
			Help: "Times a session found its ring empty for its whole spin time and slept on its socket: each costs " +
				"the client a doorbell and the session a wake-up. Many sleeps per request mean the client's calls " +
				"arrive further apart than the spin time.",
		}),
		handedOff: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "faas_gpu_remoting_handed_off_total",
			Help: "Remoting sessions whose hello the gpuserver checked and handed to their tenant's executor process " +
				"(docs/tenants.md); their records are counted by the executors.",
		}),
	}
	for _, r := range refuseReasons {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.acceptErrors, m.panics, m.refused, m.sessions, m.records,
			m.late, m.busy, m.boundPoll, m.boundSleeps, m.sleeps, m.handedOff} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var d dto.Metric
	if err := (<-ch).Write(&d); err != nil {
		return 0
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func (m *metrics) stats() Stats {
	st := Stats{AcceptErrors: int64(value(m.acceptErrors)), SessionPanics: int64(value(m.panics)),
		Refused: map[string]int64{}, Records: int64(value(m.records)), Sleeps: int64(value(m.sleeps)),
		LateRecords: int64(value(m.late)), RecordTime: time.Duration(value(m.busy) * 1e9),
		BoundPoll: time.Duration(value(m.boundPoll) * 1e9), BoundSleeps: int64(value(m.boundSleeps)),
		HandedOff: int64(value(m.handedOff))}
	for _, r := range refuseReasons {
		st.Refused[r] = int64(value(m.refused.WithLabelValues(r)))
	}
	return st
}
