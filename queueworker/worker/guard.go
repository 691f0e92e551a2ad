package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// errCallbackRefused is the dial error of a callback to a forbidden address.
var errCallbackRefused = errors.New("callback refused")

// callbackGuard refuses callback connections to the gateway's own address (and the other ForbiddenCallbackHosts),
// checked on the address actually dialled, after name resolution and on every redirect-free attempt, so that
// neither another name for the gateway nor DNS rebinding gets a call's response POSTed to the gateway's API.
type callbackGuard struct {
	forbidden []string // host:port
	resolver  *net.Resolver

	mu    sync.Mutex
	cache map[string]resolved // forbidden host -> its addresses
	local []net.IP            // this machine's interface addresses
	at    time.Time
}

type resolved struct {
	ips []net.IP
	at  time.Time
}

// guardCacheTTL is how long resolved forbidden hosts and local addresses are used.
const guardCacheTTL = 30 * time.Second

func newCallbackGuard(forbidden []string) *callbackGuard {
	return &callbackGuard{forbidden: forbidden, resolver: net.DefaultResolver, cache: map[string]resolved{}}
}

// client returns the callback client: no proxy, no redirects, no credentials, the guard on every dial.
func (g *callbackGuard) client() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second, ControlContext: g.control}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 nil, // the guard must see the real destination
			DialContext:           d.DialContext,
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       30 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: noRedirects,
	}
}

// control runs before each connection is made, with the resolved ip:port.
func (g *callbackGuard) control(ctx context.Context, _, address string, _ syscall.RawConn) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: address %q: %w", errCallbackRefused, address, err)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return fmt.Errorf("%w: address %q is not an IP address", errCallbackRefused, address)
	}
	for _, f := range g.forbidden {
		fh, fp, err := net.SplitHostPort(f)
		if err != nil || fp != port {
			continue
		}
		if g.matches(ctx, fh, ip) {
			return fmt.Errorf("%w: %s is the address of %s, which callbacks may not reach", errCallbackRefused, address, f)
		}
	}
	return nil
}

// matches reports whether ip is an address of host: one it resolves to, or, when host is an address of this
// machine (loopback, unspecified, or an interface's), any address of this machine.
func (g *callbackGuard) matches(ctx context.Context, host string, ip net.IP) bool {
	ips := g.resolve(ctx, host)
	local := g.localAddrs()
	isLocal := func(a net.IP) bool {
		if a.IsLoopback() || a.IsUnspecified() {
			return true
		}
		for _, l := range local {
			if l.Equal(a) {
				return true
			}
		}
		return false
	}
	for _, f := range ips {
		if f.Equal(ip) || (isLocal(f) && isLocal(ip)) {
			return true
		}
	}
	return false
}

// resolve returns host's addresses (cached); a host that cannot be resolved has none.
func (g *callbackGuard) resolve(ctx context.Context, host string) []net.IP {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}
	}
	g.mu.Lock()
	r, ok := g.cache[host]
	g.mu.Unlock()
	if ok && time.Since(r.at) < guardCacheTTL {
		return r.ips
	}
	addrs, err := g.resolver.LookupIPAddr(ctx, host)
	if err != nil && ok {
		return r.ips // keep what was known
	}
	ips := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		ips = append(ips, a.IP)
	}
	g.mu.Lock()
	g.cache[host] = resolved{ips: ips, at: time.Now()}
	g.mu.Unlock()
	return ips
}

// localAddrs returns this machine's interface addresses (cached).
func (g *callbackGuard) localAddrs() []net.IP {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.local != nil && time.Since(g.at) < guardCacheTTL {
		return g.local
	}
	g.local = []net.IP{}
	g.at = time.Now()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return g.local
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			g.local = append(g.local, n.IP)
		}
	}
	return g.local
}
