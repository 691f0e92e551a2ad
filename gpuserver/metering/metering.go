// Package metering keeps each GPU function's bill: the GPU time its requests held, the GPU memory they held for
// that time, and the host memory its model image takes for as long as the gpuserver keeps it. Serverless GPUs are
// paid per use, so these are counters per function (and its namespace) that only grow, survive restarts of the
// gpuserver (a state file, written atomically) and are exported to Prometheus.
//
// What is counted, per function:
//
//   - GPU seconds: from a request's binding to a GPU (acquire) until its release, summed over requests (two
//     requests bound at once count twice), times the share of the GPU's compute the binding was granted meanwhile
//     (1 for an exclusive binding, the default; SetShare for a co-runner: share.go). A function's initialisation, which binds without a request, is not
//     counted: it is the platform's cold start.
//   - GPU memory byte-seconds: the function's GPU memory quota (com.openfaas.gpu.memory, the most its resident
//     copy may take) times those GPU seconds, as a serverless platform bills configured memory times duration.
//   - Host memory byte-seconds: the bytes of the function's model image held in host memory (the repository's
//     shared-memory files, which a spilled image leaves) times the time they are held, sampled every
//     SampleInterval whether or not requests run. An image is counted whole for its function, also where its
//     chunks are shared with another function's image (variants of one base each pay for the base).
//   - Requests: the bindings released.
//
// Time in flight is added as it passes (every sample), so the counters grow while a long request runs and a scrape
// sees it. Counters are kept in total and per hour for Retain (default 31 days), so that a bill can be asked for
// since a time (rounded down to the hour). The state file is written every FlushInterval and at Close: a gpuserver
// killed without Close loses at most that much.
package metering

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// DefaultNamespace is the namespace of a function whose gpuserver name has none (the provider's default,
// openfaas-fn: a function "echo" of namespace "dev" is "echo.dev" on the gpuserver, one of openfaas-fn is "echo").
const DefaultNamespace = "openfaas-fn"

// Defaults of Config.
const (
	SampleInterval = 10 * time.Second
	FlushInterval  = 30 * time.Second
	DefaultRetain  = 31 * 24 * time.Hour
	// MaxHistoryEntries bounds the hourly history (one entry per function that used anything in an hour); the
	// oldest hours go first beyond it.
	MaxHistoryEntries = 200_000
	// MaxFunctions bounds the functions with a bill; beyond it the function used least recently is forgotten
	// (with a warning), so that a churn of names cannot grow the state without end.
	MaxFunctions = 20_000
)

// Counters are one function's usage.
type Counters struct {
	Requests              int64   `json:"requests"`
	GPUSeconds            float64 `json:"gpu_seconds"`
	GPUMemoryByteSeconds  float64 `json:"gpu_memory_byte_seconds"`
	HostMemoryByteSeconds float64 `json:"host_memory_byte_seconds"`
}

func (c *Counters) add(o Counters) {
	c.Requests += o.Requests
	c.GPUSeconds += o.GPUSeconds
	c.GPUMemoryByteSeconds += o.GPUMemoryByteSeconds
	c.HostMemoryByteSeconds += o.HostMemoryByteSeconds
}

func (c Counters) zero() bool { return c == Counters{} }

// Usage is one function's line of a bill.
type Usage struct {
	// Name is the function's name on the gpuserver ("echo", "echo.dev").
	Name string `json:"name"`
	// Function and Namespace split it ("echo" and "dev"; DefaultNamespace when it names none).
	Function  string `json:"function"`
	Namespace string `json:"namespace"`
	Counters
}

// Report is a bill: every function's usage over [Since, Until].
type Report struct {
	Since     time.Time `json:"since"`
	Until     time.Time `json:"until"`
	Functions []Usage   `json:"functions"`
}

// Split returns a gpuserver function name's function and namespace.
func Split(name string) (function, namespace string) {
	if f, ns, ok := strings.Cut(name, "."); ok {
		return f, ns
	}
	return name, DefaultNamespace
}

// Config configures a Meter.
type Config struct {
	// File is the state file; "" keeps the counters in memory only.
	File string
	// HostImages returns the bytes of each function's model image held in host memory; nil counts none.
	HostImages func() (map[string]uint64, error)
	// Now is the clock; default time.Now.
	Now func() time.Time
	// SampleInterval, FlushInterval and Retain default to the package's constants.
	SampleInterval, FlushInterval, Retain time.Duration
	// Logger receives warnings (a state file moved aside, a failed write); nil discards them.
	Logger *slog.Logger
}

// Meter accumulates the bill. It is safe for concurrent use; Close stops its sampling goroutine.
type Meter struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	started  time.Time               // when the first meter of this state began
	totals   map[string]*Counters    // by gpuserver function name
	lastUsed map[string]time.Time    // when each function last used anything, for MaxFunctions
	hours    []hour                  // oldest first
	open     map[string]*openBinding // by binding id
	images   map[string]uint64       // host bytes at the last sample
	imagesAt time.Time               // when they were sampled
	dirty    bool                    // changed since the last flush
	closed   bool
	stop     chan struct{}
	done     chan struct{}
}

