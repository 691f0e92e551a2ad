// Package frontdoor is the asynchronous entrance of the gateway: POST /async-function/{name} (and any sub-path)
// publishes the request as a faas-provider types.QueueRequest in JSON to the function's JetStream queue and
// answers 202 Accepted with X-Call-Id and X-Start-Time. The queue worker invokes the function later and POSTs the
// result to the request's X-Callback-Url.
package frontdoor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// DefaultMaxBodyBytes is the largest request body accepted when Config.MaxBodyBytes is 0: queue.MaxBodyBytes, the
// limit every part of the asynchronous path accepts (NATS max_payload, the worker).
const DefaultMaxBodyBytes = queue.MaxBodyBytes

// Config configures the front door.
type Config struct {
	// JetStream publishes the requests; required.
	JetStream jetstream.JetStream
	// MaxBodyBytes is the largest body accepted; larger ones get 413 naming the limit. 0, and anything above
	// DefaultMaxBodyBytes (which the queue's messages would not carry), mean DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Functions, when set, resolves a function's queue (com.openfaas.queue) and turns calls to an unknown
	// function away with 404; "name.namespace" (what faas-cli sends) is looked up in that namespace. When nil
	// every call goes to the default queue.
	Functions functions.Source
	// PublishTimeout bounds one publish; 0 means 10s.
	PublishTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// NewCallID makes a call ID when the client sent none; nil means a random UUID.
	NewCallID func() string
	// Logger receives one line per failed publish; nil means slog.Default().
	Logger *slog.Logger
}

type frontDoor struct {
	cfg Config

	mu      sync.Mutex
	ensured map[string]bool // named queues whose stream this front door has created
}

// New returns the handler of /async-function/{name} and /async-function/{name}/{path...}.
func New(cfg Config) http.Handler {
	if cfg.MaxBodyBytes <= 0 || cfg.MaxBodyBytes > DefaultMaxBodyBytes {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes // a larger body would not fit the queue's messages
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NewCallID == nil {
		cfg.NewCallID = NewUUID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	fd := &frontDoor{cfg: cfg, ensured: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/async-function/{name}", fd.serve)
	mux.HandleFunc("/async-function/{name}/{path...}", fd.serve)
	return mux
}

// EnsureStreams creates the streams of the given queues (the default queue when none is given) and the
// dead-letter stream where they are missing; existing streams are left as they are. See package queue for their
// configuration: work-queue retention (a message is removed once the worker acks it), file storage.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, queues ...string) error {
	return queue.Ensure(ctx, js, queues...)
}

func (fd *frontDoor) serve(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("name")
	if err := queue.ValidateFunctionName(ref); err != nil {
		httpError(w, http.StatusBadRequest, "function name in /async-function/{name}: "+err.Error())
		return
	}
	if err := queue.CheckMethod(r.Method); err != nil {
		httpError(w, http.StatusMethodNotAllowed, err.Error())
		return
	}
	path := ""
	if p := r.PathValue("path"); p != "" || len(r.URL.Path) > len("/async-function/"+ref) {
		path = "/" + p
	}
	if err := queue.CheckPath(path); err != nil {
		httpError(w, http.StatusBadRequest, "path after /async-function/"+ref+": "+err.Error())
		return
	}
	if err := queue.CheckQuery(r.URL.RawQuery); err != nil {
		httpError(w, http.StatusBadRequest, "query: "+err.Error())
		return
	}
	var callback *url.URL
	if s := r.Header.Get(queue.HeaderCallbackURL); s != "" {
		u, err := url.Parse(s)
		if err != nil || queue.CheckCallback(u) != nil {
			httpError(w, http.StatusBadRequest, fmt.Sprintf("header %s: %q is not an absolute http(s) URL", queue.HeaderCallbackURL, s))
			return
		}
		if sameEndpoint(u, r.Host, r.TLS != nil) {
			httpError(w, http.StatusBadRequest, fmt.Sprintf("header %s: %s points at this gateway (%s); callbacks to the gateway are refused",
				queue.HeaderCallbackURL, u.Redacted(), r.Host))
			return
		}
		callback = u
	}
	if r.ContentLength > fd.cfg.MaxBodyBytes {
		fd.tooLarge(w)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, fd.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			fd.tooLarge(w)
			return
		}
		httpError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}
	q := queue.DefaultQueue
	if fd.cfg.Functions != nil {
		f, err := fd.cfg.Functions.Function(r.Context(), ref)
		switch {
		case functions.IsUnknown(err):
			httpError(w, http.StatusNotFound, fmt.Sprintf("function %q not found", ref))
			return
		case err != nil:
			fd.cfg.Logger.Warn("async: function lookup failed", "function", ref, "err", err)
			httpError(w, http.StatusBadGateway, fmt.Sprintf("looking up function %q: %v", ref, err))
			return
		}
		q = f.Queue
	}

	header := r.Header.Clone()
	callID := header.Get(queue.HeaderCallID)
	if callID == "" {
		callID = fd.cfg.NewCallID()
		header.Set(queue.HeaderCallID, callID)
	}
	start := header.Get(queue.HeaderStartTime)
	if _, err := strconv.ParseInt(start, 10, 64); err != nil {
		start = strconv.FormatInt(fd.cfg.Now().UnixNano(), 10)
		header.Set(queue.HeaderStartTime, start)
	}
	req := types.QueueRequest{
		Header:      header,
		Host:        r.Host,
		Body:        body,
		Method:      r.Method,
		Path:        path,
		QueryString: r.URL.RawQuery,
		Function:    ref, // as the client named it; the worker invokes /function/<ref> as the gateway does
		QueueName:   q,
		CallbackURL: callback,
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // headers and URLs as they are: '<' escaped as \u003c would take six bytes of the payload
	if err := enc.Encode(req); err != nil {
		httpError(w, http.StatusInternalServerError, "encoding queue request: "+err.Error())
		return
	}
	data := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if nc := fd.cfg.JetStream.Conn(); nc != nil && nc.MaxPayload() > 0 && int64(len(data)) > nc.MaxPayload() {
		httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf(
			"the queued call (body and headers) is %d bytes, more than the NATS server's max_payload of %d bytes "+
				"(the asynchronous path needs %d: see queue.MaxMessageBytes)", len(data), nc.MaxPayload(), queue.MaxMessageBytes))
		return
	}
	if status, err := fd.publish(r.Context(), q, callID, data); err != nil {
		fd.cfg.Logger.Warn("async: publish failed", "function", ref, "request_id", callID, "queue", q, "err", err)
		if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		httpError(w, status, err.Error())
		return
	}
	w.Header().Set(queue.HeaderCallID, callID)
	w.Header().Set(queue.HeaderStartTime, start)
	w.WriteHeader(http.StatusAccepted)
}

func (fd *frontDoor) tooLarge(w http.ResponseWriter) {
	httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf(
		"request body is larger than the asynchronous limit of %d bytes (%s)", fd.cfg.MaxBodyBytes, mib(fd.cfg.MaxBodyBytes)))
}

