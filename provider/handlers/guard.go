package handlers

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/provider"
)

// requireJSON guards the /system requests that carry a body. A body whose Content-Type is not application/json
// is refused with 415 before the handler runs: browsers send cross-site form posts (and no-cors fetches) only as
// application/x-www-form-urlencoded, multipart/form-data or text/plain, so a web page cannot deploy a function or
// change a secret through a visitor's browser. faas-cli sends application/json on every /system body. Deploys
// (strict) must name it; other requests may leave Content-Type out, because the OpenFaaS gateway's own
// scale-from-zero request (POST /system/scale-function/{name}) sends none.
func requireJSON(strict bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 && len(r.TransferEncoding) == 0 {
			next.ServeHTTP(w, r) // no body: nothing a form could carry
			return
		}
		ct := r.Header.Get("Content-Type")
		if ct == "" && !strict {
			next.ServeHTTP(w, r)
			return
		}
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || !(mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
			http.Error(w, fmt.Sprintf("Content-Type %q: %s %s takes a JSON body (Content-Type: application/json)",
				ct, r.Method, r.URL.Path), http.StatusUnsupportedMediaType)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// AllowHosts answers 403 to a request whose Host header names a host outside allowed (compared without the
// port, case-insensitively). It protects a server on a loopback address from DNS rebinding: a web page whose
// name resolves to 127.0.0.1 reaches the server with its own name in Host. An empty allowed list allows every
// host (a server reachable under names it cannot know, behind a gateway or a load balancer).
func AllowHosts(allowed []string, next http.Handler) http.Handler {
	if len(allowed) == 0 {
		return next
	}
	set := map[string]bool{}
	for _, h := range allowed {
		set[normalHost(h)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !set[normalHost(host)] {
			http.Error(w, fmt.Sprintf("Host %q is not a name this server answers to (allowed: %s; see "+
				"--allowed-hosts)", clipHost(r.Host), strings.Join(allowed, ", ")), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func normalHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
}

func clipHost(h string) string {
	if len(h) > 100 {
		return h[:100] + "..."
	}
	return h
}

// LoopbackHosts returns the names a server listening on host answers to when host is a loopback address
// (localhost, 127.0.0.1, ::1, this machine's host name and host itself), and nil otherwise: a server on every
// interface, or on an address of the network, is reached under names it cannot know.
func LoopbackHosts(host string) []string {
	ip := net.ParseIP(strings.Trim(host, "[]"))
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil
	}
	out := []string{"localhost", "127.0.0.1", "::1"}
	if hn, err := os.Hostname(); err == nil && hn != "" {
		out = append(out, hn)
	}
	if host != "localhost" && host != "127.0.0.1" && host != "::1" {
		out = append(out, host)
	}
	return out
}

// BodyTimeouts bounds how slowly a client may send a request body: every read must make progress within Idle,
// and the whole body must arrive within Total (0: no bound). A slow-loris client gets 408 (or its connection is
// closed) instead of holding a connection and a goroutine for ever.
type BodyTimeouts struct {
	Idle, Total time.Duration
}

// LimitBodyTime applies t to every request body h reads.
func LimitBodyTime(t BodyTimeouts, h http.Handler) http.Handler {
	if t.Idle <= 0 && t.Total <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		db := &deadlineBody{body: r.Body, rc: http.NewResponseController(w), idle: t.Idle}
		if t.Total > 0 {
			db.end = time.Now().Add(t.Total)
		}
		r.Body = db
		h.ServeHTTP(w, r)
	})
}

// deadlineBody sets the connection's read deadline before each read of the body and clears it once the body has
// been read, so that the server's background read (which notices a client going away during a long invocation)
// is not cut short.
type deadlineBody struct {
	body io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	end  time.Time

	mu   sync.Mutex
	done bool
	slow bool // a read timed out
}

// slowClient reports whether body is a deadlineBody whose client was too slow.
func slowClient(body io.Reader) bool {
	d, ok := body.(*deadlineBody)
	if !ok {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.slow
}

func (d *deadlineBody) Read(p []byte) (int, error) {
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return 0, io.EOF
	}
	deadline := d.end
	if d.idle > 0 {
		if idle := time.Now().Add(d.idle); deadline.IsZero() || idle.Before(deadline) {
			deadline = idle
		}
	}
	_ = d.rc.SetReadDeadline(deadline) // not supported (HTTP/2 test servers): no bound
	d.mu.Unlock()
	n, err := d.body.Read(p)
	if err != nil {
		d.mu.Lock()
		if errors.Is(err, io.EOF) {
			d.done = true
			_ = d.rc.SetReadDeadline(time.Time{})
		} else if isTimeout(err) {
			d.slow = true
			err = fmt.Errorf("%w: %w", provider.ErrSlowClient, err)
		}
		d.mu.Unlock()
	}
	return n, err
}

func (d *deadlineBody) Close() error { return d.body.Close() }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}