type hour struct {
	Start time.Time            `json:"start"`
	Usage map[string]*Counters `json:"usage"`
}

type openBinding struct {
	function  string
	memory    uint64
	accounted time.Time // counted up to here
	share     float64   // of the GPU's compute, granted now (share.go); 1 for an exclusive binding
}

// state is the file's content.
type state struct {
	Version  int                  `json:"version"`
	Started  time.Time            `json:"started"`
	Updated  time.Time            `json:"updated"`
	Totals   map[string]*Counters `json:"totals"`
	LastUsed map[string]time.Time `json:"last_used"`
	Hours    []hour               `json:"hours"`
}

const stateVersion = 1

// Open loads the state file (a file that cannot be read back is moved aside to <file>.corrupt-<time> with a loud
// log line, and the bill starts afresh) and starts sampling.
func Open(cfg Config) (*Meter, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = SampleInterval
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = FlushInterval
	}
	if cfg.Retain <= 0 {
		cfg.Retain = DefaultRetain
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now()
	m := &Meter{cfg: cfg, log: log, started: now, totals: map[string]*Counters{}, lastUsed: map[string]time.Time{},
		open: map[string]*openBinding{}, images: map[string]uint64{}, imagesAt: now,
		stop: make(chan struct{}), done: make(chan struct{})}
	if cfg.File != "" {
		if err := m.load(now); err != nil {
			return nil, err
		}
	}
	m.sampleImages()
	go m.run()
	return m, nil
}

// load reads the state file; the caller holds no lock (nothing runs yet).
func (m *Meter) load(now time.Time) error {
	raw, err := os.ReadFile(m.cfg.File)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("metering: %w", err)
	}
	var st state
	if err := json.Unmarshal(raw, &st); err != nil || st.Version != stateVersion {
		if err == nil {
			err = fmt.Errorf("version %d, want %d", st.Version, stateVersion)
		}
		aside := m.cfg.File + ".corrupt-" + now.UTC().Format("20060102T150405Z")
		if rerr := os.Rename(m.cfg.File, aside); rerr != nil {
			return fmt.Errorf("metering: %s cannot be read (%v) nor moved aside: %w", m.cfg.File, err, rerr)
		}
		m.log.Error("METERING STATE IS CORRUPT: moved aside; the bill starts afresh", "file", m.cfg.File,
			"moved_to", aside, "err", err)
		return nil
	}
	if !st.Started.IsZero() {
		m.started = st.Started
	}
	for name, c := range st.Totals {
		if c != nil {
			m.totals[name] = c
		}
	}
	for name, t := range st.LastUsed {
		m.lastUsed[name] = t
	}
	for _, h := range st.Hours {
		if h.Usage != nil {
			m.hours = append(m.hours, h)
		}
	}
	m.pruneLocked(now)
	return nil
}

// run samples and flushes until Close.
func (m *Meter) run() {
	defer close(m.done)
	sample := time.NewTicker(m.cfg.SampleInterval)
	defer sample.Stop()
	flush := time.NewTicker(m.cfg.FlushInterval)
	defer flush.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-sample.C:
			m.mu.Lock()
			m.advanceLocked(m.cfg.Now())
			m.mu.Unlock()
			m.sampleImages()
		case <-flush.C:
			if err := m.Flush(); err != nil {
				m.log.Warn("metering: writing the state file failed; the bill is kept in memory", "err", err)
			}
		}
	}
}

