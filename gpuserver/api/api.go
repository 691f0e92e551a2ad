// Package api serves a node pool over HTTP: function registration, acquire/release of GPU bindings, pool status
// and Prometheus metrics. The gpuserver listens with it on a Unix socket (and optionally TCP); function processes
// reach it through the gpu-python template, other components through package client.
//
// # Who may do what
//
// With an Authenticator (the gpuserver always sets one; see package auth), every call that changes the pool
// carries a bearer credential (Authorization: Bearer <token>):
//
//   - POST /v1/functions (register): the administrator's token (the provider), or a registration ticket for
//     exactly the spec in the body (a function registering itself with the ticket its provider issued);
//   - DELETE /v1/functions/{name}: the administrator's token;
//   - POST /v1/functions/{name}/acquire: the function's own token (or the administrator's);
//   - POST /v1/bindings/{id}/release: the token of the function the binding belongs to (or the administrator's).
//     A binding of another function answers 404, as an unknown one does;
//   - GET /v1/pool (the pool's status) and GET /v1/usage (the functions' bill): the administrator's token sees
//     every function; a function's own token sees its tenant's part only, the functions of its namespace (their
//     status, residents, executors and bill; the GPUs' health and size, nothing of other tenants: scope.go).
//
// /metrics and /healthz are open to whoever can reach the socket (whose file mode keeps other users out). A missing
// credential answers 401, a credential that does not allow the call 403.
//
// # Leases
//
// A binding belongs to the connection that acquired it: when that connection closes (the function process died,
// the client gave up) the binding is released, logged and counted (faas_gpu_binding_leases_expired_total). A
// client holds the connection open from acquire to release (package client and the gpu-python template do).
// Binding ids are 128 random bits: they cannot be guessed, and they are only useful with the owner's token.
// Leases need the connection hooks of NewHTTPServer; a handler served by another http.Server gives bindings no
// holder (they live until released).
package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Acquire timeouts: the default when a request names none, and the most a request may ask for.
const (
	DefaultAcquireTimeout = 30 * time.Second
	MaxAcquireTimeout     = 10 * time.Minute
	maxBodyBytes          = 1 << 20
)

// DefaultMaxAcquiresPerFunction bounds the acquires one function may have waiting or bound at once.
const DefaultMaxAcquiresPerFunction = 1024

// AcquireRequest is the optional body of POST /v1/functions/{name}/acquire.
type AcquireRequest struct {
	// TimeoutMS bounds the wait for a GPU; 0 means DefaultAcquireTimeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Instance names the calling process's instance of the function (its replica: FAAS_GPU_INSTANCE, which its
	// shim's hello names too); "" is the function itself. Instances are bound concurrently, each on a GPU of its own
	// (docs/design.md, decision 10).
	Instance string `json:"instance,omitempty"`
}

// RegisterResponse answers POST /v1/functions: the spec with its defaults, and the token the function's
// processes present to the remoting socket and to acquire and release (FAAS_GPU_TOKEN).
type RegisterResponse struct {
	pool.FunctionSpec
	Token string `json:"token,omitempty"`
}

// Authenticator checks the credentials of API calls (auth.Key implements it).
type Authenticator interface {
	// IsAdmin reports whether token is the administrator's.
	IsAdmin(token string) bool
	// IsFunction reports whether token is function's.
	IsFunction(function, token string) bool
	// IsTicket reports whether ticket allows registering exactly spec.
	IsTicket(spec pool.FunctionSpec, ticket string) bool
	// FunctionToken is the token a registration answers: the function processes' credential.
	FunctionToken(function string) string
}

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
	// Restart says that the function's process must start again (pool.ErrFunctionLost): its GPU memory is gone
	// and only a new initialisation brings it back.
	Restart bool `json:"restart,omitempty"`
}

// errInvalidBody marks a request body that is not what the route expects.
var errInvalidBody = errors.New("invalid request body")

