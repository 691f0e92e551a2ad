package remoting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/peer"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Registry tells the server which functions may connect: their requirements and the token handed out when the
// function was registered (the function process gets it as FAAS_GPU_TOKEN).
type Registry interface {
	// Function returns a registered function's spec and token; an error (pool.ErrUnknownFunction) otherwise.
	Function(name string) (spec pool.FunctionSpec, token string, err error)
}

// InstanceRegistry is implemented by a Registry that knows a function's instances (docs/design.md, decision 10):
// Instance makes instance of function known (placed by the controller, its memory held by the data plane) and
// returns its key (pool.InstanceKey), under which the session's calls run; InstanceEnded says that the last session
// of a key ended (its process is gone). With a Registry that does not implement it, a hello naming an instance is
// served as the function itself.
type InstanceRegistry interface {
	Instance(ctx context.Context, function, instance string) (key string, err error)
	InstanceEnded(key string)
}

// Binder tells the server on which GPU a function's calls run.
type Binder interface {
	// CurrentGPU reports the GPU of the function's request in flight (between acquire and release), if any.
	CurrentGPU(function string) (gpu int, ok bool)
	// BindImplicit binds the function to a GPU for calls made outside any request (initialisation). The server
	// calls release when the session has been idle for Config.IdleRelease, when a request binds the function,
	// or when the session ends.
	BindImplicit(ctx context.Context, function string) (gpu int, release func(), err error)
}

// SessionInfo describes a connected function process.
type SessionInfo struct {
	Function string
	Spec     pool.FunctionSpec
	PID      int
}

// Config configures a Server.
type Config struct {
	// Device is the node's GPUs (modules, events); Node the node's executors, which own every function's
	// fixed-address blocks, its swaps and its compute streams. Both are required unless NewHandler is set.
	Device device.Backend
	Node   *executor.Node
	// Functions identifies connecting functions; required.
	Functions Registry
	// Binder binds calls to GPUs; required unless NewHandler is set.
	Binder Binder
	// Logger receives session events (keys function, gpu); slog.Default() when nil.
	Logger *slog.Logger
	// Spin is how long a session polls its ring before it sleeps on the socket (50us when 0).
	Spin time.Duration
	// BoundSpin is how long a session whose function holds a binding (a request's, or the session's implicit
	// one) polls its empty ring before it sleeps (20ms when 0): while the function runs a request its records
	// reach the device without a doorbell or a wake-up, at the cost of a core polling between them (counted in
	// faas_gpu_remoting_bound_poll_seconds_total). A negative value turns it off (Spin applies throughout).
	BoundSpin time.Duration
	// IdleRelease is how long a session waits idle before it releases an implicit binding (20ms when 0).
	IdleRelease time.Duration
	// MaxImplicitHold is the longest a session keeps an implicit binding while its calls keep coming: then it
	// gives the GPU up and binds again, behind the requests waiting for one (the gpuserver's maximum binding
	// hold); 0 means no bound.
	MaxImplicitHold time.Duration
	// NewHandler replaces the device-backed handler (benchmarks of the transport, tests). A handler that
	// implements io.Closer is closed when its session ends.
	NewHandler func(ctx context.Context, info SessionInfo) (Handler, error)
	// MaxSessionsPerFunction caps the open sessions of one function (all its processes together);
	// DefaultMaxSessionsPerFunction when 0. A hello beyond it is refused with a message naming the limit.
	MaxSessionsPerFunction int
	// MaxPendingHellos caps the connections accepted whose hello has not been checked yet (they have proven
	// nothing); DefaultMaxPendingHellos when 0. Connections beyond it are closed at once.
	MaxPendingHellos int
	// MaxPendingHellosPerPeer caps those of one peer (the user of the connecting process, from SO_PEERCRED), so
	// that connections that never say hello from one user cannot take the slots every function's new session
	// needs; DefaultMaxPendingHellosPerPeer when 0.
	MaxPendingHellosPerPeer int
	// HelloTimeout bounds the wait for a connection's hello (10s when 0).
	HelloTimeout time.Duration
	// MaxModuleBytesPerFunction bounds the module images one function's sessions hold together (distinct images,
	// plus the chunks of images being received); DefaultMaxModuleBytesPerFunction when 0. A load or chunk beyond
	// it fails with CUDA_ERROR_OUT_OF_MEMORY.
	MaxModuleBytesPerFunction uint64
	// MaxModuleBytes bounds the module images the node holds (each distinct image once, plus chunks being
	// received); DefaultMaxModuleBytes when 0.
	MaxModuleBytes uint64
	// NodeImages, when set, is the node's bound on module images over every process that runs its sessions (the
	// gpuserver with an executor per tenant): this server's images reserve their bytes there too.
	NodeImages NodeImageBudget
	// MaxGraphBytesPerFunction bounds the memory the CUDA graphs of one function's sessions take together
	// (captures, graphs and executable graphs); DefaultMaxGraphBytesPerFunction when 0. A capture beyond it is
	// invalidated (its end answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), an instantiation beyond it answers
	// CUDA_ERROR_OUT_OF_MEMORY.
	MaxGraphBytesPerFunction uint64

	images  *moduleImages    // the node's module images, shared by every session (set by NewServer)
	budgets *functionBudgets // what each function's sessions hold together (set by NewServer)
	// Metrics, when set, receives the server's counters (faas_gpu_remoting_*).
	Metrics prometheus.Registerer
	// HandOff, when set, runs every session elsewhere once its hello passed (a tenant executor process); Device,
	// Node and Binder are then not needed. See HandOff.
	HandOff HandOff
}

