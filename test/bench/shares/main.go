// Command shares measures compute shares on the timed virtual GPU (docs/bench/shares.md): two co-located
// small-model functions, each at request 0.5, bound exclusively one request at a time (the default) against
// co-running through the launch path's gates (gpuserver/compute), closed loop; and what a gate costs a binding
// alone on its GPU.
//
//	go run ./test/bench/shares -out docs/bench/shares.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"encoding/binary"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/internal/benchhost"
)

type config struct {
	node      string
	scale     float64
	seconds   float64
	pre, post time.Duration // a request's host work while bound (decode, pre- and post-processing)
	kernels   int
	sweep     []int         // kernels per request of each load of the pair
	kernel    time.Duration // each kernel's GPU time alone
	slo       time.Duration
	request   float64
	limit     float64
	rounds    int
	out       string
	throughUp bool   // through faas-gpu up (up.go)
	bin       string // faas-gpu's binary, for -through-up
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "shares:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	var c config
	fs := flag.NewFlagSet("shares", flag.ContinueOnError)
	fs.StringVar(&c.node, "node", "h200x1", "simulated node (a preset or a node file)")
	fs.Float64Var(&c.scale, "time-scale", 5, "the sim's delays multiplied by this (figures are in modelled time)")
	fs.Float64Var(&c.seconds, "seconds", 2, "modelled seconds each mode runs")
	fs.DurationVar(&c.pre, "pre", 1500*time.Microsecond, "host work of a request before its kernels (bound)")
	fs.DurationVar(&c.post, "post", 700*time.Microsecond, "host work of a request after its kernels (bound)")
	sweepFlag := fs.String("kernels", "12,24,36", "kernels per request, one load of the pair each (comma-separated); the first is the gate's cost's")
	fs.DurationVar(&c.kernel, "kernel", 100*time.Microsecond, "GPU time of each kernel alone")
	fs.DurationVar(&c.slo, "slo", 15*time.Millisecond, "each function's latency SLO (p98)")
	fs.Float64Var(&c.request, "request", 0.5, "each function's com.openfaas.gpu.compute.request")
	fs.Float64Var(&c.limit, "limit", 0.75, "each function's com.openfaas.gpu.compute.limit")
	fs.IntVar(&c.rounds, "rounds", 3, "rounds of the gate's cost (alone, gated and not, alternating)")
	fs.StringVar(&c.out, "out", "", "write the report here (markdown) as well as to stdout")
	fs.BoolVar(&c.throughUp, "through-up", false, "run the functions through faas-gpu up (-bin) on the timed virtual GPU, "+
		"invoked through its gateway, instead of on the virtual GPU directly")
	fs.StringVar(&c.bin, "bin", "bin/faas-gpu", "faas-gpu's binary (make build), for -through-up")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, f := range strings.Split(*sweepFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-kernels: %q is not a positive count", f)
		}
		c.sweep = append(c.sweep, n)
	}
	c.kernels = c.sweep[0]
	switch {
	case !(c.scale >= 1):
		return errors.New("-time-scale must be at least 1 (the wall clock's timers are too coarse below)")
	case c.kernels < 1 || c.kernel <= 0 || c.pre < 0 || c.post < 0 || c.slo <= 0 || c.seconds <= 0 || c.rounds < 1:
		return errors.New("-kernels, -kernel, -slo, -seconds and -rounds must be positive, -pre and -post not negative")
	}
	node, err := topology.Resolve(c.node)
	if err != nil {
		return fmt.Errorf("-node: %w", err)
	}
	dev, err := sim.New(sim.Options{Node: node, TimeScale: c.scale})
	if err != nil {
		return err
	}
	defer func() { _ = dev.Close(context.Background()) }()
	b := &bench{c: c, dev: dev}
	if b.busy, err = busyKernel(dev); err != nil {
		return err
	}
	if c.throughUp {
		return b.reportThroughUp(args, node.Name, node.GPUs[0].Name, stdout)
	}

	var rep strings.Builder
	fmt.Fprintf(&rep, "# Compute shares on the timed virtual GPU\n\n")
	fmt.Fprintf(&rep, "Written by `go run ./test/bench/shares%s` (commit %s). Machine: %d CPUs (%s), load average "+
		"%s at the start. Device: sim %s (%s), delays x%g; every figure is modelled time (wall time / %g).\n\n",
		argsLine(args), benchhost.Commit(), runtime.NumCPU(), benchhost.CPUModel(), benchhost.LoadAvg(), node.Name,
		node.GPUs[0].Name, c.scale, c.scale)
	host := c.pre + c.post
	fmt.Fprintf(&rep, "Load: two functions, closed loop (each issues its next request when its last one ends). A request "+
		"is bound for %v of host work, N kernels of %v each, synchronised, then %v of host work; N sets how busy an "+
		"exclusive binding keeps its GPU. SLO %v at p98 for both. Shares: request %g, limit %g each (Dilu's caps: "+
		"requests sum to %g <= 1, limits to %g <= 1.5). Exclusive: one request holds the GPU from acquire to release, "+
		"the other waits (FIFO), as the controller binds today; shared: both run at once, their launches released "+
		"by their gates (gpuserver/compute, period %v).\n\n", c.pre, c.kernel, c.post, c.slo, c.request, c.limit,
		2*c.request, 2*c.limit, compute.DefaultPeriod)
	fmt.Fprintf(&rep, "## Two functions on one GPU\n\n")
	fmt.Fprintf(&rep, "| N kernels (GPU busy, exclusive) | binding | requests/s (both) | p50 a | p98 a | p50 b | p98 b | both p98 within %v | shared / exclusive |\n", c.slo)
	fmt.Fprintf(&rep, "|---|---|---|---|---|---|---|---|---|\n")
	var notes []string
	for _, k := range c.sweep {
		b.c.kernels = k
		gpu := time.Duration(k) * c.kernel
		busy := fmt.Sprintf("%d (%.0f%%)", k, 100*float64(gpu)/float64(host+gpu))
		excl, err := b.pair(false)
		if err != nil {
			return err
		}
		shared, err := b.pair(true)
		if err != nil {
			return err
		}
		for _, r := range []struct {
			name string
			res  pairResult
		}{{"exclusive", excl}, {fmt.Sprintf("shared %g/%g", c.request, c.limit), shared}} {
			within := r.res.a.pct(98) <= c.slo && r.res.b.pct(98) <= c.slo
			ratio := ""
			if r.res.shares != nil {
				ratio = fmt.Sprintf("**%.2fx**", shared.rps/excl.rps)
			}
			fmt.Fprintf(&rep, "| %s | %s | %.1f | %v | %v | %v | %v | %v | %s |\n", busy, r.name, r.res.rps,
				r.res.a.pct(50), r.res.a.pct(98), r.res.b.pct(50), r.res.b.pct(98), yes(within), ratio)
		}
		var sh []string
		for _, s := range shared.shares {
			sh = append(sh, fmt.Sprintf("%s at %g (%s), GPU time %v, waited at its gate %v", s.Binding, s.Share,
				s.State, b.modelled(s.Used), b.modelled(s.Waited)))
		}
		notes = append(notes, fmt.Sprintf("N = %d: %s.", k, strings.Join(sh, "; ")))
	}
	b.c.kernels = c.kernels
	fmt.Fprintf(&rep, "\nThe arbiter at the end of each shared run: %s\n\n", strings.Join(notes, " "))

	fmt.Fprintf(&rep, "## What a gate costs a binding alone on its GPU\n\n")
	fmt.Fprintf(&rep, "One function alone, closed loop, %d rounds alternating an ungated and a gated stream (request %g, "+
		"limit 1: it grows to the whole GPU when held at its gate).\n\n", c.rounds, c.request)
	fmt.Fprintf(&rep, "| round | ungated requests/s | gated requests/s | gated / ungated | launches held at the gate |\n|---|---|---|---|---|\n")
	var ratios []float64
	var waited time.Duration
	for i := range c.rounds {
		raw, _, err := b.alone(false)
		if err != nil {
			return err
		}
		gated, w, err := b.alone(true)
		if err != nil {
			return err
		}
		ratios = append(ratios, gated/raw)
		waited += w
		fmt.Fprintf(&rep, "| %d | %.1f | %.1f | %.4f | %v |\n", i+1, raw, gated, gated/raw, w)
	}
	admit, err := b.admitCost()
	if err != nil {
		return err
	}
	mean := 0.0
	for _, r := range ratios {
		mean += r
	}
	mean /= float64(len(ratios))
	perReq := time.Duration(c.kernels) * admit
	fmt.Fprintf(&rep, "\nGated over ungated: mean %.4f (range %.4f-%.4f) over %d rounds. The gate adds %v of host time "+
		"to a launch with tokens in hand (wall time, not scaled); a request's %d launches %v, %.3f%% of "+
		"its %v modelled bound time.\n\n", mean, slices.Min(ratios), slices.Max(ratios), c.rounds, admit, c.kernels,
		perReq, 100*float64(perReq)/float64(c.pre+c.post+time.Duration(c.kernels)*c.kernel), c.pre+c.post+
			time.Duration(c.kernels)*c.kernel)
	alone := time.Duration(float64(c.rounds) * c.seconds / 2 * float64(time.Second))
	fmt.Fprintf(&rep, "On the GPU's timeline the gate held the lone binding's launches %v in %v (%.3f%%): with "+
		"tokens for its request it is held only until its share grows, after which it passes at once. Its cost "+
		"alone is the host time above (counted as 0 when the measurement came out negative: within the noise) plus "+
		"that: **%.3f%%** of the bound time.\n\n", waited, alone, 100*float64(waited)/float64(alone),
		100*float64(max(0, perReq))/float64(c.pre+c.post+time.Duration(c.kernels)*c.kernel)+
			100*float64(waited)/float64(alone))
	fmt.Fprintf(&rep, "Load average at the end: %s.\n", benchhost.LoadAvg())

	if _, err := io.WriteString(stdout, rep.String()); err != nil {
		return err
	}
	if c.out != "" {
		return writeReport(c.out, rep.String())
	}
	return nil
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func argsLine(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return " " + strings.Join(args, " ")
}