// errTooManyAcquires: a function has DefaultMaxAcquiresPerFunction acquires open.
var errTooManyAcquires = errors.New("too many acquires")

// Option configures a Server.
type Option func(*Server)

// WithAuth makes the server check credentials (see the package comment). Without it the API is open: for tests
// and embedding only.
func WithAuth(a Authenticator) Option { return func(s *Server) { s.auth = a } }

// WithMaxAcquiresPerFunction bounds the acquires one function may have waiting or bound at once
// (DefaultMaxAcquiresPerFunction when n <= 0).
func WithMaxAcquiresPerFunction(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.maxAcquires = n
		}
	}
}

// Server answers the gpuserver API for one pool.
type Server struct {
	pool        pool.Pool
	log         *slog.Logger
	metrics     *metrics
	router      *http.ServeMux
	auth        Authenticator
	maxAcquires int
	usage       UsageSource // nil: no /v1/usage

	limits Limits

	mu            sync.Mutex
	leases        map[string]*lease    // by public binding id
	holders       map[net.Conn]*holder // connections served through NewHTTPServer
	acquires      map[string]int       // open acquires per function
	refusalLogged time.Time            // last log line about refused connections (conns.go)
	// shedLogged is, per function, the overload episode whose first refusal was logged (one line per episode).
	shedLogged map[string]uint64
}

// lease is a binding handed out by the API.
type lease struct {
	id       string // public, random
	poolID   string // the pool's own id
	function string
	holder   *holder // nil without connection hooks
	done     func()  // uncounts the acquire (openAcquire)
}

// holder is one client connection and the leases it holds.
type holder struct {
	closed bool
	leases map[string]*lease
	idle   *time.Timer // closes the connection when it stays idle without a lease (conns.go)
}

type holderKey struct{}

// New returns a server for p. Metrics are registered with reg and served from gather (use one
// prometheus.NewRegistry for both); log may be nil.
func New(p pool.Pool, reg prometheus.Registerer, gather prometheus.Gatherer, log *slog.Logger,
	opts ...Option) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg, p)
	if err != nil {
		return nil, fmt.Errorf("register gpuserver metrics: %w", err)
	}
	s := &Server{pool: p, log: log, metrics: m, maxAcquires: DefaultMaxAcquiresPerFunction,
		limits: Limits{}.withDefaults(), leases: map[string]*lease{}, holders: map[net.Conn]*holder{},
		acquires: map[string]int{}}
	for _, o := range opts {
		o(s)
	}
	r := http.NewServeMux()
	r.HandleFunc("POST /v1/functions", s.register)
	r.HandleFunc("DELETE /v1/functions/{name}", s.deregister)
	r.HandleFunc("POST /v1/functions/{name}/acquire", s.acquire)
	r.HandleFunc("POST /v1/bindings/{id}/release", s.release)
	r.HandleFunc("GET /v1/pool", s.status)
	if s.usage != nil {
		r.HandleFunc("GET /v1/usage", s.serveUsage)
	}
	r.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	r.Handle("/metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
	s.router = r
	return s, nil
}

// ServeHTTP implements http.Handler. A request's body must arrive within Limits.BodyTimeout.
//
// A path that is not in its clean form ("/.", "//v1/pool", "/v1/pool/") names no route: it is answered 404, not
// redirected to its clean form as http.ServeMux would, so that no client is sent elsewhere by the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.Path; p != "/" && path.Clean(p) != p {
		http.NotFound(w, r)
		return
	}
	s.bodyDeadline(w, r)
	s.router.ServeHTTP(w, r)
}

// NewHTTPServer returns an http.Server for the API with the connection hooks that tie bindings to the
// connections that acquired them (leases) and close idle connections, and bounded header reads. Serve it on
// Listener(l) for the bounds on connections per peer.
func (s *Server) NewHTTPServer() *http.Server {
	return &http.Server{Handler: s, ReadHeaderTimeout: s.limits.ReadHeaderTimeout, MaxHeaderBytes: 64 << 10,
		ConnContext: s.connContext, ConnState: s.connState}
}