func mib(n int64) string {
	if n%(1<<20) == 0 {
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<20), 'f', 2, 64) + " MiB"
}

// sameEndpoint reports whether callback u names the host:port the client reached this gateway on (host, the
// request's Host), loopback names counted as one: a callback to the gateway itself would let a call's response
// be POSTed to the gateway's own API. The worker checks the addresses it dials as well.
func sameEndpoint(u *url.URL, host string, tls bool) bool {
	if host == "" {
		return false
	}
	norm := func(hostport, defaultPort string) string {
		h, p, err := net.SplitHostPort(hostport)
		if err != nil {
			h, p = strings.Trim(hostport, "[]"), defaultPort
		}
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if ip := net.ParseIP(h); h == "localhost" || (ip != nil && (ip.IsLoopback() || ip.IsUnspecified())) {
			h = "loopback"
		}
		return net.JoinHostPort(h, p)
	}
	port, ownPort := "80", "80"
	if u.Scheme == "https" {
		port = "443"
	}
	if tls {
		ownPort = "443"
	}
	return norm(u.Host, port) == norm(host, ownPort)
}

// publish stores the request in the queue's stream. The call ID is the JetStream message ID, so a client that
// sends the same call again (same X-Call-Id) within the duplicate window is queued once.
func (fd *frontDoor) publish(ctx context.Context, q, callID string, data []byte) (int, error) {
	msg := &nats.Msg{Subject: queue.Subject(q), Data: data, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, callID)
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, fd.cfg.PublishTimeout)
		_, err := fd.cfg.JetStream.PublishMsg(pctx, msg)
		cancel()
		switch {
		case err == nil:
			return http.StatusAccepted, nil
		case errors.Is(err, nats.ErrMaxPayload):
			return http.StatusRequestEntityTooLarge, fmt.Errorf("the queued call of %d bytes exceeds the NATS server's max_payload (the asynchronous path needs %d bytes)",
				len(data), queue.MaxMessageBytes)
		case errors.Is(err, jetstream.ErrNoStreamResponse) && q != queue.DefaultQueue && attempt == 0 && fd.ensure(ctx, q):
			continue // a named queue seen for the first time: its stream now exists
		case queue.IsFull(err):
			return http.StatusTooManyRequests, fmt.Errorf("queue %s is full (its backlog is at the stream's limit): "+
				"try again once the queue worker has caught up", q)
		default:
			return http.StatusServiceUnavailable, fmt.Errorf("publishing to queue %s: %w", q, err)
		}
	}
}

// ensure creates a named queue's stream once per front door; it reports whether it did so now.
func (fd *frontDoor) ensure(ctx context.Context, q string) bool {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	if fd.ensured[q] {
		return false
	}
	if err := queue.Ensure(ctx, fd.cfg.JetStream, q); err != nil {
		fd.cfg.Logger.Warn("async: creating queue stream failed", "queue", q, "err", err)
		return false
	}
	fd.ensured[q] = true
	return true
}

func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n")
}

// NewUUID returns a random (version 4) UUID.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (Go 1.24+ panics instead of returning an error)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
