package server

import (
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// A function whose kernels keep faulting is backed off (docs/security.md, "A function's faults never take a GPU
// out"). Each fault ends only its tenant's executor and never takes a GPU out of service (tenant/health.go), but
// a function that faults at every request would keep its tenant's executor restarting and its GPU busy with
// faults: after Threshold faults within Window its requests are refused (503 with Retry-After, pool.ErrBackedOff),
// and so are its calls outside a request (a kernel that faults in its initialisation; CUDA_ERROR_SYSTEM_NOT_READY)
// for Min, and each time it faults again soon after (within Window of its backoff's end) for twice as long, up to
// Max. Another function, of its tenant or another, is never refused for it. The pool's status
// (FunctionStatus.Faults, BackedOff), /metrics (faas_gpu_function_faults_total, faas_gpu_function_backed_off) and
// a log line with the function and gpu keys report it.

// FaultBackoff configures the backoff of functions whose kernels keep faulting; zero fields take the defaults.
type FaultBackoff struct {
	// Threshold is how many faults within Window back a function off (DefaultFaultThreshold when 0).
	Threshold int
	// Window is how far back faults count (DefaultFaultWindow when 0).
	Window time.Duration
	// Min and Max bound a backoff (DefaultFaultBackoffMin and DefaultFaultBackoffMax when 0).
	Min, Max time.Duration
}

// Defaults of FaultBackoff.
const (
	DefaultFaultThreshold  = 3
	DefaultFaultWindow     = time.Minute
	DefaultFaultBackoffMin = 5 * time.Second
	DefaultFaultBackoffMax = 5 * time.Minute
)

// faultBackoff keeps the functions' kernel faults and backoffs. It is safe for concurrent use.
type faultBackoff struct {
	cfg FaultBackoff
	now func() time.Time
	log *slog.Logger

	mu  sync.Mutex
	fns map[string]*faultRecord
}

// faultRecord is one function's faults.
type faultRecord struct {
	recent []time.Time // faults within the window
	total  int64
	level  int       // backoffs in a row: the next lasts Min << level
	until  time.Time // the current (or last) backoff's end
	gpu    int       // of the last fault
}

func newFaultBackoff(cfg FaultBackoff, now func() time.Time, log *slog.Logger) *faultBackoff {
	if cfg.Threshold <= 0 {
		cfg.Threshold = DefaultFaultThreshold
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultFaultWindow
	}
	if cfg.Min <= 0 {
		cfg.Min = DefaultFaultBackoffMin
	}
	if cfg.Max <= 0 {
		cfg.Max = DefaultFaultBackoffMax
	}
	cfg.Max = max(cfg.Max, cfg.Min)
	if now == nil {
		now = time.Now
	}
	return &faultBackoff{cfg: cfg, now: now, log: log, fns: map[string]*faultRecord{}}
}

// fault records a kernel fault of function (or of one of its instances: pool.InstanceKey) on gpu (cause says what faulted) and backs the function off when it
// keeps faulting.
func (b *faultBackoff) fault(function string, gpu int, cause string) {
	function, _ = pool.SplitInstance(function) // a function's instances are backed off together
	now := b.now()
	b.mu.Lock()
	r := b.fns[function]
	if r == nil {
		r = &faultRecord{}
		b.fns[function] = r
	}
	r.total++
	r.gpu = gpu
	keep := r.recent[:0]
	for _, at := range r.recent {
		if now.Sub(at) < b.cfg.Window {
			keep = append(keep, at)
		}
	}
	r.recent = append(keep, now)
	again := r.level > 0 && now.Sub(r.until) < b.cfg.Window // it faulted soon after its last backoff
	if r.level > 0 && !again {
		r.level = 0 // quiet for a window since: start over
	}
	if now.Before(r.until) || !again && len(r.recent) < b.cfg.Threshold {
		b.mu.Unlock()
		return
	}
	d := b.cfg.Max
	if r.level < 32 {
		d = min(b.cfg.Min<<r.level, b.cfg.Max)
	}
	r.level++
	r.until = now.Add(d)
	faults, total := len(r.recent), r.total
	r.recent = nil
	b.mu.Unlock()
	b.log.Warn("function backed off after repeated kernel faults: its requests are refused with 503 and "+
		"Retry-After; other functions and the gpus are not affected", "function", function, "gpu", gpu,
		"faults_in_window", faults, "faults", total, "window", b.cfg.Window, "retry_after", d, "err", cause)
}

// refused returns why function's requests are refused now (a *pool.BackedOffError), nil when they are not.
func (b *faultBackoff) refused(function string) error {
	function, _ = pool.SplitInstance(function) // a function's instances are backed off together
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.fns[function]
	if r == nil || !now.Before(r.until) {
		return nil
	}
	return &pool.BackedOffError{Function: function, RetryAfter: r.until.Sub(now), Faults: r.total}
}

// forget drops a deregistered function's record.
func (b *faultBackoff) forget(function string) {
	function, _ = pool.SplitInstance(function) // a function's instances are backed off together
	b.mu.Lock()
	delete(b.fns, function)
	b.mu.Unlock()
}

// view returns function's faults and how much longer it is backed off.
func (b *faultBackoff) view(function string) (faults int64, backedOff time.Duration) {
	function, _ = pool.SplitInstance(function) // a function's instances are backed off together
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.fns[function]
	if r == nil {
		return 0, 0
	}
	if now.Before(r.until) {
		backedOff = r.until.Sub(now)
	}
	return r.total, backedOff
}

// collector exports faas_gpu_function_faults_total and faas_gpu_function_backed_off.
func (b *faultBackoff) collector() prometheus.Collector { return faultCollector{b} }

var (
	descFunctionFaults = prometheus.NewDesc("faas_gpu_function_faults_total",
		"Kernel faults of a function on this node (each ended its tenant's executor, never a GPU).",
		[]string{"function"}, nil)
	descFunctionBackedOff = prometheus.NewDesc("faas_gpu_function_backed_off",
		"1 while the function is backed off after repeated kernel faults (its requests answered 503 with "+
			"Retry-After), else 0.", []string{"function"}, nil)
)

type faultCollector struct{ b *faultBackoff }

func (c faultCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descFunctionFaults
	ch <- descFunctionBackedOff
}

func (c faultCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.b.now()
	c.b.mu.Lock()
	names := make([]string, 0, len(c.b.fns))
	for name := range c.b.fns {
		names = append(names, name)
	}
	sort.Strings(names)
	type row struct {
		total int64
		off   bool
	}
	rows := make([]row, len(names))
	for i, name := range names {
		r := c.b.fns[name]
		rows[i] = row{r.total, now.Before(r.until)}
	}
	c.b.mu.Unlock()
	for i, name := range names {
		off := 0.0
		if rows[i].off {
			off = 1
		}
		ch <- prometheus.MustNewConstMetric(descFunctionFaults, prometheus.CounterValue, float64(rows[i].total), name)
		ch <- prometheus.MustNewConstMetric(descFunctionBackedOff, prometheus.GaugeValue, off, name)
	}
}