func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	h := &holder{leases: map[string]*lease{}}
	s.mu.Lock()
	s.holders[c] = h
	s.mu.Unlock()
	return context.WithValue(ctx, holderKey{}, h)
}

// connState releases the leases of a connection that closed, and closes one that stays idle without a lease.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	if st == http.StateIdle || st == http.StateActive {
		s.mu.Lock()
		if h := s.holders[c]; h != nil {
			s.idleLocked(c, h, st == http.StateIdle)
		}
		s.mu.Unlock()
		return
	}
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	s.mu.Lock()
	h := s.holders[c]
	delete(s.holders, c)
	var gone []*lease
	if h != nil {
		s.idleLocked(c, h, false)
		h.closed = true
		for id, l := range h.leases {
			gone = append(gone, l)
			delete(s.leases, id)
		}
		h.leases = nil
	}
	s.mu.Unlock()
	for _, l := range gone {
		s.expire(l)
	}
}

// expire releases a binding whose holder went away.
func (s *Server) expire(l *lease) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a connection callback: no request ctx
	defer cancel()
	err := s.pool.Release(ctx, l.poolID)
	l.done()
	s.metrics.leasesExpired.WithLabelValues(l.function).Inc()
	s.log.Warn("binding released: the connection that acquired it closed before releasing it",
		"function", l.function, "binding", l.id, "err", err)
}

// bearer returns the request's bearer credential, "" when none.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "Bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// authorize lets the call through when the credential is the administrator's or passes allowed; it returns
// auth.ErrUnauthenticated without a credential and auth.ErrForbidden with one that does not pass. Without an
// Authenticator every call passes.
func (s *Server) authorize(r *http.Request, what string, allowed func(token string) bool) error {
	if s.auth == nil {
		return nil
	}
	tok := bearer(r)
	if tok == "" {
		return fmt.Errorf("%w: %s needs a credential (Authorization: Bearer <token>)", auth.ErrUnauthenticated, what)
	}
	if s.auth.IsAdmin(tok) || (allowed != nil && allowed(tok)) {
		return nil
	}
	return fmt.Errorf("%w: the credential does not allow %s", auth.ErrForbidden, what)
}