// writeReport keeps the hand-written part of an existing report (from its "## What it does not show" heading on)
// below the measured part.
func writeReport(path, measured string) error {
	const keep = "## What it does not show"
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	tail := ""
	if i := strings.Index(string(old), keep); i >= 0 {
		tail = "\n" + string(old[i:])
	}
	return os.WriteFile(path, []byte(measured+tail), 0o644)
}

type bench struct {
	c    config
	dev  *sim.Backend
	busy device.Function
}

func busyKernel(dev *sim.Backend) (device.Function, error) {
	mod, err := dev.LoadModule(0, kernels.PTX())
	if err != nil {
		return nil, err
	}
	return mod.Function("busy")
}

func (b *bench) scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * b.c.scale) }
func (b *bench) modelled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / b.c.scale).Round(time.Microsecond)
}

// sleepUntil returns at t: on a timer until shortly before, then yielding (a timer fires up to a millisecond late).
func sleepUntil(t time.Time) {
	if d := time.Until(t) - 2*time.Millisecond; d > 0 {
		time.Sleep(d)
	}
	for time.Now().Before(t) {
		runtime.Gosched()
	}
}

type latencies []time.Duration

func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	i := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(len(s)-1, max(0, i))].Round(10 * time.Microsecond)
}

// request runs one request's work on st: host work, the kernels, a synchronisation, host work. It returns the
// wall time of its GPU phase (launches to synchronised).
func (b *bench) request(ctx context.Context, st device.Stream) (time.Duration, error) {
	sleepUntil(time.Now().Add(b.scaled(b.c.pre)))
	start := time.Now()
	args := make([]byte, 8)
	binary.LittleEndian.PutUint64(args, uint64(b.c.kernel))
	for range b.c.kernels {
		if err := st.Launch(b.busy, device.Dim3{X: 132}, device.Dim3{X: 256}, 0, args); err != nil {
			return 0, err
		}
	}
	if err := st.Synchronize(ctx); err != nil {
		return 0, err
	}
	gpu := time.Since(start)
	sleepUntil(time.Now().Add(b.scaled(b.c.post)))
	return gpu, nil
}