// Limits of a server when its Config names none.
const (
	DefaultMaxSessionsPerFunction  = 64
	DefaultMaxPendingHellos        = 128
	DefaultMaxPendingHellosPerPeer = 16
)

// Accept back-off: after a failed accept (EMFILE, ENFILE, ENOBUFS, ...) the server waits acceptBackoffMin,
// doubling up to acceptBackoffMax, and tries again: a node out of file descriptors recovers once some are closed.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// Server accepts the shim's connections on a Unix socket.
type Server struct {
	cfg Config
	log *slog.Logger

	metrics *metrics

	mu         sync.Mutex
	conns      map[*net.UnixConn]struct{}
	sessions   map[string]int                   // open device sessions per function
	byFunction map[string]map[*session]struct{} // running sessions per function (Wake)
	open       map[string]int                   // open sessions per function, any handler (Config.MaxSessionsPerFunction)
	byKey      map[string]int                   // open sessions per instance key, any handler (InstanceRegistry)
	pending    int                              // connections whose hello is being read (Config.MaxPendingHellos)
	pendingBy  map[string]int                   // those per peer (Config.MaxPendingHellosPerPeer)
	logged     time.Time                        // last log line about shed connections (one per second at most)
}

// NewServer validates cfg.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Functions == nil {
		return nil, errors.New("remoting: Config.Functions is required")
	}
	if cfg.NewHandler == nil && cfg.HandOff == nil {
		switch {
		case cfg.Device == nil:
			return nil, errors.New("remoting: Config.Device is required")
		case cfg.Node == nil:
			return nil, errors.New("remoting: Config.Node is required")
		case cfg.Binder == nil:
			return nil, errors.New("remoting: Config.Binder is required")
		}
	}
	if cfg.Spin <= 0 {
		cfg.Spin = 50 * time.Microsecond
	}
	if cfg.IdleRelease <= 0 {
		cfg.IdleRelease = 20 * time.Millisecond
	}
	if cfg.BoundSpin == 0 {
		cfg.BoundSpin = 20 * time.Millisecond
	}
	if cfg.MaxSessionsPerFunction <= 0 {
		cfg.MaxSessionsPerFunction = DefaultMaxSessionsPerFunction
	}
	if cfg.MaxPendingHellos <= 0 {
		cfg.MaxPendingHellos = DefaultMaxPendingHellos
	}
	if cfg.MaxPendingHellosPerPeer <= 0 {
		cfg.MaxPendingHellosPerPeer = DefaultMaxPendingHellosPerPeer
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.MaxModuleBytesPerFunction == 0 {
		cfg.MaxModuleBytesPerFunction = DefaultMaxModuleBytesPerFunction
	}
	if cfg.MaxModuleBytes == 0 {
		cfg.MaxModuleBytes = DefaultMaxModuleBytes
	}
	cfg.images = newModuleImages(cfg.MaxModuleBytesPerFunction, cfg.MaxModuleBytes)
	cfg.images.node = cfg.NodeImages
	if cfg.MaxGraphBytesPerFunction == 0 {
		cfg.MaxGraphBytesPerFunction = DefaultMaxGraphBytesPerFunction
	}
	cfg.budgets = newFunctionBudgets(cfg.MaxGraphBytesPerFunction)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("remoting: metrics: %w", err)
	}
	return &Server{cfg: cfg, log: log, metrics: m, conns: map[*net.UnixConn]struct{}{},
		sessions: map[string]int{}, open: map[string]int{}, byKey: map[string]int{}, pendingBy: map[string]int{},
		byFunction: map[string]map[*session]struct{}{}}, nil
}

