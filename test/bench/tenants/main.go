// Command tenants (test/bench/tenants) measures what running each tenant in an executor process of its own costs (docs/tenants.md)
// against running every tenant in the gpuserver's process, side by side in one run (`make bench-tenants`, writes
// docs/bench/tenants.md): the remoting round trip and async records per second through the real shim and the
// device handler, a swap of a model from host memory, and a request's acquire and release through the pool.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/internal/benchhost"
)

type config struct {
	out, bench, ptx, fnDir, shimDir string
	nsync, nasync, rounds, swaps    int
	acquires                        int
	modelMiB                        int
	timeScale                       float64
}

func main() {
	tenantexec.RunIfChild() // this binary is also the executors of the per-tenant mode
	var c config
	flag.StringVar(&c.out, "out", "docs/bench/tenants.md", "Markdown file to write")
	flag.StringVar(&c.bench, "bench", "shim/build/bench_tenant", "the shim's bench program")
	flag.StringVar(&c.shimDir, "shim", "shim/build", "the shim's build folder (libcuda.so.1)")
	flag.StringVar(&c.fnDir, "function", "functions/vector-add", "the vector-add function (kernels.ptx, cudadrv.py)")
	flag.IntVar(&c.nsync, "sync-calls", 20000, "synchronous round trips per run")
	flag.IntVar(&c.nasync, "async-calls", 200000, "async launches per run")
	flag.IntVar(&c.rounds, "rounds", 3, "rounds; each runs both modes, in alternating order")
	flag.IntVar(&c.swaps, "swaps", 5, "swaps of the model per run")
	flag.IntVar(&c.acquires, "acquires", 1000, "acquire/release pairs per run")
	flag.IntVar(&c.modelMiB, "model-mib", 256, "the swapped model's size, MiB (16 MiB blocks)")
	flag.Float64Var(&c.timeScale, "time-scale", 0, "the simulated GPUs' delays (0: none, the data plane's own cost)")
	flag.Parse()
	c.ptx = filepath.Join(c.fnDir, "kernels.ptx")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "tenant-bench:", err)
		os.Exit(1)
	}
}

var modes = []string{"one process", "executor per tenant"}

// figures of one run of one mode.
type figures map[string]float64

func run(ctx context.Context, c config) error {
	for _, p := range []string{c.bench, c.ptx, filepath.Join(c.shimDir, "libcuda.so.1")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (make -C shim builds the shim and its bench programs)", err)
		}
	}
	res := map[string][]figures{}
	for r := 0; r < c.rounds; r++ {
		order := modes
		if r%2 == 1 {
			order = []string{modes[1], modes[0]}
		}
		for _, m := range order {
			f, err := runMode(ctx, c, m)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r, m, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-20s %v\n", r, m, f)
			res[m] = append(res[m], f)
		}
	}
	return os.WriteFile(c.out, []byte(report(c, res)), 0o644)
}

func runMode(ctx context.Context, c config, mode string) (figures, error) {
	node, err := topology.Preset("v100x4")
	if err != nil {
		return nil, err
	}
	dev, err := sim.New(sim.Options{Node: node, TimeScale: c.timeScale})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tenant-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cfg := server.Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node, Device: dev,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: uint64(2*c.modelMiB+64) << 20,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if mode != modes[0] {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Tenants = &server.TenantConfig{Command: []string{exe}, Env: []string{tenantexec.EnvChild + "=1"},
			LogLevel: "warn"}
	}
	s, err := server.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = s.Shutdown(sctx)
	}()
	const fn = "bench.ns1"
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: uint64(c.modelMiB+64) << 20}); err != nil {
		return nil, err
	}
	f := figures{}
	env := append(os.Environ(), "LD_LIBRARY_PATH="+c.shimDir, "FAAS_GPU_REMOTING_SOCKET="+s.RemotingSocket(),
		"FAAS_GPU_FUNCTION="+fn, "FAAS_GPU_TOKEN="+s.Token(fn))

	// Remoting: the shim's bench program, its calls run by the device handler.
	cmd := exec.CommandContext(ctx, c.bench, c.ptx, strconv.Itoa(c.nsync), strconv.Itoa(c.nasync))
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", c.bench, err, stderr.String())
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if x, err := strconv.ParseFloat(v, 64); err == nil {
			f[k] = x
		}
	}

	// The function's process ended: its memory is forgotten once its session is (a binding held across that would
	// break), so wait for the session to end first.
	if err := waitNoSessions(ctx, s); err != nil {
		return nil, err
	}

	// A swap: a function process holds a model of modelMiB in 16 MiB blocks, captured at its first request; it is
	// evicted and swapped in from host memory until its copies landed: once onto a GPU it never ran on (its
	// executor borrows, and the gpuserver zeroes, the chunks), then again and again onto that GPU.
	first, steady, err := swaps(ctx, c, s, env, fn)
	if err != nil {
		return nil, err
	}
	f["swap_first_gbps"], f["swap_gbps"] = first, steady
	if err := waitNoSessions(ctx, s); err != nil {
		return nil, err
	}

	// The control path: acquire and release of a function with nothing to swap.
	lat := make([]time.Duration, 0, c.acquires)
	for i := 0; i < c.acquires; i++ {
		t0 := time.Now()
		b, err := s.Pool().Acquire(ctx, fn)
		if err != nil {
			return nil, err
		}
		if err := s.Pool().Release(ctx, b.ID); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	f["acquire_release_p50_ns"] = float64(lat[len(lat)/2])
	f["acquire_release_p99_ns"] = float64(lat[len(lat)*99/100])

	return f, nil
}

