// Package server assembles a node's gpuserver: the GPU pool for its node and the API served on a Unix socket
// (and optionally TCP). `faas-gpu gpuserver` runs one alone; `faas-gpu up` runs one in-process.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Config of a gpuserver.
type Config struct {
	// Socket is the path of the API's Unix socket; its directory is created.
	Socket string
	// Listen is an optional TCP address for the API (e.g. 127.0.0.1:0); empty means none.
	Listen string
	// Node describes the GPUs of the pool.
	Node topology.Node
	// Policy names the pool's policy: a controller policy (default "faas-gpu"; see controller.Policies) or
	// "fcfs" for the first-come-first-served pool.
	Policy string
	// Actuator carries out the controller's swaps and evictions; nil models them as link time on Node.
	Actuator controller.Actuator
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
}

// Server is a running gpuserver.
type Server struct {
	cfg     Config
	pool    pool.Pool
	servers []*http.Server
	addr    string
	done    chan struct{}
	errs    chan error
}

// Start builds the pool and serves the API until Shutdown.
func Start(_ context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Socket == "" {
		return nil, errors.New("gpuserver: socket path is empty")
	}
	if err := cfg.Node.Validate(); err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}
	p, err := newPool(cfg)
	if err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	handler, err := api.New(p, reg, reg, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("gpuserver: %w", err)
	}

	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
		return nil, fmt.Errorf("gpuserver: socket directory: %w", err)
	}
	if err := removeStaleSocket(cfg.Socket); err != nil {
		return nil, err
	}
	var listeners []net.Listener
	ul, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("gpuserver: listen on %s: %w", cfg.Socket, err)
	}
	if err := os.Chmod(cfg.Socket, 0o666); err != nil { // function processes may run as another user
		ul.Close()
		return nil, fmt.Errorf("gpuserver: chmod %s: %w", cfg.Socket, err)
	}
	listeners = append(listeners, ul)
	s := &Server{cfg: cfg, pool: p, done: make(chan struct{}), errs: make(chan error, 2)}
	if cfg.Listen != "" {
		tl, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			ul.Close()
			return nil, fmt.Errorf("gpuserver: listen on %s: %w", cfg.Listen, err)
		}
		s.addr = tl.Addr().String()
		listeners = append(listeners, tl)
	}
	for _, l := range listeners {
		hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		s.servers = append(s.servers, hs)
		go func() {
			if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.errs <- fmt.Errorf("gpuserver: serve %s: %w", l.Addr(), err)
			}
		}()
	}
	cfg.Logger.Info("gpuserver started", "socket", cfg.Socket, "tcp", s.addr, "node", cfg.Node.Name,
		"gpus", len(cfg.Node.GPUs), "policy", p.Status(context.Background()).Policy)
	return s, nil
}

// PolicyFCFS selects the first-come-first-served pool instead of the controller.
const PolicyFCFS = "fcfs"

// ErrInvalidPolicy is wrapped when Config.Policy names no policy.
var ErrInvalidPolicy = errors.New("invalid policy")

func newPool(cfg Config) (pool.Pool, error) {
	if cfg.Policy == PolicyFCFS {
		gpus := make([]pool.GPU, len(cfg.Node.GPUs))
		for i, g := range cfg.Node.GPUs {
			gpus[i] = pool.GPU{Name: g.Name, MemoryBytes: g.MemoryBytes}
		}
		return pool.NewFCFS(gpus, nil)
	}
	policy := controller.PolicyFaaSGPU
	if cfg.Policy != "" {
		var err error
		if policy, err = controller.ParsePolicy(cfg.Policy); err != nil {
			return nil, fmt.Errorf("%w: %w (or %s)", ErrInvalidPolicy, err, PolicyFCFS)
		}
	}
	return controller.NewPool(controller.PoolConfig{
		Controller: controller.Config{Policy: policy, Node: cfg.Node},
		Actuator:   cfg.Actuator,
	})
}

// Pool returns the server's pool.
func (s *Server) Pool() pool.Pool { return s.pool }

// Socket returns the API's Unix socket path.
func (s *Server) Socket() string { return s.cfg.Socket }

// Addr returns the TCP address of the API, or "" when it listens on the socket only.
func (s *Server) Addr() string { return s.addr }

// Err reports a listener that failed after Start.
func (s *Server) Err() <-chan error { return s.errs }

// Shutdown stops serving, waiting for in-flight requests until ctx ends, and removes the socket.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	for _, hs := range s.servers {
		if err := hs.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			_ = hs.Close()
		}
	}
	if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeStaleSocket deletes a socket file left by a gpuserver that died, and refuses to start when one answers.
func removeStaleSocket(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("gpuserver: another gpuserver is listening on %s", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("gpuserver: remove stale socket %s: %w", path, err)
	}
	return nil
}