// sampleImages reads the host images' sizes (outside the lock: it reads files), after accounting what the previous
// sizes held until now.
func (m *Meter) sampleImages() {
	if m.cfg.HostImages == nil {
		return
	}
	sizes, err := m.cfg.HostImages()
	if err != nil {
		m.log.Warn("metering: reading the host images' sizes failed", "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked(m.cfg.Now())
	m.images = sizes
}

// Begin starts counting a request's binding of function, whose GPU memory quota is memoryBytes.
func (m *Meter) Begin(id, function string, memoryBytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.open[id] = &openBinding{function: function, memory: memoryBytes, accounted: m.cfg.Now(), share: 1}
}

// End stops counting a binding and counts its request; an unknown id is ignored.
func (m *Meter) End(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.open[id]
	if !ok {
		return
	}
	now := m.cfg.Now()
	m.advanceLocked(now)
	delete(m.open, id)
	m.addLocked(b.function, now, Counters{Requests: 1})
}

// advanceLocked counts the time from the last accounting to now: of the bindings in flight and of the host
// images as last sampled.
func (m *Meter) advanceLocked(now time.Time) {
	for _, b := range m.open {
		d := now.Sub(b.accounted).Seconds()
		if d <= 0 {
			continue
		}
		b.accounted = now
		m.addLocked(b.function, now, Counters{GPUSeconds: d * b.share, GPUMemoryByteSeconds: d * float64(b.memory)})
	}
	if d := now.Sub(m.imagesAt).Seconds(); d > 0 {
		for name, bytes := range m.images {
			if bytes > 0 {
				m.addLocked(name, now, Counters{HostMemoryByteSeconds: d * float64(bytes)})
			}
		}
		m.imagesAt = now
	}
}

// addLocked adds c to a function's total and to the hour of now.
func (m *Meter) addLocked(name string, now time.Time, c Counters) {
	if c.zero() {
		return
	}
	t := m.totals[name]
	if t == nil {
		m.makeRoomLocked(name)
		t = &Counters{}
		m.totals[name] = t
	}
	t.add(c)
	m.lastUsed[name] = now
	start := now.UTC().Truncate(time.Hour)
	if n := len(m.hours); n == 0 || !m.hours[n-1].Start.Equal(start) {
		m.hours = append(m.hours, hour{Start: start, Usage: map[string]*Counters{}})
		m.pruneLocked(now)
	}
	h := m.hours[len(m.hours)-1]
	hc := h.Usage[name]
	if hc == nil {
		hc = &Counters{}
		h.Usage[name] = hc
	}
	hc.add(c)
	m.dirty = true
}

// makeRoomLocked forgets the function used least recently when MaxFunctions have a bill.
func (m *Meter) makeRoomLocked(adding string) {
	if len(m.totals) < MaxFunctions {
		return
	}
	oldest, at := "", time.Time{}
	for name, t := range m.lastUsed {
		if _, busy := m.images[name]; busy || name == adding {
			continue
		}
		if oldest == "" || t.Before(at) {
			oldest, at = name, t
		}
	}
	if oldest == "" {
		return
	}
	m.log.Warn("metering: too many functions have a bill; forgetting the one used least recently",
		"function", oldest, "last_used", at, "max_functions", MaxFunctions)
	delete(m.totals, oldest)
	delete(m.lastUsed, oldest)
}

// pruneLocked drops the hours older than Retain and the oldest beyond MaxHistoryEntries.
func (m *Meter) pruneLocked(now time.Time) {
	cut := now.Add(-m.cfg.Retain)
	i := 0
	for i < len(m.hours) && m.hours[i].Start.Before(cut) {
		i++
	}
	entries := 0
	for _, h := range m.hours[i:] {
		entries += len(h.Usage)
	}
	for i < len(m.hours)-1 && entries > MaxHistoryEntries {
		entries -= len(m.hours[i].Usage)
		i++
	}
	if i > 0 {
		m.hours = append([]hour(nil), m.hours[i:]...)
	}
}

// Report is the bill since a time (rounded down to the hour; the zero time, or one before the bill began, means
// since the bill began), counted up to now.
func (m *Meter) Report(since time.Time) Report {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	m.advanceLocked(now)
	sum := map[string]*Counters{}
	from := m.started
	if since.IsZero() || !since.After(m.started) {
		for name, c := range m.totals {
			cc := *c
			sum[name] = &cc
		}
	} else {
		from = since.UTC().Truncate(time.Hour)
		for _, h := range m.hours {
			if h.Start.Before(from) {
				continue
			}
			for name, c := range h.Usage {
				if sum[name] == nil {
					sum[name] = &Counters{}
				}
				sum[name].add(*c)
			}
		}
	}
	r := Report{Since: from, Until: now, Functions: make([]Usage, 0, len(sum))}
	for name, c := range sum {
		fn, ns := Split(name)
		r.Functions = append(r.Functions, Usage{Name: name, Function: fn, Namespace: ns, Counters: *c})
	}
	sort.Slice(r.Functions, func(i, j int) bool { return r.Functions[i].Name < r.Functions[j].Name })
	return r
}

// Flush writes the state file if anything changed since the last write.
func (m *Meter) Flush() error {
	if m.cfg.File == "" {
		return nil
	}
	m.mu.Lock()
	m.advanceLocked(m.cfg.Now())
	if !m.dirty {
		m.mu.Unlock()
		return nil
	}
	st := state{Version: stateVersion, Started: m.started, Updated: m.cfg.Now(), Totals: m.totals,
		LastUsed: m.lastUsed, Hours: m.hours}
	data, err := json.Marshal(st)
	m.dirty = false
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("metering: %w", err)
	}
	if err := writeFileAtomic(m.cfg.File, data); err != nil {
		m.mu.Lock()
		m.dirty = true
		m.mu.Unlock()
		return err
	}
	return nil
}

// Close stops sampling and writes the state file; bindings still open are counted up to now.
func (m *Meter) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	<-m.done
	return m.Flush()
}

// writeFileAtomic writes data to a temporary file beside path, syncs it and renames it over path (mode 0600).
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("metering: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("metering: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp, 0o600)
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("metering: writing %s: %w", path, werr)
	}
	return nil
}