// loaderPy holds a model of MiB mebibytes in 16 MiB blocks of random bytes until its stdin closes (random: the
// repository stores identical chunks once and a swap copies each of them once, so a repeated pattern would measure
// less than a model's copy).
const loaderPy = `
import os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
for i in range(int(sys.argv[1]) // 16):
    block = os.urandom(16 << 20)
    cuda.htod(cuda.alloc(len(block)), block)
print("ready", flush=True)
sys.stdin.read()
`

// plane is what both data planes offer a benchmark.
type plane interface {
	SwapIn(ctx context.Context, name string, gpu int, source executor.Source) error
	Evict(ctx context.Context, name string, gpu int) error
	WaitReady(ctx context.Context, name string) error
}

func swaps(ctx context.Context, c config, s *server.Server, env []string, fn string) (first, steady float64,
	err error) {
	cmd := exec.CommandContext(ctx, "python3", "-c", loaderPy, strconv.Itoa(c.modelMiB))
	cmd.Env = append(env, "FN_DIR="+c.fnDir, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return 0, 0, fmt.Errorf("the model loader said %q: %v", line, err)
	}
	b, err := s.Pool().Acquire(ctx, fn) // its first request: the model becomes its image
	if err != nil {
		return 0, 0, err
	}
	if err := s.Pool().Release(ctx, b.ID); err != nil {
		return 0, 0, err
	}
	var p plane = s.Executors()
	if s.Tenants() != nil {
		p = s.Tenants()
	}
	gpus := len(s.Pool().Status(ctx).GPUs)
	target := gpus - 1 // the loader initialised on another GPU (the emptiest), or on this one: evicted first
	var total time.Duration
	for i := 0; i <= c.swaps; i++ {
		for g := 0; g < gpus; g++ {
			if err := p.Evict(ctx, fn, g); err != nil {
				return 0, 0, err
			}
		}
		t0 := time.Now()
		if err := p.SwapIn(ctx, fn, target, executor.Host); err != nil {
			return 0, 0, err
		}
		if err := p.WaitReady(ctx, fn); err != nil {
			return 0, 0, err
		}
		d := time.Since(t0)
		if i == 0 {
			first = float64(c.modelMiB<<20) / d.Seconds() / 1e9
			continue
		}
		total += d
	}
	if os.Getenv("TENANT_BENCH_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "after the swaps: %+v\n", statusOf(s))
	}
	return first, float64(c.swaps) * float64(c.modelMiB<<20) / total.Seconds() / 1e9, nil
}

func statusOf(s *server.Server) any {
	if s.Tenants() != nil {
		return s.Tenants().Status()
	}
	return s.Executors().Status()
}

