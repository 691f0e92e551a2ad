package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// Config is one benchmark run.
type Config struct {
	// Messages per throughput run, Publishers (concurrent front-door clients) and Idle (closed-loop calls for
	// the idle latency).
	Messages, Publishers, Idle int
	// MaxInflight of the throughput runs; Repeat is how many throughput runs each order gets (interleaved).
	MaxInflight, Repeat int
	// ModelsPath is models-torpor-v100.csv; Preset the gpuserver node (its GPU count is the pool's capacity).
	ModelsPath, Preset string
	// Factor x pool capacity is the burst's arrival rate, for Burst; Seed draws the arrivals.
	Factor float64
	Burst  time.Duration
	Seed   uint64
}

// Report is the outcome of a run, with its conditions.
type Report struct {
	Config    Config
	Started   time.Time
	Elapsed   time.Duration
	CPU       string
	NProc     int
	GoVersion string
	// LoadStart and LoadEnd are /proc/loadavg's 1-minute load average before and after the run.
	LoadStart, LoadEnd string
	GPUs               int
	Rate               float64 // burst arrival rate, requests/s
	Models             []Model
	Throughput         []ThroughputResult
	Overload           []OverloadResult
}

// Run measures everything, the orders side by side in one run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	r := &Report{Config: cfg, Started: time.Now(), CPU: cpuModel(), NProc: runtime.NumCPU(), GoVersion: runtime.Version(),
		LoadStart: loadAverage()}
	for range max(1, cfg.Repeat) {
		for _, order := range []worker.Ordering{worker.OrderFIFO, worker.OrderSLOAware} {
			t, err := Throughput(ctx, order, cfg.Messages, cfg.Publishers, cfg.Idle, cfg.MaxInflight)
			if err != nil {
				return nil, fmt.Errorf("throughput %s: %w", order, err)
			}
			r.Throughput = append(r.Throughput, t)
		}
	}
	models, err := LoadModels(cfg.ModelsPath)
	if err != nil {
		return nil, err
	}
	r.Models = models
	node, err := topology.Preset(cfg.Preset)
	if err != nil {
		return nil, fmt.Errorf("bench: preset: %w", err)
	}
	r.GPUs = len(node.GPUs)
	arrivals, rate := Arrivals(models, r.GPUs, cfg.Factor, cfg.Burst, cfg.Seed)
	r.Rate = rate
	for _, s := range Strategies() {
		o, err := Overload(ctx, s, node, models, arrivals)
		if err != nil {
			return nil, fmt.Errorf("overload %s: %w", s.Name, err)
		}
		r.Overload = append(r.Overload, o)
	}
	r.Elapsed = time.Since(r.Started)
	r.LoadEnd = loadAverage()
	return r, nil
}