func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	// The credential first: without one, or with one that is neither the administrator's nor shaped like a
	// ticket, the body is never read. A ticket is checked against the spec it registers, once the body is in.
	if s.auth != nil {
		if tok := bearer(r); tok == "" || !s.auth.IsAdmin(tok) && !ticketShaped(tok) {
			s.fail(w, r, s.authorize(r, "registering a function", nil))
			return
		}
	}
	var spec pool.FunctionSpec
	if err := decode(r, &spec); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.authorize(r, fmt.Sprintf("registering function %q", spec.Name), func(tok string) bool {
		return s.auth.IsTicket(spec, tok)
	}); err != nil {
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
	if !spec.Exclusive() {
		req, limit := spec.Shares()
		s.log.Warn("function asks for a compute share, which this gpuserver does not enforce yet: its bindings are "+
			"exclusive and billed as share 1", "function", spec.Name, "compute_request", req, "compute_limit", limit)
	}
	resp := RegisterResponse{FunctionSpec: spec}
	if s.auth != nil {
		resp.Token = s.auth.FunctionToken(spec.Name)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) deregister(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.authorize(r, fmt.Sprintf("deregistering function %q", name), nil); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.pool.Deregister(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Info("function deregistered", "function", name)
	w.WriteHeader(http.StatusNoContent)
}

// openAcquire counts an acquire of function against the per-function bound; done uncounts it.
func (s *Server) openAcquire(function string) (done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acquires[function] >= s.maxAcquires {
		return nil, fmt.Errorf("%w: function %q has %d acquires waiting or bound, the most one function may have",
			errTooManyAcquires, function, s.acquires[function])
	}
	s.acquires[function]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.acquires[function]--; s.acquires[function] <= 0 {
			delete(s.acquires, function)
		}
	}, nil
}

func (s *Server) acquire(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.authorize(r, fmt.Sprintf("acquiring a GPU for function %q", name), func(tok string) bool {
		return s.auth.IsFunction(name, tok)
	}); err != nil {
		s.fail(w, r, err)
		return
	}
	var req AcquireRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if err := pool.CheckInstance(req.Instance); err != nil {
		s.fail(w, r, fmt.Errorf("%w: instance: %w", errInvalidBody, err))
		return
	}
	timeout := DefaultAcquireTimeout
	switch {
	case req.TimeoutMS < 0:
		s.fail(w, r, fmt.Errorf("%w: timeout_ms must be >= 0", errInvalidBody))
		return
	case req.TimeoutMS > 0:
		timeout = min(time.Duration(min(req.TimeoutMS, MaxAcquireTimeout.Milliseconds()))*time.Millisecond,
			MaxAcquireTimeout)
	}
	done, err := s.openAcquire(name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeoutCause(r.Context(), timeout,
		fmt.Errorf("no GPU became free for %s within %s", name, timeout))
	defer cancel()
	start := time.Now()
	b, err := s.pool.Acquire(ctx, pool.InstanceKey(name, req.Instance))
	s.metrics.observeAcquire(name, time.Since(start), err)
	if err != nil {
		done()
		if cause := context.Cause(ctx); cause != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", err, cause)
		}
		s.fail(w, r, err)
		return
	}
	l, err := s.hold(r.Context(), b, done)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.log.Debug("bound", "function", name, "gpu", b.GPU, "binding", l.id, "swap", b.Swap, "queued", b.Queued)
	b.ID = l.id
	writeJSON(w, http.StatusOK, b)
}

// hold records a binding as a lease of the request's connection under a fresh random id. If the connection
// closed meanwhile, the binding is released at once.
func (s *Server) hold(ctx context.Context, b pool.Binding, done func()) (*lease, error) {
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		done()
		return nil, errors.Join(fmt.Errorf("binding id: %w", err), s.pool.Release(context.WithoutCancel(ctx), b.ID))
	}
	l := &lease{id: hex.EncodeToString(raw[:]), poolID: b.ID, function: b.Function, done: done}
	h, _ := ctx.Value(holderKey{}).(*holder)
	s.mu.Lock()
	if h != nil && h.closed {
		s.mu.Unlock()
		s.expire(l)
		return nil, fmt.Errorf("%w: the connection closed while the GPU was acquired", context.Canceled)
	}
	l.holder = h
	s.leases[l.id] = l
	if h != nil {
		h.leases[l.id] = l
	}
	s.mu.Unlock()
	return l, nil
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	l := s.leases[id]
	s.mu.Unlock()
	if l == nil {
		s.fail(w, r, fmt.Errorf("%w: %s", pool.ErrUnknownBinding, id))
		return
	}
	if err := s.authorize(r, "releasing this binding", func(tok string) bool {
		return s.auth.IsFunction(l.function, tok)
	}); err != nil {
		if errors.Is(err, auth.ErrForbidden) { // another function's binding is as unknown as a made-up one
			err = fmt.Errorf("%w: %s", pool.ErrUnknownBinding, id)
		}
		s.fail(w, r, err)
		return
	}
	s.mu.Lock()
	if s.leases[id] != l { // released meanwhile (by its holder's end, or a concurrent release)
		s.mu.Unlock()
		s.fail(w, r, fmt.Errorf("%w: %s", pool.ErrUnknownBinding, id))
		return
	}
	delete(s.leases, id)
	if l.holder != nil {
		delete(l.holder.leases, id)
	}
	s.mu.Unlock()
	defer l.done()
	if err := s.pool.Release(r.Context(), l.poolID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	sc, err := s.readerScope(r, "reading the pool's status")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, scopeStatus(s.pool.Status(r.Context()), sc))
}

