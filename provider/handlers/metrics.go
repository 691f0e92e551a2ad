package handlers

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are faas-provider's R.E.D. metrics of the /system endpoints, on a registry of our own.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "provider", Name: "http_requests_total", Help: "Total number of HTTP requests.",
		}, []string{"code", "method", "path"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "provider", Name: "http_request_duration_seconds", Help: "Seconds spent serving HTTP requests.",
			Buckets: prometheus.DefBuckets,
		}, []string{"code", "method", "path"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *metrics) instrument(next http.Handler, pathOverride string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		path := r.URL.Path
		if pathOverride != "" {
			path = pathOverride
		}
		labels := prometheus.Labels{"code": strconv.Itoa(sw.status), "method": r.Method, "path": path}
		m.requests.With(labels).Inc()
		m.duration.With(labels).Observe(time.Since(start).Seconds())
	}
}

// statusWriter records the status code; Unwrap lets http.ResponseController reach Flush on the real writer.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wroteHeader {
		s.status, s.wroteHeader = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	s.wroteHeader = true
	return s.ResponseWriter.Write(p)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
