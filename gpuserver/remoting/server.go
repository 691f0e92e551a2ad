package remoting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Registry tells the server which functions may connect: their requirements and the token handed out when the
// function was registered (the function process gets it as FAAS_GPU_TOKEN).
type Registry interface {
	// Function returns a registered function's spec and token; an error (pool.ErrUnknownFunction) otherwise.
	Function(name string) (spec pool.FunctionSpec, token string, err error)
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
	// IdleRelease is how long a session waits idle before it releases an implicit binding (20ms when 0).
	IdleRelease time.Duration
	// NewHandler replaces the device-backed handler (benchmarks of the transport, tests). A handler that
	// implements io.Closer is closed when its session ends.
	NewHandler func(ctx context.Context, info SessionInfo) (Handler, error)
}

// Server accepts the shim's connections on a Unix socket.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	conns    map[*net.UnixConn]struct{}
	sessions map[string]int // open device sessions per function
}

// NewServer validates cfg.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Functions == nil {
		return nil, errors.New("remoting: Config.Functions is required")
	}
	if cfg.NewHandler == nil {
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
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, log: log, conns: map[*net.UnixConn]struct{}{},
		sessions: map[string]int{}}, nil
}

// Serve accepts connections on l (a Unix listener) until ctx ends, then closes every session and returns nil.
// It returns an error if accepting fails otherwise.
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
	for {
		c, err := ul.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("remoting: accept: %w", err)
		}
		s.mu.Lock()
		if ctx.Err() != nil {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			_ = c.Close()
		}()
	}
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