// loadAverage is the 1-minute load average, "unknown" where /proc/loadavg cannot be read.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f us", float64(d)/float64(time.Microsecond)) }
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# Queue worker benchmark\n\n")
	fmt.Fprintf(&b, "Written by `make bench-queue` (`go run ./test/bench/queue`). Every figure below comes from one run; "+
		"the orders are compared side by side in that run.\n\n")
	fmt.Fprintf(&b, "## Conditions\n\n")
	fmt.Fprintf(&b, "- Machine: %d CPUs (`nproc`), %s; shared with other work, so figures vary between runs: 1-minute load "+
		"average %s before the run, %s after (throughput falls by up to half when other builds run at the same time).\n",
		r.NProc, r.CPU, r.LoadStart, r.LoadEnd)
	fmt.Fprintf(&b, "- Go: %s; run at %s, took %s.\n", r.GoVersion, r.Started.UTC().Format(time.RFC3339), r.Elapsed.Round(time.Second))
	fmt.Fprintf(&b, "- Everything real and in one process: embedded NATS JetStream (nats-server v2.15.2, file store in a temp dir), "+
		"the front door over HTTP (`httptest`), the worker (durable pull consumer, explicit acks after the callback), "+
		"functions behind an HTTP gateway, a callback receiver over HTTP. Latency is from the front door's X-Start-Time to the "+
		"callback's arrival at the receiver.\n")
	fmt.Fprintf(&b, "- Throughput runs: %d messages each, no-op functions (200, empty body), worker max_inflight %d, default window, %d runs per order interleaved; "+
		"drain = backlog published beforehand straight to JetStream, then the worker started; end to end = %d concurrent "+
		"front-door clients and the worker together; idle = %d calls one at a time.\n", c.Messages, c.MaxInflight, max(1, c.Repeat), c.Publishers, c.Idle)
	fmt.Fprintf(&b, "- Overload: the %d models of `models-torpor-v100.csv` (Torpor, V100) as functions, each request holding one of "+
		"%d GPU slots for its model's native latency (the function server runs at most %d at once); pool capacity from a real "+
		"gpuserver on the simulated `%s` node (admission: 1 GPU invocation per healthy GPU); deadlines 80 ms (CV models) and "+
		"200 ms (bert_qa) on the 98th percentile. Poisson burst at %.1fx the pool's capacity (%.0f requests/s) for %s, models "+
		"uniform, seed %d: %d requests, the same arrivals for each strategy.\n\n",
		len(r.Models), r.GPUs, r.GPUs, c.Preset, c.Factor, r.Rate, c.Burst, c.Seed, r.Overload[0].Requests)

	fmt.Fprintf(&b, "## Throughput and added latency (no-op functions)\n\n")
	fmt.Fprintf(&b, "| order | run | drain msg/s | end-to-end msg/s | e2e p50 | e2e p99 | idle p50 | idle p99 | ordering per msg | duplicates |\n")
	fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	medians := r.throughputMedians()
	for _, order := range []worker.Ordering{worker.OrderFIFO, worker.OrderSLOAware} {
		run := 0
		for _, t := range r.Throughput {
			if t.Order != order {
				continue
			}
			run++
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %s | %s | %s | %s | %s | %d |\n", t.Order, run, t.DrainRate, t.EndToEndRate,
				ms(t.P50), ms(t.P99), ms(t.IdleP50), ms(t.IdleP99), us(t.OrderingPerMessage), t.Duplicates)
		}
		m := medians[order]
		fmt.Fprintf(&b, "| **%s** | **median** | **%.0f** | **%.0f** | %s | %s | %s | %s | %s | %d |\n", order, m.DrainRate, m.EndToEndRate,
			ms(m.P50), ms(m.P99), ms(m.IdleP50), ms(m.IdleP99), us(m.OrderingPerMessage), m.Duplicates)
	}
	fmt.Fprintf(&b, "\n- drain msg/s: worker start to last callback over a backlog; end-to-end msg/s: first front-door request to "+
		"last callback with publishers running; e2e p50/p99: latency per message during the end-to-end run (includes "+
		"queueing behind the backlog the publishers build); idle p50/p99: the path's added latency with nothing else "+
		"queued (front door + JetStream + pull + dispatch + invoke + callback); ordering per msg: time in the ordering "+
		"policy (gpuserver/queueing: push + pop, under the worker's lock) per message in the drain run.\n\n")

	fmt.Fprintf(&b, "## SLO attainment under overload\n\n")
	fmt.Fprintf(&b, "| strategy | requests | on time | attainment |")
	for _, cl := range r.Overload[0].Classes {
		fmt.Fprintf(&b, " %s: on time / n | %s: p50, p98 | %s: functions at p98 |", ms(cl.SLO), ms(cl.SLO), ms(cl.SLO))
	}
	fmt.Fprintf(&b, " makespan | ordering per msg | duplicates |\n|---|---:|---:|---:|")
	for range r.Overload[0].Classes {
		fmt.Fprintf(&b, "---:|---:|---:|")
	}
	fmt.Fprintf(&b, "---:|---:|---:|\n")
	for _, o := range r.Overload {
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f%% |", o.Strategy.Name, o.Requests, o.OnTime, 100*float64(o.OnTime)/float64(max(1, o.Requests)))
		for _, cl := range o.Classes {
			fmt.Fprintf(&b, " %d / %d | %s, %s | %d / %d |", cl.OnTime, cl.Requests, ms(cl.P50), ms(cl.P98), cl.FunctionsMet, cl.Functions)
		}
		fmt.Fprintf(&b, " %s | %s | %d |\n", o.Makespan.Round(time.Millisecond), us(o.OrderingPerMessage), o.Duplicates)
	}
	fmt.Fprintf(&b, "\n- on time: callback arrived within the function's deadline after X-Start-Time; functions at p98: functions "+
		"whose on-time share reached their 98th-percentile target.\n"+
		"- How to read it: at twice the pool's capacity about half of the burst cannot be served within any deadline, so no "+
		"strategy can reach a 98th-percentile target; the figure that tells the strategies apart is how many requests are on "+
		"time. The SLO-aware order (gpuserver/queueing, the same library as the gpuserver's queue) dispatches requests that "+
		"can still meet their deadline first and the ones that cannot after them, oldest first, so the late ones wait longer "+
		"(see p98) while more are on time; FIFO serves in arrival order, so once the backlog is longer than a deadline nearly "+
		"every request is late; max_inflight=1 uses one GPU of the pool at a time.\n"+
		"- Everything (NATS server, front door, worker, gateway, callback receiver, load generators) shares the same CPUs; "+
		"`go run ./test/bench/queue -cpuprofile` shows HTTP serving and client I/O taking most of the CPU of the throughput runs.\n\n")

	fmt.Fprintf(&b, "## Targets\n\n")
	best := 0.0
	worstOrder := time.Duration(0)
	for _, m := range r.throughputMedians() {
		best = max(best, m.EndToEndRate)
	}
	for _, t := range r.Throughput {
		worstOrder = max(worstOrder, t.OrderingPerMessage)
	}
	for _, o := range r.Overload {
		worstOrder = max(worstOrder, o.OrderingPerMessage)
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	var slo, fifo int
	for _, o := range r.Overload {
		switch o.Strategy.Name {
		case "SLO-aware":
			slo = o.OnTime
		case "FIFO":
			fifo = o.OnTime
		}
	}
	fmt.Fprintf(&b, "- >= 5,000 messages/s end to end to no-op functions: %.0f msg/s (the better order's median over its runs), %s.\n", best, verdict(best >= 5000))
	fmt.Fprintf(&b, "- ordering overhead <= 50 us per message: worst %s, %s.\n", us(worstOrder), verdict(worstOrder <= 50*time.Microsecond))
	fmt.Fprintf(&b, "- SLO-aware meets strictly more deadlines than FIFO under overload: %d vs %d, %s.\n", slo, fifo, verdict(slo > fifo))
	return b.String()
}

