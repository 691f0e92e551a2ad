// Package natsserver runs an embedded NATS server with JetStream in this process: the message store behind
// asynchronous invocations when faas-gpu runs on one machine, and a real broker for tests.
package natsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrInvalidConfig is returned (wrapped) for a Config that names no store or an impossible port.
var ErrInvalidConfig = errors.New("invalid natsserver config")

// Config says where the server listens and keeps its JetStream store.
type Config struct {
	// StoreDir is the JetStream store directory; it survives restarts, so a server started again on the same
	// directory finds its streams, consumers and unacknowledged messages.
	StoreDir string
	// Host to listen on; empty means 127.0.0.1.
	Host string
	// Port to listen on; -1 picks a free port (see ClientURL). 0 is refused: nats-server would read it as 4222.
	Port int
	// ReadyTimeout bounds how long Start waits for the server to accept connections; 0 means 10s.
	ReadyTimeout time.Duration
}

// Server is a running embedded NATS server.
type Server struct {
	ns *server.Server
}

// Start starts the server and returns once it accepts client connections, ctx ends, or the ready timeout passes.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("%w: StoreDir is empty", ErrInvalidConfig)
	}
	if cfg.Port == 0 || cfg.Port < -1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("%w: Port %d must be -1 (free port) or 1..65535", ErrInvalidConfig, cfg.Port)
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	opts := &server.Options{
		ServerName: "faas-gpu",
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		// No HTTP monitoring, cluster or leaf ports: this server serves this machine only.
		HTTPPort: 0,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: new server: %w", err)
	}
	ns.Start()
	deadline := time.Now().Add(cfg.ReadyTimeout)
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			ns.Shutdown()
			ns.WaitForShutdown()
			return nil, fmt.Errorf("natsserver: waiting for the server to be ready: %w", err)
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			ns.WaitForShutdown()
			return nil, fmt.Errorf("natsserver: not ready for connections on %s within %s", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)), cfg.ReadyTimeout)
		}
	}
	return &Server{ns: ns}, nil
}

// ClientURL is the nats:// URL clients connect to, with the port actually bound.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Port is the client port actually bound (useful to restart a server started with Port -1 on the same port).
func (s *Server) Port() int {
	if a, ok := s.ns.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Shutdown stops the server, flushing the JetStream store, and returns once it has stopped.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