// waitNoSessions waits until the gpuserver counts no open remoting session.
func waitNoSessions(ctx context.Context, s *server.Server) error {
	for {
		mfs, err := s.Metrics().Gather()
		if err != nil {
			return err
		}
		open := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "faas_gpu_remoting_sessions" {
				for _, m := range mf.GetMetric() {
					open += m.GetGauge().GetValue()
				}
			}
		}
		if open == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stat is the mean of a figure over rounds with its range.
func stat(fs []figures, k string) (mean, lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, f := range fs {
		mean += f[k]
		lo, hi = min(lo, f[k]), max(hi, f[k])
	}
	return mean / float64(len(fs)), lo, hi
}

func report(c config, res map[string][]figures) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Tenants isolated by process: what the executor processes cost\n\n")
	fmt.Fprintf(&b, "Written by `make bench-tenants` (test/bench/tenants) on %s.\n\n",
		time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "Both modes ran in this one run, %d rounds each, alternating which mode goes first; figures are "+
		"means over the rounds with their range. *One process*: every tenant's sessions and swaps run in the "+
		"gpuserver's process (`--tenant-isolation=none`, as before docs/tenants.md). *Executor per tenant*: the "+
		"gpuserver checks the hello and hands the session to the tenant's executor process, which borrows its "+
		"chunks by descriptor (`--tenant-isolation=process`, the default).\n\n", c.rounds)
	fmt.Fprintf(&b, "| figure | one process | executor per tenant | per tenant / one process |\n|---|---|---|---|\n")
	row := func(name, key string, scale float64, unit string) {
		m0, l0, h0 := stat(res[modes[0]], key)
		m1, l1, h1 := stat(res[modes[1]], key)
		fmt.Fprintf(&b, "| %s | %.2f %s [%.2f, %.2f] | %.2f %s [%.2f, %.2f] | %.3f |\n", name, m0*scale, unit, l0*scale,
			h0*scale, m1*scale, unit, l1*scale, h1*scale, m1/m0)
	}
	row("sync round trip p50", "sync_p50_ns", 1e-3, "us")
	row("sync round trip p99", "sync_p99_ns", 1e-3, "us")
	row("sync round trip mean", "sync_mean_ns", 1e-3, "us")
	row("async records per second per connection", "async_calls_per_s", 1e-6, "M/s")
	row(fmt.Sprintf("swap of a %d MiB model from host, again onto a GPU it ran on", c.modelMiB), "swap_gbps", 1,
		"GB/s")
	row(fmt.Sprintf("swap of a %d MiB model from host onto a GPU it never ran on", c.modelMiB), "swap_first_gbps",
		1, "GB/s")
	row("acquire + release p50 (the binding hand-off)", "acquire_release_p50_ns", 1e-3, "us")
	row("acquire + release p99", "acquire_release_p99_ns", 1e-3, "us")
	fmt.Fprintf(&b, "\nTargets (docs/tenants.md): round trip and swap within 5%% of one process, async records per "+
		"second no worse.\n\n## Conditions\n\n")
	fmt.Fprintf(&b, "- machine: %d CPUs (`nproc`), %s; shared with other work while measured\n", runtime.NumCPU(),
		benchhost.CPUModel())
	fmt.Fprintf(&b, "- %s, %s/%s; shim built with gcc -O2\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "- simulated v100x4 (delays x%g: %s); the device handler runs every call (vector_add over 1 "+
		"element is the launch)\n", c.timeScale, map[bool]string{true: "no modelled time, the data plane's own CPU " +
		"cost", false: "modelled link and kernel time"}[c.timeScale == 0])
	fmt.Fprintf(&b, "- sync: %d cuCtxSynchronize round trips on a session with a bound stream, after 1000 warm-up "+
		"calls; async: %d cuLaunchKernel records then one cuCtxSynchronize (shim/test/bench_tenant.c)\n", c.nsync,
		c.nasync)
	fmt.Fprintf(&b, "- swap: a %d MiB model (16 MiB blocks of random bytes, its captured image) swapped from host to GPU 3 after "+
		"evicting it everywhere, timed to the end of its copies (SwapIn then WaitReady): once onto a GPU it never ran "+
		"on (per tenant: its executor borrows the chunks, the gpuserver zeroes and exports them, the executor maps "+
		"them; in one process: the pool's chunks, first touched), then %d times again (per tenant: the chunks the "+
		"executor kept)\n", c.modelMiB, c.swaps)
	fmt.Fprintf(&b, "- acquire + release: %d pairs through the pool of a function with nothing to swap: the "+
		"controller's queue and, per tenant, one hold and one release frame to the executor\n", c.acquires)
	fmt.Fprintf(&b, "- host memory behind the simulated GPUs' chunks: in one process, pages of the gpuserver's Go heap "+
		"(a page touched for the first time costs a private page fault, and none when the heap reuses pages freed "+
		"earlier in this bench process: hence the one-process first swap's two clusters, about 2 and about 10 GB/s); "+
		"per tenant, memfd pages the gpuserver lends and the executor maps, each granule a swap overwrites whole "+
		"allocated and mapped in two calls before the copy (fallocate, MADV_POPULATE_WRITE), never reused from "+
		"another process's heap; a model copied into them competes with no garbage collector\n")
	fmt.Fprintf(&b, "- the model's bytes are random (os.urandom); no other seed\n\nWhat this does not show: a real GPU (the GPU suite measures "+
		"contexts and chunk imports there; unverified), contention of many tenants' executors for the CPUs, or "+
		"chunks moving between tenants under memory pressure (reclaimed, zeroed, imported again).\n")
	return b.String()
}
