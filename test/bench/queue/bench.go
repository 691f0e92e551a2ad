// Command queue (make bench-queue) measures the asynchronous path end to end on this machine, with real components: an embedded
// NATS JetStream server, the front door and the worker, no-op or timed functions behind an HTTP gateway, a real
// gpuserver (simulated node) for the pool's capacity, and a callback receiver. It reports throughput, added
// latency, ordering overhead, and SLO attainment under overload for SLO-aware, FIFO and max_inflight=1 dispatch.
// It writes the report to docs/bench/queue.md (-out), with the conditions it ran under.
package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// env is one NATS server with a front door, a gateway and a callback receiver.
type env struct {
	dir     string
	ns      *natsserver.Server
	nc      *nats.Conn
	js      jetstream.JetStream
	gateway *httptest.Server
	front   *httptest.Server
	cb      *receiver
	cbSrv   *httptest.Server
	client  *http.Client
}

func newEnv(ctx context.Context, gatewayHandler http.Handler, fdCfg frontdoor.Config) (*env, error) {
	dir, err := os.MkdirTemp("", "queuebench-")
	if err != nil {
		return nil, fmt.Errorf("bench: temp dir: %w", err)
	}
	e := &env{dir: dir}
	password := natsserver.RandomPassword()
	e.ns, err = natsserver.Start(ctx, natsserver.Config{StoreDir: dir, Port: -1, Username: "queuebench", Password: password})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	e.nc, err = nats.Connect(e.ns.ClientURL(), nats.UserInfo("queuebench", password))
	if err != nil {
		e.close()
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	e.js, err = jetstream.New(e.nc)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("bench: jetstream: %w", err)
	}
	if err := frontdoor.EnsureStreams(ctx, e.js); err != nil {
		e.close()
		return nil, err
	}
	e.gateway = httptest.NewServer(gatewayHandler)
	fdCfg.JetStream = e.js
	fdCfg.Logger = slog.New(slog.DiscardHandler)
	e.front = httptest.NewServer(frontdoor.New(fdCfg))
	e.cb = newReceiver()
	e.cbSrv = httptest.NewServer(e.cb)
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	e.client = &http.Client{Transport: t, Timeout: 30 * time.Second}
	return e, nil
}

func (e *env) close() {
	for _, s := range []*httptest.Server{e.front, e.gateway, e.cbSrv} {
		if s != nil {
			s.Close()
		}
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.ns != nil {
		e.ns.Shutdown()
	}
	_ = os.RemoveAll(e.dir)
}

// startWorker runs a worker against the env until the returned stop is called; stop waits for Run.
func (e *env) startWorker(cfg worker.Config) (*worker.Worker, func(), error) {
	cfg.JetStream = e.js
	cfg.GatewayURL = e.gateway.URL
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w, err := worker.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return w, func() { cancel(); <-done }, nil
}

// post sends one asynchronous call through the front door.
func (e *env) post(ctx context.Context, function, callID string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.front.URL+"/async-function/"+function, nil)
	if err != nil {
		return err
	}
	req.Header.Set(queue.HeaderCallID, callID)
	req.Header.Set(queue.HeaderCallbackURL, e.cbSrv.URL)
	res, err := e.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		return fmt.Errorf("front door answered %d", res.StatusCode)
	}
	return nil
}

// result is one received callback.
type result struct {
	function string
	status   int
	start    time.Time // X-Start-Time
	arrived  time.Time
}

// receiver records callbacks by call ID.
type receiver struct {
	mu      sync.Mutex
	results map[string]result
	dups    int
	count   atomic.Int64
	changed chan struct{}
}

func newReceiver() *receiver {
	return &receiver{results: map[string]result{}, changed: make(chan struct{}, 1)}
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	_, _ = io.Copy(io.Discard, req.Body)
	res := result{function: req.Header.Get(queue.HeaderFunctionName), arrived: now}
	res.status, _ = strconv.Atoi(req.Header.Get(queue.HeaderFunctionStatus))
	if ns, err := strconv.ParseInt(req.Header.Get(queue.HeaderStartTime), 10, 64); err == nil {
		res.start = time.Unix(0, ns)
	}
	id := req.Header.Get(queue.HeaderCallID)
	r.mu.Lock()
	if _, dup := r.results[id]; dup {
		r.dups++
	} else {
		r.results[id] = res
		r.count.Add(1)
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// reset forgets every callback received so far.
func (r *receiver) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = map[string]result{}
	r.dups = 0
	r.count.Store(0)
}

// wait blocks until n distinct callbacks arrived or ctx ends.
func (r *receiver) wait(ctx context.Context, n int) error {
	for r.count.Load() < int64(n) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: %d of %d callbacks: %w", r.count.Load(), n, ctx.Err())
		case <-r.changed:
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func (r *receiver) snapshot() map[string]result {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]result, len(r.results))
	for k, v := range r.results {
		out[k] = v
	}
	return out
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func latencies(rs map[string]result) []time.Duration {
	out := make([]time.Duration, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.arrived.Sub(r.start))
	}
	slices.SortFunc(out, cmp.Compare)
	return out
}

// duplicates is the number of callbacks received again for a call already called back.
func (r *receiver) duplicates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dups
}

func sortDurations(d []time.Duration) { slices.SortFunc(d, cmp.Compare) }

func sortClasses(c []ClassResult) {
	slices.SortFunc(c, func(a, b ClassResult) int { return cmp.Compare(a.SLO, b.SLO) })
}