// Serve accepts connections on l (a Unix listener) until ctx ends, then closes every session and returns nil.
// A failed accept (out of file descriptors, say) is logged, counted (faas_gpu_remoting_accept_errors_total) and
// retried with a capped back-off, so the listener recovers once the node has descriptors again; Serve returns an
// error only when the listener itself is gone while ctx is still live.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ul, ok := l.(*net.UnixListener)
	if !ok {
		return fmt.Errorf("remoting: listener is %T, want a Unix socket listener", l)
	}
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() {
		_ = ul.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
	})
	defer stop()
	defer wg.Wait()
	var (
		backoff time.Duration
		failed  int
	)
	for {
		c, err := ul.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("remoting: accept: %w", err)
			}
			s.metrics.acceptErrors.Inc()
			failed++
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			if failed == 1 {
				s.log.Error("remoting: accept failed: retrying with back-off until it succeeds", "err", err,
					"retry_in", backoff)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		if failed > 0 {
			s.log.Warn("remoting: accepting again", "failed_accepts", failed)
			failed, backoff = 0, 0
		}
		who := peer.Of(c)
		s.mu.Lock()
		if ctx.Err() != nil {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		reason := ""
		switch {
		case s.pendingBy[who] >= s.cfg.MaxPendingHellosPerPeer:
			reason = "pending_hellos_per_peer"
		case s.pending >= s.cfg.MaxPendingHellos:
			reason = "pending_hellos"
		}
		if reason != "" {
			logIt := time.Since(s.logged) >= time.Second
			if logIt {
				s.logged = time.Now()
			}
			s.mu.Unlock()
			s.metrics.refused.WithLabelValues(reason).Inc()
			if logIt {
				s.log.Warn("remoting: too many connections without a hello: closing new ones", "peer", who,
					"reason", reason, "max_pending_hellos", s.cfg.MaxPendingHellos,
					"max_pending_hellos_per_peer", s.cfg.MaxPendingHellosPerPeer)
			}
			_ = c.Close()
			continue
		}
		s.pending++
		s.pendingBy[who]++
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConnContained(ctx, c, who)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = c.Close()
		}()
	}
}

// serveConnContained runs one session; a panic in it (a bug reached by some input) ends that session only: it
// is logged with its stack and counted (faas_gpu_remoting_session_panics_total), the session's resources are
// released by the deferred cleanups on the way out, and every other session goes on.
func (s *Server) serveConnContained(ctx context.Context, c *net.UnixConn, who string) {
	s.contain(func() { s.serveConn(ctx, c, who) })
}

// contain runs a session; a panic in it ends that session only (see serveConnContained).
func (s *Server) contain(run func()) {
	defer func() {
		if r := recover(); r != nil {
			s.metrics.panics.Inc()
			s.log.Error("remoting: session panicked: it is closed, other sessions go on", "panic", fmt.Sprint(r),
				"stack", string(debug.Stack()))
		}
	}()
	run()
}

// helloDone marks a connection's hello as checked (it no longer counts against MaxPendingHellos and its peer's
// MaxPendingHellosPerPeer).
func (s *Server) helloDone(who string) {
	s.mu.Lock()
	s.pending--
	if s.pendingBy[who]--; s.pendingBy[who] <= 0 {
		delete(s.pendingBy, who)
	}
	s.mu.Unlock()
}

