// Package natsserver runs an embedded NATS server with JetStream in this process: the message store behind
// asynchronous invocations when faas-gpu runs on one machine, and a real broker for tests. The server always
// requires a user name and password (no anonymous clients), and accepts messages up to queue.MaxMessageBytes.
package natsserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// ErrInvalidConfig is returned (wrapped) for a Config that names no store or credentials, or an impossible port.
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
	// Username and Password every client must present; both are required.
	Username, Password string
	// MaxPayload is the largest message the server accepts; 0 means queue.MaxMessageBytes.
	MaxPayload int32
	// MaxConns bounds the client connections open at once (a connection that has not authenticated yet counts;
	// the server closes those that do not within its auth timeout); 0 means DefaultMaxConns. In-process
	// connections (InProcessConn) count too but take no file descriptor.
	MaxConns int
}

// DefaultMaxConns bounds the embedded server's connections when Config.MaxConns is 0: the platform's own
// clients are few; the bound keeps a connection storm from taking the process's descriptors.
const DefaultMaxConns = 1024

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
	if cfg.Username == "" || cfg.Password == "" {
		return nil, fmt.Errorf("%w: Username and Password are required (the server takes no anonymous clients)", ErrInvalidConfig)
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = queue.MaxMessageBytes
	}
	if cfg.MaxPayload < 0 {
		return nil, fmt.Errorf("%w: MaxPayload %d must be > 0", ErrInvalidConfig, cfg.MaxPayload)
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	opts := &server.Options{
		ServerName:  "faas-gpu",
		Host:        cfg.Host,
		Port:        cfg.Port,
		JetStream:   true,
		StoreDir:    cfg.StoreDir,
		NoSigs:      true,
		NoLog:       true,
		Username:    cfg.Username,
		Password:    cfg.Password,
		MaxPayload:  cfg.MaxPayload,
		MaxPending:  max(int64(cfg.MaxPayload)*2, 64<<20), // room for a full message in a client's pending buffer
		MaxConn:     cfg.MaxConns,
		AuthTimeout: 2, // seconds: a connection that does not authenticate is closed
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

// InProcessConn is a client connection to the server through memory (nats.InProcessServer): it needs no file
// descriptor and no listener, so the process's own clients keep their connection while a storm of TCP connections
// exhausts the descriptors or the listener's limit.
func (s *Server) InProcessConn() (net.Conn, error) { return s.ns.InProcessConn() }

// Addr is the client listener's host:port.
func (s *Server) Addr() string { return s.ns.Addr().String() }

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

// RandomPassword returns a new random password: 32 bytes from crypto/rand in hex.
func RandomPassword() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (Go 1.24+ panics instead of returning an error)
	return hex.EncodeToString(b[:])
}
