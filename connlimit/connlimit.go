// Package connlimit bounds the connections a server accepts, in total and per peer, so that no client and no flood
// takes more than its share of the process's file descriptors: a surface under a connection storm refuses the
// excess at once (an HTTP 503 with Connection: close, answered once the request's head is read, within a second)
// while the process's other surfaces, which draw on the same descriptors, keep working, and it serves again as soon
// as the storm's connections close (the server's header and idle timeouts close those that stall).
package connlimit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Refusal is what a refused connection is sent: an HTTP/1.1 503 that asks the client to come back, then the
// connection is closed.
const Refusal = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n" +
	"Retry-After: 1\r\nConnection: close\r\nContent-Length: 38\r\n\r\ntoo many connections: try again later\n"

// Config bounds a listener.
type Config struct {
	// Surface names the listener in logs ("gateway", "front door").
	Surface string
	// MaxConns bounds the connections open at once; required (> 0).
	MaxConns int
	// MaxPerPeer bounds the connections of one peer: one IPv4 address, one IPv6 /64 (a host's usual share), or
	// every peer of a Unix socket together; on a loopback address, one address and the user of the client's socket
	// (so that one local user, or a function on faas-gpu up running under an id of its own, never takes every local
	// client's share). 0 means MaxConns.
	MaxPerPeer int
	// Logger receives one line per LogEvery of refusals (never one per connection: a flood would flood the log);
	// nil discards.
	Logger *slog.Logger
	// LogEvery is the shortest time between two refusal lines; 0 means 10s.
	LogEvery time.Duration
}

// ErrInvalid is returned (wrapped) by New for a Config without a bound.
var ErrInvalid = errors.New("invalid connection limits")

// Listener is a net.Listener that bounds its connections (see Config).
type Listener struct {
	net.Listener
	cfg   Config
	count Counter

	refused   atomic.Uint64
	refuser   Refuser
	lastLog   atomic.Int64 // unix nanoseconds of the last refusal line
	lastCount atomic.Uint64
}

// New wraps l.
func New(l net.Listener, cfg Config) (*Listener, error) {
	if cfg.MaxConns <= 0 {
		return nil, fmt.Errorf("%w: %s: MaxConns %d must be positive", ErrInvalid, cfg.Surface, cfg.MaxConns)
	}
	if cfg.MaxPerPeer <= 0 || cfg.MaxPerPeer > cfg.MaxConns {
		cfg.MaxPerPeer = cfg.MaxConns
	}
	if cfg.LogEvery <= 0 {
		cfg.LogEvery = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Listener{Listener: l, cfg: cfg}, nil
}

// Accept returns the next connection within the bounds; connections beyond them are refused and closed here.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := Peer(c.RemoteAddr()) + localUser(c) // a loopback client: also its user, where the kernel says
		reason := l.admit(peer)
		if reason == "" {
			return &conn{Conn: c, l: l, peer: peer}, nil
		}
		l.refuse(c, peer, reason)
	}
}

// admit counts a connection of peer in, or says why it may not be.
func (l *Listener) admit(peer string) string {
	switch l.count.Admit(peer, l.cfg.MaxConns, l.cfg.MaxPerPeer) {
	case Total:
		return "the surface's connection limit"
	case PerPeer:
		return "the peer's connection limit"
	}
	return ""
}

// refuse answers and closes a connection beyond the bounds (Refuser).
func (l *Listener) refuse(c net.Conn, peer, reason string) {
	l.refuser.Refuse(c, Refusal)
	n := l.refused.Add(1)
	now := time.Now().UnixNano()
	last := l.lastLog.Load()
	if now-last >= int64(l.cfg.LogEvery) && l.lastLog.CompareAndSwap(last, now) {
		prev := l.lastCount.Swap(n)
		l.cfg.Logger.Warn("refusing connections beyond the limit", "surface", l.cfg.Surface, "peer", peer,
			"reason", reason, "refused", n-prev, "max_conns", l.cfg.MaxConns, "max_conns_per_peer", l.cfg.MaxPerPeer)
	}
}

// Refuser answers refused HTTP connections off the accept loop, a bounded number at once; the zero value is ready.
type Refuser struct {
	under atomic.Int64 // refusals under way
}

// Refuse answers c with answer (a whole HTTP response) and closes it (refuseLater), in a goroutine of its own;
// beyond maxRefusing refusals under way, c is closed unanswered at once.
func (r *Refuser) Refuse(c net.Conn, answer string) {
	if r.under.Add(1) > maxRefusing {
		r.under.Add(-1)
		_ = c.Close()
		return
	}
	go func() {
		defer r.under.Add(-1)
		refuseLater(c, answer)
	}()
}

// Bounds of one refusal and of the refusals under way at once, per listener.
const (
	maxRefusing  = 64              // refusals under way at once; beyond, connections are closed unanswered
	refuseWithin = time.Second     // reading the request's head, then again draining the rest
	refuseDrain  = int64(16 << 10) // bytes read from a refused connection at most
)

// refuseLater answers a refused connection without losing the answer on the way. The answer waits for the
// request's head (a second at most): Go's HTTP client (faas-cli's) drops bytes that arrive before it wrote its
// request ("Unsolicited response received on idle HTTP channel") and fails the request. After the answer, a FIN, and
// the rest of the request is read and dropped before the close: a socket closed with bytes unread is reset, and a
// reset may overtake the answer. Both reads are bounded in bytes and time.
func refuseLater(c net.Conn, answer string) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(refuseWithin))
	readHead(c, refuseDrain)
	_ = c.SetWriteDeadline(time.Now().Add(refuseWithin))
	if _, err := io.WriteString(c, answer); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(refuseWithin))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, refuseDrain))
	}
}

// readHead reads from c until the end of an HTTP request's head (an empty line), the end of the stream, an error
// (its deadline) or max bytes.
func readHead(c net.Conn, max int64) {
	buf := make([]byte, 4096)
	var tail []byte
	for n := int64(0); n < max; {
		k, err := c.Read(buf)
		n += int64(k)
		tail = append(tail, buf[:k]...)
		if bytes.Contains(tail, []byte("\r\n\r\n")) || err != nil {
			return
		}
		if len(tail) > 3 {
			tail = tail[len(tail)-3:]
		}
	}
}

// Refused is how many connections the listener has refused.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// Open is how many accepted connections are open.
func (l *Listener) Open() int { return l.count.Open() }

// Peer is the key a connection's remote address is bounded under: the IPv4 address, the IPv6 /64, or the
// network name for addresses without an IP (Unix sockets).
func Peer(a net.Addr) string {
	var ip net.IP
	switch v := a.(type) {
	case *net.TCPAddr:
		ip = v.IP
	case *net.UDPAddr:
		ip = v.IP
	default:
		if a == nil {
			return "unknown"
		}
		host, _, err := net.SplitHostPort(a.String())
		if ip = net.ParseIP(host); err != nil || ip == nil {
			return a.Network()
		}
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

type conn struct {
	net.Conn
	l    *Listener
	peer string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.count.Release(c.peer) })
	return err
}
