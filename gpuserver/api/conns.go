package api

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/connlimit"
	"github.com/faas-gpu/faas-gpu/gpuserver/peer"
)

// Limits bound what the API's clients may hold. Every connection counts against its peer (a Unix socket's peer user,
// from SO_PEERCRED; a TCP client's IP address) and against its listener; beyond either bound it is answered 503 (once
// its request arrived, connlimit.Refuser) and closed, so that one peer (a function process opening connections without
// end, a client that never finishes its request) cannot take the descriptors every other caller needs. A connection
// that holds no binding is closed after IdleTimeout without a request; one that holds a binding is bounded by the
// pool's maximum binding hold. Headers must arrive within ReadHeaderTimeout, a body within BodyTimeout of its headers;
// credentials are checked before a body is read.
type Limits struct {
	// PerPeer bounds the open connections of one peer; DefaultPerPeer when 0.
	PerPeer int
	// Total bounds the open connections of one listener; DefaultTotal when 0.
	Total int
	// IdleTimeout closes a connection that holds no binding after this long without a request;
	// DefaultIdleTimeout when 0.
	IdleTimeout time.Duration
	// ReadHeaderTimeout bounds the read of a request's headers; DefaultReadHeaderTimeout when 0.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds the read of a request's body once its headers are read; DefaultBodyTimeout when 0.
	BodyTimeout time.Duration
}

// Defaults of Limits. A function holds one connection per request waiting for or holding a GPU (at most
// DefaultMaxAcquiresPerFunction), so a peer's bound leaves room for that.
const (
	DefaultPerPeer           = 1024
	DefaultTotal             = 4096
	DefaultIdleTimeout       = time.Minute
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 10 * time.Second
)

func (l Limits) withDefaults() Limits {
	if l.PerPeer <= 0 {
		l.PerPeer = DefaultPerPeer
	}
	if l.Total <= 0 {
		l.Total = DefaultTotal
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
	return l
}

// WithLimits sets the bounds on the API's connections (defaults for the fields left 0).
func WithLimits(l Limits) Option { return func(s *Server) { s.limits = l.withDefaults() } }

// Listener wraps l so that its connections count against the server's Limits: a connection beyond its peer's or
// the listener's bound is answered 503 and closed. Serve the result with NewHTTPServer's server.
func (s *Server) Listener(l net.Listener) net.Listener {
	return &limitListener{Listener: l, s: s}
}

// limitListener counts a listener's open connections, per peer and in total.
type limitListener struct {
	net.Listener
	s     *Server
	count connlimit.Counter

	refuser connlimit.Refuser // answers the refused off the accept loop, once their request arrived
}

// refusal is what a refused connection reads before it is closed.
const refusal = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n" +
	"Content-Length: %d\r\n\r\n%s"

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err // net/http retries temporary errors (EMFILE) with a back-off
		}
		who := peer.Of(c)
		var reason string
		switch l.count.Admit(who, l.s.limits.Total, l.s.limits.PerPeer) {
		case connlimit.Within:
			return &limitedConn{Conn: c, release: func() { l.count.Release(who) }}, nil
		case connlimit.Total:
			reason = "total"
		case connlimit.PerPeer:
			reason = "per_peer"
		}
		l.s.metrics.connsRefused.WithLabelValues(reason).Inc()
		l.s.logRefusal(who, reason)
		body := fmt.Sprintf(`{"error":"too many connections (%s): at most %d per peer, %d in all"}`, reason,
			l.s.limits.PerPeer, l.s.limits.Total)
		l.refuser.Refuse(c, fmt.Sprintf(refusal, len(body), body))
	}
}

// limitedConn gives its place back once when closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// logRefusal logs refused connections, once a second at most.
func (s *Server) logRefusal(peer, reason string) {
	s.mu.Lock()
	logIt := time.Since(s.refusalLogged) >= time.Second
	if logIt {
		s.refusalLogged = time.Now()
	}
	s.mu.Unlock()
	if logIt {
		s.log.Warn("gpuserver API: connection refused: too many open", "peer", peer, "reason", reason,
			"per_peer", s.limits.PerPeer, "total", s.limits.Total)
	}
}

// idleLocked arms or disarms the idle timer of connection c (its holder h): a connection idle between requests
// that holds no lease is closed after IdleTimeout.
func (s *Server) idleLocked(c net.Conn, h *holder, idle bool) {
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	if !idle || h.closed || len(h.leases) > 0 {
		return
	}
	h.idle = time.AfterFunc(s.limits.IdleTimeout, func() {
		s.mu.Lock()
		close := !h.closed && len(h.leases) == 0 && h.idle != nil
		s.mu.Unlock()
		if close {
			s.metrics.connsIdleClosed.Inc()
			_ = c.Close()
		}
	})
}

// bodyDeadline bounds the read of r's body to BodyTimeout from now, and lifts the bound once the body is read:
// a handler that then waits long (an acquire queueing for a GPU) must not have its request cancelled by an expired
// read deadline. Without a body there is nothing to bound.
func (s *Server) bodyDeadline(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		_ = rc.SetReadDeadline(time.Time{})
		return
	}
	if err := rc.SetReadDeadline(time.Now().Add(s.limits.BodyTimeout)); err != nil {
		return // not a connection of NewHTTPServer's (a test's recorder): nothing to bound
	}
	r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
}

// deadlineBody lifts its connection's read deadline once read to its end. A body that fails (its deadline
// passed) keeps the deadline, so that nothing reads the rest of it afterwards without one.
type deadlineBody struct {
	io.ReadCloser
	once sync.Once
	lift func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.lift)
	}
	return n, err
}

// errBodyTimeout marks a body that did not arrive within BodyTimeout.
var errBodyTimeout = errors.New("request body not received in time")