// throughputMedians is each order's median of every throughput figure over its runs (figures taken one by one).
func (r *Report) throughputMedians() map[worker.Ordering]ThroughputResult {
	out := map[worker.Ordering]ThroughputResult{}
	by := map[worker.Ordering][]ThroughputResult{}
	for _, t := range r.Throughput {
		by[t.Order] = append(by[t.Order], t)
	}
	for order, ts := range by {
		f := func(get func(ThroughputResult) float64) float64 {
			v := make([]float64, len(ts))
			for i, t := range ts {
				v[i] = get(t)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		d := func(get func(ThroughputResult) time.Duration) time.Duration {
			return time.Duration(f(func(t ThroughputResult) float64 { return float64(get(t)) }))
		}
		out[order] = ThroughputResult{Order: order,
			DrainRate:          f(func(t ThroughputResult) float64 { return t.DrainRate }),
			EndToEndRate:       f(func(t ThroughputResult) float64 { return t.EndToEndRate }),
			P50:                d(func(t ThroughputResult) time.Duration { return t.P50 }),
			P99:                d(func(t ThroughputResult) time.Duration { return t.P99 }),
			IdleP50:            d(func(t ThroughputResult) time.Duration { return t.IdleP50 }),
			IdleP99:            d(func(t ThroughputResult) time.Duration { return t.IdleP99 }),
			OrderingPerMessage: d(func(t ThroughputResult) time.Duration { return t.OrderingPerMessage }),
			Duplicates:         int(f(func(t ThroughputResult) float64 { return float64(t.Duplicates) })),
		}
	}
	return out
}