// StatusCode maps an error of a pool or of a request to the HTTP status the API answers with. It is the only
// place that does so; package client maps the statuses back to the same sentinels.
func StatusCode(err error) int {
	switch {
	case errors.Is(err, errInvalidBody), errors.Is(err, pool.ErrInvalidSpec):
		return http.StatusBadRequest
	case errors.Is(err, errBodyTimeout):
		return http.StatusRequestTimeout
	case errors.Is(err, auth.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, auth.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, pool.ErrUnknownFunction), errors.Is(err, pool.ErrUnknownBinding):
		return http.StatusNotFound
	case errors.Is(err, pool.ErrTooLarge):
		return http.StatusUnprocessableEntity
	case errors.Is(err, pool.ErrLimit), errors.Is(err, errTooManyAcquires), errors.Is(err, pool.ErrOverloaded):
		return http.StatusTooManyRequests
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, context.Canceled), errors.Is(err, pool.ErrGPUUnhealthy), errors.Is(err, pool.ErrNoHealthyGPU),
		errors.Is(err, pool.ErrBindingBroken), errors.Is(err, pool.ErrFunctionLost), errors.Is(err, pool.ErrBackedOff):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := StatusCode(err)
	if code == http.StatusUnauthorized || code == http.StatusForbidden {
		s.metrics.denied.WithLabelValues(strings.ToLower(http.StatusText(code))).Inc()
		s.log.Warn("gpuserver request denied", "method", r.Method, "path", r.URL.Path, "err", err)
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gpuserver"`)
		}
	}
	if code == http.StatusRequestTimeout {
		w.Header().Set("Connection", "close") // the rest of the body is not read
	}
	if oe := (*pool.OverloadedError)(nil); errors.As(err, &oe) { // shed by the overload control: when to retry
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(oe.RetryAfter.Seconds()))), 10))
		s.logShed(oe)
	}
	backedOff := false
	if be := (*pool.BackedOffError)(nil); errors.As(err, &be) { // backed off after repeated kernel faults
		w.Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(be.RetryAfter.Seconds()))), 10))
		backedOff = true // logged once per backoff by the gpuserver, not once per refused request
	}
	if code >= http.StatusInternalServerError && code != http.StatusGatewayTimeout && !backedOff {
		s.log.Error("gpuserver request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, code, ErrorResponse{Error: err.Error(), Restart: errors.Is(err, pool.ErrFunctionLost)})
}

// ticketShaped reports whether tok has the shape of a credential the gpuserver issues (hex of an HMAC-SHA256).
func ticketShaped(tok string) bool {
	if len(tok) != 64 {
		return false
	}
	for _, c := range tok {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// maxShedLogged bounds the functions whose last logged overload episode is remembered.
const maxShedLogged = 4096

// logShed logs a refusal of the overload control once per function and episode.
func (s *Server) logShed(oe *pool.OverloadedError) {
	s.mu.Lock()
	if s.shedLogged == nil || len(s.shedLogged) >= maxShedLogged {
		s.shedLogged = map[string]uint64{}
	}
	seen := oe.Episode != 0 && s.shedLogged[oe.Function] == oe.Episode
	s.shedLogged[oe.Function] = oe.Episode
	s.mu.Unlock()
	if !seen {
		s.log.Warn("overload control sheds a function: its requests that cannot meet their deadline are refused "+
			"with 429 (logged once per episode; faas_gpu_refused_requests_total counts them)", "function",
			oe.Function, "episode", oe.Episode, "retry_after", oe.RetryAfter, "reason", oe.Reason)
	}
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("%w: %w", errBodyTimeout, err)
		}
		return fmt.Errorf("%w: %w", errInvalidBody, err)
	}
	// Read to the body's end (within its deadline), which lifts the deadline for a handler that waits long.
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxBodyBytes)); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("%w: %w", errBodyTimeout, err)
		}
		return fmt.Errorf("%w: %w", errInvalidBody, err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client may be gone; nothing useful to do with the error
}