type pairResult struct {
	rps     float64
	a, b    latencies
	shares  []compute.Share
	metrics string // through up: the gpuserver's grant counters
}

// fifo is the exclusive binding: one request holds the GPU from acquire to release, the others wait in order.
type fifo struct {
	mu      sync.Mutex
	waiters []chan struct{}
	held    bool
}

func (f *fifo) acquire() {
	f.mu.Lock()
	if !f.held {
		f.held = true
		f.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	f.waiters = append(f.waiters, ch)
	f.mu.Unlock()
	<-ch
}

func (f *fifo) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.waiters) == 0 {
		f.held = false
		return
	}
	next := f.waiters[0]
	f.waiters = f.waiters[1:]
	close(next)
}

// pair runs the two functions for the configured time, exclusively or co-running through their gates.
func (b *bench) pair(shared bool) (pairResult, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reg *compute.Registry
	ran := make(chan error, 1)
	if shared {
		var err error
		reg, err = compute.NewRegistry(ctx, 1, compute.Config{Clock: sim.WallClock{}, Period: b.scaled(compute.DefaultPeriod)})
		if err != nil {
			return pairResult{}, err
		}
		go func() { ran <- reg.Run(ctx) }()
		defer func() { cancel(); <-ran }()
	}
	var lock fifo
	end := time.Now().Add(b.scaled(time.Duration(b.c.seconds * float64(time.Second))))
	lat := make([]latencies, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"a", "b"} {
		raw, err := b.dev.NewStream(0)
		if err != nil {
			return pairResult{}, err
		}
		defer func() { _ = raw.Destroy() }()
		var st device.Stream = raw
		var gate *compute.Gate
		if shared {
			if gate, err = reg.Bind(name, 0, b.c.request, b.c.limit); err != nil {
				return pairResult{}, err
			}
			gate.SetTarget(b.scaled(time.Duration(b.c.kernels) * b.c.kernel))
			if st, err = reg.Wrap(name, 0, raw, raw.(device.ComputeMeter)); err != nil {
				return pairResult{}, err
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				t0 := time.Now()
				if !shared {
					lock.acquire()
				}
				gpu, err := b.request(ctx, st)
				if !shared {
					lock.release()
				}
				if err != nil {
					errs[i] = err
					return
				}
				if gate != nil {
					gate.Cycle(gpu)
				}
				lat[i] = append(lat[i], b.modelled(time.Since(t0)))
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	took := b.modelled(time.Since(start))
	if err := errors.Join(errs...); err != nil {
		return pairResult{}, err
	}
	res := pairResult{rps: float64(len(lat[0])+len(lat[1])) / took.Seconds(), a: lat[0], b: lat[1]}
	if shared {
		res.shares = reg.Arbiter(0).Shares()
	}
	return res, nil
}

// alone runs one function for the configured time and returns its requests per second (modelled) and, gated, how
// long its launches waited at the gate (modelled).
func (b *bench) alone(gated bool) (float64, time.Duration, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	raw, err := b.dev.NewStream(0)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = raw.Destroy() }()
	var st device.Stream = raw
	var reg *compute.Registry
	if gated {
		reg, err = compute.NewRegistry(ctx, 1, compute.Config{Clock: sim.WallClock{}, Period: b.scaled(compute.DefaultPeriod)})
		if err != nil {
			return 0, 0, err
		}
		ran := make(chan error, 1)
		go func() { ran <- reg.Run(ctx) }()
		defer func() { cancel(); <-ran }()
		if _, err := reg.Bind("alone", 0, b.c.request, 1); err != nil {
			return 0, 0, err
		}
		if st, err = reg.Wrap("alone", 0, raw, raw.(device.ComputeMeter)); err != nil {
			return 0, 0, err
		}
	}
	end := time.Now().Add(b.scaled(time.Duration(b.c.seconds * float64(time.Second) / 2)))
	start, n := time.Now(), 0
	for time.Now().Before(end) {
		if _, err := b.request(ctx, st); err != nil {
			return 0, 0, err
		}
		n++
	}
	rps := float64(n) / b.modelled(time.Since(start)).Seconds()
	if reg == nil {
		return rps, 0, nil
	}
	return rps, b.modelled(reg.Arbiter(0).Shares()[0].Waited), nil
}

// admitCost is the host time a gate adds to a launch with tokens in hand: launches of an empty kernel through a
// gated stream against the same on the raw stream, alternating.
func (b *bench) admitCost() (time.Duration, error) {
	ctx := context.Background()
	arb, err := compute.NewArbiter(compute.Config{Clock: sim.WallClock{}, Period: time.Hour})
	if err != nil {
		return 0, err
	}
	g, err := arb.Join("x", 0.5, 1)
	if err != nil {
		return 0, err
	}
	raw, err := b.dev.NewStream(0)
	if err != nil {
		return 0, err
	}
	defer func() { _ = raw.Destroy() }()
	gated, err := compute.Gated(ctx, raw, raw.(device.ComputeMeter), g)
	if err != nil {
		return 0, err
	}
	args := make([]byte, 8) // busy(0): no GPU time, so the tokens last
	const n = 100_000
	launches := func(st device.Stream) (time.Duration, error) {
		start := time.Now()
		for range n {
			if err := st.Launch(b.busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, args); err != nil {
				return 0, err
			}
		}
		took := time.Since(start)
		return took, st.Synchronize(ctx)
	}
	var extra time.Duration
	for range 4 {
		r, err := launches(raw)
		if err != nil {
			return 0, err
		}
		gt, err := launches(gated)
		if err != nil {
			return 0, err
		}
		extra += gt - r
	}
	return extra / (4 * n), nil
}
