// Package api serves a node pool over HTTP: function registration, acquire/release of GPU bindings, pool status
// and Prometheus metrics. The gpuserver listens with it on a Unix socket (and optionally TCP); function processes
// reach it through the gpu-python template, other components through package client.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Acquire timeouts: the default when a request names none, and the most a request may ask for.
const (
	DefaultAcquireTimeout = 30 * time.Second
	MaxAcquireTimeout     = 10 * time.Minute
	maxBodyBytes          = 1 << 20
)

// AcquireRequest is the optional body of POST /v1/functions/{name}/acquire.
type AcquireRequest struct {
	// TimeoutMS bounds the wait for a GPU; 0 means DefaultAcquireTimeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// RegisterResponse answers POST /v1/functions: the spec with its defaults, and the token the function's
// processes present to the remoting socket (FAAS_GPU_TOKEN) when the gpuserver serves CUDA remoting.
type RegisterResponse struct {
	pool.FunctionSpec
	Token string `json:"token,omitempty"`
}

// tokenSource is implemented by pools that hand out remoting tokens.
type tokenSource interface {
	Token(function string) string
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// errInvalidBody marks a request body that is not what the route expects.
var errInvalidBody = errors.New("invalid request body")

// Server answers the gpuserver API for one pool.
type Server struct {
	pool    pool.Pool
	log     *slog.Logger
	metrics *metrics
	router  chi.Router
}

// New returns a server for p. Metrics are registered with reg and served from gather (use one
// prometheus.NewRegistry for both); log may be nil.
func New(p pool.Pool, reg prometheus.Registerer, gather prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg, p)
	if err != nil {
		return nil, fmt.Errorf("register gpuserver metrics: %w", err)
	}
	s := &Server{pool: p, log: log, metrics: m}
	r := chi.NewRouter()
	r.Post("/v1/functions", s.register)
	r.Delete("/v1/functions/{name}", s.deregister)
	r.Post("/v1/functions/{name}/acquire", s.acquire)
	r.Post("/v1/bindings/{id}/release", s.release)
	r.Get("/v1/pool", s.status)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Handle("/metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
	s.router = r
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	var spec pool.FunctionSpec
	if err := decode(r, &spec); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.pool.Register(r.Context(), spec); err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("function registered", "function", spec.Name, "memory_bytes", spec.MemoryBytes, "slo", spec.SLO,
		"percentile", spec.Percentile, "isolation", spec.Isolation)
	_ = spec.Validate() // fills the defaults the pool applied, for the answer
	resp := RegisterResponse{FunctionSpec: spec}
	if t, ok := s.pool.(tokenSource); ok {
		resp.Token = t.Token(spec.Name)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) deregister(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	if err := s.pool.Deregister(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("function deregistered", "function", name)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	var req AcquireRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	timeout := DefaultAcquireTimeout
	switch {
	case req.TimeoutMS < 0:
		s.fail(w, r, fmt.Errorf("%w: timeout_ms must be >= 0", errInvalidBody))
		return
	case req.TimeoutMS > 0:
		timeout = min(time.Duration(req.TimeoutMS)*time.Millisecond, MaxAcquireTimeout)
	}
	ctx, cancel := context.WithTimeoutCause(r.Context(), timeout,
		fmt.Errorf("no GPU became free for %s within %s", name, timeout))
	defer cancel()
	start := time.Now()
	b, err := s.pool.Acquire(ctx, name)
	s.metrics.observeAcquire(name, time.Since(start), err)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", err, cause)
		}
		s.fail(w, r, err)
		return
	}
	s.log.Debug("bound", "function", name, "gpu", b.GPU, "binding", b.ID, "swap", b.Swap, "queued", b.Queued)
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	if err := s.pool.Release(r.Context(), chi.URLParam(r, "id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.pool.Status(r.Context()))
}

// StatusCode maps an error of a pool or of a request to the HTTP status the API answers with. It is the only
// place that does so; package client maps the statuses back to the same sentinels.
func StatusCode(err error) int {
	switch {
	case errors.Is(err, errInvalidBody), errors.Is(err, pool.ErrInvalidSpec):
		return http.StatusBadRequest
	case errors.Is(err, pool.ErrUnknownFunction), errors.Is(err, pool.ErrUnknownBinding):
		return http.StatusNotFound
	case errors.Is(err, pool.ErrTooLarge):
		return http.StatusUnprocessableEntity
	case errors.Is(err, pool.ErrOverloaded):
		return http.StatusTooManyRequests
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled), errors.Is(err, pool.ErrGPUUnhealthy):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := StatusCode(err)
	if oe := (*pool.OverloadedError)(nil); errors.As(err, &oe) { // shed by the overload control: when to retry
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(oe.RetryAfter.Seconds()))), 10))
	}
	if code >= http.StatusInternalServerError && code != http.StatusGatewayTimeout {
		s.log.Error("gpuserver request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, code, ErrorResponse{Error: err.Error()})
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %w", errInvalidBody, err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client may be gone; nothing useful to do with the error
}