// admit counts a session of function against MaxSessionsPerFunction; the returned func uncounts it.
func (s *Server) admit(function string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[function] >= s.cfg.MaxSessionsPerFunction {
		return nil, fmt.Errorf("function %q has %d sessions open, the most one function may have "+
			"(MaxSessionsPerFunction)", function, s.open[function])
	}
	s.open[function]++
	s.metrics.sessions.Inc()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.open[function]--
		if s.open[function] == 0 {
			delete(s.open, function)
		}
		s.metrics.sessions.Dec()
	}, nil
}

// instance checks the instance a hello names and returns the key its session runs under.
func (s *Server) instance(h hello) (string, error) {
	if err := pool.CheckInstance(h.instance); err != nil {
		return "", fmt.Errorf("%w: function %q: %w", ErrIdentity, h.function, err)
	}
	reg, ok := s.cfg.Functions.(InstanceRegistry)
	if h.instance == "" || !ok {
		return h.function, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HelloTimeout)
	defer cancel()
	key, err := reg.Instance(ctx, h.function, h.instance)
	if err != nil {
		return "", fmt.Errorf("%w: function %q, instance %q: %w", ErrIdentity, h.function, h.instance, err)
	}
	return key, nil
}

// instanceSession counts a session of key until the returned done (which calls done first) runs; the registry
// hears when the last one of a key ends, unless ctx ended (the server shuts down: the images stay for its next
// start, as sessionEnded keeps them).
func (s *Server) instanceSession(ctx context.Context, key string, done func()) func() {
	reg, ok := s.cfg.Functions.(InstanceRegistry)
	if !ok {
		return done
	}
	s.mu.Lock()
	s.byKey[key]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			done()
			s.mu.Lock()
			s.byKey[key]--
			last := s.byKey[key] == 0
			if last {
				delete(s.byKey, key)
			}
			s.mu.Unlock()
			if last && ctx.Err() == nil {
				reg.InstanceEnded(key)
			}
		})
	}
}

// Stats counts what the server saw: accept errors, session panics, refused connections by reason, the records
// executed and the sessions' sleeps. The same figures are exported as metrics when Config.Metrics is set.
type Stats struct {
	AcceptErrors  int64
	SessionPanics int64
	Refused       map[string]int64
	// Records is the number of call records executed; Sleeps the number of times a session slept on its socket
	// after spinning (see Config.Spin); LateRecords the asynchronous records that reached their session together
	// with the synchronous call after them (held back until the client waited).
	Records, Sleeps, LateRecords int64
	// BoundSleeps counts the sleeps of sessions whose function held a binding (Config.BoundSpin ran out).
	BoundSleeps int64
	// RecordTime is the time sessions spent executing asynchronous records; BoundPoll the time they spent polling
	// an empty ring while their function held a binding (Config.BoundSpin).
	RecordTime, BoundPoll time.Duration
	// HandedOff counts the sessions handed to another process (Config.HandOff).
	HandedOff int64
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return s.metrics.stats()
}

// sessionStarted counts a device session of function.
func (s *Server) sessionStarted(function string) {
	s.mu.Lock()
	s.sessions[function]++
	s.mu.Unlock()
}

// sessionEnded uncounts a device session; when the function's last process hung up (not when the server shuts
// down, which keeps the images for the next start), the node forgets the function's memory so that its next
// process initialises afresh.
func (s *Server) sessionEnded(ctx context.Context, function string, log *slog.Logger) {
	s.mu.Lock()
	s.sessions[function]--
	last := s.sessions[function] == 0
	if last {
		delete(s.sessions, function)
	}
	s.mu.Unlock()
	if !last || ctx.Err() != nil {
		return
	}
	if err := s.cfg.Node.Reset(context.WithoutCancel(ctx), function); err != nil &&
		!errors.Is(err, executor.ErrUnknownFunction) {
		log.Warn("remoting: forget the memory of a function whose processes ended", "err", err)
	}
}
