// Package ui serves a live page of a node's GPU pool at /ui: each GPU with its memory and the functions resident
// on it, swaps and evictions as they happen, the queues, and per function its SLO compliance, refusals and bill.
// The page is HTML, CSS and JavaScript embedded in the binary (no script or style from elsewhere; a Content
// Security Policy allows this origin only) and polls /ui/state, a JSON snapshot, every second.
//
// A sampler reads the pool every Config.Interval and turns what changed into events (a function swapped in to a
// GPU, evicted from one, a GPU failing or back), kept in a ring of the last MaxEvents. The caller puts the handler
// behind its credentials (`up`: the /system basic auth) and closes the UI to stop the sampler.
package ui

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"log/slog"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

//go:embed static
var static embed.FS

// MaxEvents is how many events the page can show.
const MaxEvents = 200

// Pool is what the page shows of the pool.
type Pool interface {
	Status(ctx context.Context) pool.Status
}

// Usage is the functions' bill (package metering).
type Usage interface {
	Report(since time.Time) metering.Report
}

// QueueRow is one asynchronous queue.
type QueueRow struct {
	Queue       string `json:"queue"`
	Messages    uint64 `json:"messages"`
	Pending     uint64 `json:"pending"`
	InWorker    uint64 `json:"in_worker"`
	Redelivered uint64 `json:"redelivered"`
	Consumers   int    `json:"consumers"`
}

// Config configures a UI. Pool is required.
type Config struct {
	Pool Pool
	// Usage, when set, adds each function's bill.
	Usage Usage
	// Metrics, when set, is read for the refusals per function (faas_gpu_acquire_total by result).
	Metrics prometheus.Gatherer
	// Queues, when set, returns the asynchronous queues and the dead letters.
	Queues func(ctx context.Context) ([]QueueRow, uint64, error)
	// Node names the node in the page's title.
	Node string
	// Interval between samples of the pool; default 500ms.
	Interval time.Duration
	// Logger receives sampling failures; nil discards them.
	Logger *slog.Logger
}

// UI is the page's handler. Close stops its sampler.
type UI struct {
	cfg    Config
	log    *slog.Logger
	files  http.Handler
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once

	mu     sync.Mutex
	prev   *pool.Status // last sample
	events []Event      // the last MaxEvents, oldest first
	seq    int64
	cached *State // the last state answered, reused for stateTTL
}

// stateTTL bounds how often several open pages make the state afresh.
const stateTTL = 250 * time.Millisecond

// Event is something the sampler saw change.
type Event struct {
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	// Kind: "swap-in" (a function became resident on a GPU), "evict" (it left one), "gpu-failed", "gpu-healthy".
	Kind     string `json:"kind"`
	Function string `json:"function,omitempty"`
	GPU      int    `json:"gpu"`
	// Detail says more: how swaps reached the GPUs in the meantime (pool.Status.Swaps), a GPU's name.
	Detail string `json:"detail,omitempty"`
}

// New returns the UI and starts its sampler.
func New(cfg Config) (*UI, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sub, err := fs.Sub(static, "static")
	if err != nil {
		return nil, err
	}
	u := &UI{cfg: cfg, log: log, files: http.FileServerFS(sub), stop: make(chan struct{}), done: make(chan struct{})}
	go u.run()
	return u, nil
}

// Close stops the sampler.
func (u *UI) Close() {
	u.closed.Do(func() {
		close(u.stop)
		<-u.done
	})
}

func (u *UI) run() {
	defer close(u.done)
	t := time.NewTicker(u.cfg.Interval)
	defer t.Stop()
	u.sample()
	for {
		select {
		case <-u.stop:
			return
		case <-t.C:
			u.sample()
		}
	}
}

// sample reads the pool and records what changed since the last sample.
func (u *UI) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st := u.cfg.Pool.Status(ctx)
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.prev != nil {
		for _, e := range diff(*u.prev, st) {
			u.seq++
			e.Seq, e.Time = u.seq, now
			u.events = append(u.events, e)
		}
		if over := len(u.events) - MaxEvents; over > 0 {
			u.events = append([]Event(nil), u.events[over:]...)
		}
	}
	u.prev = &st
}

// diff lists what changed between two samples of the pool.
func diff(prev, cur pool.Status) []Event {
	var out []Event
	kinds := swapDelta(prev.Swaps, cur.Swaps)
	before := map[int]map[string]bool{}
	for _, g := range prev.GPUs {
		before[g.Index] = map[string]bool{}
		for _, f := range g.Resident {
			before[g.Index][f] = true
		}
	}
	prevHealthy := map[int]bool{}
	for _, g := range prev.GPUs {
		prevHealthy[g.Index] = g.Healthy
	}
	for _, g := range cur.GPUs {
		was, known := prevHealthy[g.Index]
		switch {
		case known && was && !g.Healthy:
			out = append(out, Event{Kind: "gpu-failed", GPU: g.Index, Detail: g.Name})
		case known && !was && g.Healthy:
			out = append(out, Event{Kind: "gpu-healthy", GPU: g.Index, Detail: g.Name})
		}
		now := map[string]bool{}
		for _, f := range g.Resident {
			now[f] = true
			if !before[g.Index][f] {
				out = append(out, Event{Kind: "swap-in", Function: f, GPU: g.Index, Detail: kinds})
			}
		}
		var gone []string
		for f := range before[g.Index] {
			if !now[f] {
				gone = append(gone, f)
			}
		}
		sort.Strings(gone)
		for _, f := range gone {
			out = append(out, Event{Kind: "evict", Function: f, GPU: g.Index})
		}
	}
	return out
}

// swapDelta says how the bindings since the last sample reached their GPUs, e.g. "pcie +1, nvlink +2".
func swapDelta(prev, cur map[string]int64) string {
	var parts []string
	for _, k := range []string{"cold", "pcie", "nvlink"} {
		if d := cur[k] - prev[k]; d > 0 {
			parts = append(parts, k+" +"+strconv.FormatInt(d, 10))
		}
	}
	s := ""
	for i, p := range parts {
		if i > 0 {
			s += ", "
		}
		s += p
	}
	return s
}

// ServeHTTP serves /ui (the page), /ui/app.js, /ui/style.css and /ui/state.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
		"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	switch r.URL.Path {
	case "/ui", "/ui/":
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/"
		u.files.ServeHTTP(w, r2)
	case "/ui/app.js", "/ui/style.css":
		r2 := r.Clone(r.Context())
		r2.URL.Path = r.URL.Path[len("/ui"):]
		u.files.ServeHTTP(w, r2)
	case "/ui/state":
		h.Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(u.State(r.Context()))
	default:
		http.NotFound(w, r)
	}
}
