// Command llmbench measures the llm function (functions/llm, unchanged, driven by test/gpu/llm_bench.py) through
// the real shim, remoting server, executor and repository on a simulated H100 node in dry kernel mode, and writes
// docs/bench/llm.md: the host side of time to first token warm and cold (after an eviction, from the host image),
// decode steps per second eagerly and with CUDA graphs, remoted calls per token (with the shim answering the
// synchronize after a read, and without: FAAS_GPU_REMOTING_LOCAL_SYNC=0, side by side), and the host memory and swap
// bytes that sharing one base between variants (LoRA adapters, LLM_ADAPTER_SEED) saves, measured with 4 and 16 of
// them deployed at once. Dry kernels are not computed, so every time here is host
// overhead (Python, PyTorch's dispatch, the shim, the gpuserver) with no GPU time; the GPU suite measures the same
// code natively and through the shim on a real GPU (test/gpu, TestGPULLMThroughTheShim).
//
//	go run ./test/llmbench -out docs/bench/llm.md      (make bench-llm; needs test/pyenv)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

type config struct {
	out      string
	tokens   int
	runs     int
	layers   int
	variants int
	timed    bool
	// -batch
	batch       bool
	concurrency string
	startLoad   string // /proc/loadavg when the run began
}

func main() {
	var c config
	flag.StringVar(&c.out, "out", "docs/bench/llm.md", "where to write the report")
	flag.IntVar(&c.tokens, "tokens", 32, "tokens per completion")
	flag.IntVar(&c.runs, "runs", 5, "completions per measurement")
	flag.IntVar(&c.layers, "layers", 24, "layers of the model (24: Qwen2.5-0.5B's shape)")
	flag.IntVar(&c.variants, "variants", 16, "variants of the base (a LoRA adapter each) deployed at once; the host "+
		"memory is also reported at 4 (each variant is a process of the llm function: about 20 s of CPU to start)")
	flag.BoolVar(&c.batch, "batch", false, "the continuous batching figures instead (docs/bench/llm-batch.md): "+
		"decode tokens/s, TTFT and binding hold time at -concurrency sequences, batched and one at a time")
	flag.StringVar(&c.concurrency, "concurrency", "1,4,16,64", "with -batch: the concurrent sequences measured")
	flag.BoolVar(&c.timed, "timed", false, "the sim's timed virtual GPU (TimeScale 1): every kernel takes the launch "+
		"latency (5 us) of modelled GPU time, as no profile of this model's kernels exists")
	flag.Parse()
	if c.tokens < 2 || c.runs < 1 || c.layers < 1 || c.variants < 1 {
		fmt.Fprintln(os.Stderr, "llmbench: -tokens must be >= 2, -runs, -layers and -variants >= 1")
		os.Exit(2)
	}
	do := run
	if c.batch {
		do = runBatch
	}
	if err := do(context.Background(), c); err != nil {
		fmt.Fprintln(os.Stderr, "llmbench:", err)
		os.Exit(1)
	}
}

// registry and binder: the functions of the bench, bound to GPU 0 while a request runs.
type registry map[string]pool.FunctionSpec

func (r registry) Function(name string) (pool.FunctionSpec, string, error) {
	s, ok := r[name]
	if !ok {
		return pool.FunctionSpec{}, "", pool.ErrUnknownFunction
	}
	return s, "token-" + name, nil
}

type binder struct {
	mu    sync.Mutex
	bound map[string]bool
}

func (b *binder) CurrentGPU(fn string) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return 0, b.bound[fn]
}

func (b *binder) BindImplicit(context.Context, string) (int, func(), error) { return 0, func() {}, nil }

type node struct {
	dev  *sim.Backend
	repo *repository.Repository
	xn   *executor.Node
	b    *binder
	sock string
}

func startNode(ctx context.Context, funcs registry, timed bool) (*node, func(), error) {
	topo, err := topology.Preset("h100x8")
	if err != nil {
		return nil, nil, err
	}
	opts := sim.Options{Node: topo, Kernels: sim.KernelsDry}
	if timed {
		opts.TimeScale = 1
	}
	dev, err := sim.New(opts)
	if err != nil {
		return nil, nil, err
	}
	mem, err := memory.New(dev, memory.Config{MaxBytesPerGPU: 16 << 30})
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "llmbench")
	if err != nil {
		return nil, nil, err
	}
	shm, err := os.MkdirTemp("/dev/shm", "llmbench")
	if err != nil {
		shm = filepath.Join(dir, "shm")
	}
	repo, err := repository.Open(repository.Config{Dir: shm, Registrar: dev})
	if err != nil {
		return nil, nil, err
	}
	xn, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo})
	if err != nil {
		return nil, nil, err
	}
	b := &binder{bound: map[string]bool{}}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("LLMBENCH_DEBUG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := remoting.NewServer(remoting.Config{Device: dev, Node: xn, Functions: funcs, Binder: b, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(dir, "remoting.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, l) }()
	stop := func() {
		cancel()
		<-done
		bg := context.Background()
		_ = xn.Close(bg)
		_ = repo.Close()
		_ = mem.Close(bg)
		_ = dev.Close(bg)
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(shm)
	}
	return &node{dev: dev, repo: repo, xn: xn, b: b, sock: sock}, stop, nil
}

// proc is one llm_bench.py process through the shim.
type proc struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	err  *strings.Builder
	load struct {
		S      float64 `json:"load_s"`
		Params int64   `json:"params"`
	}
}

type reply struct {
	Tokens    []int              `json:"tokens"`
	TTFT      float64            `json:"ttft_s"`
	Total     float64            `json:"total_s"`
	PerSecond float64            `json:"decode_tokens_per_s"`
	Graphs    bool               `json:"cuda_graphs"`
	GraphErr  string             `json:"graph_error"`
	Stats     map[string]float64 `json:"stats"`
	Error     any                `json:"error"`
}

func startProc(n *node, py, shim, name string, c config, env ...string) (*proc, error) {
	return startScript(n, py, shim, "test/gpu/llm_bench.py", name, c, env...)
}

// startScript starts script (llm_bench.py, or batch_driver.py) as function name through the shim.
func startScript(n *node, py, shim, script, name string, c config, env ...string) (*proc, error) {
	cmd := exec.Command(filepath.Join(py, "bin", "python3"), script)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+shim, "FAAS_GPU_REMOTING_SOCKET="+n.sock,
		"FAAS_GPU_FUNCTION="+name, "FAAS_GPU_TOKEN=token-"+name, "FAAS_GPU=1", "PYTHONDONTWRITEBYTECODE=1",
		fmt.Sprintf("LLM_LAYERS=%d", c.layers), "LLM_MAX_PROMPT_TOKENS=256", "LLM_MAX_TOKENS=256")
	cmd.Env = append(cmd.Env, env...)
	p := &proc{name: name, cmd: cmd, err: &strings.Builder{}}
	cmd.Stderr = &lockedWriter{w: p.err}
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewScanner(stdout)
	p.out.Buffer(nil, 16<<20)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if !p.scan() {
		return nil, fmt.Errorf("%s did not start: %s", name, tailOf(p.err.String()))
	}
	if err := json.Unmarshal(p.out.Bytes(), &p.load); err != nil {
		return nil, fmt.Errorf("%s: %q: %w", name, p.out.Text(), err)
	}
	return p, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func tailOf(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

func (p *proc) complete(tokens int, graphs bool) (reply, error) {
	var r reply
	line, _ := json.Marshal(map[string]any{"cmd": "complete", "max_tokens": tokens, "graphs": graphs})
	if _, err := fmt.Fprintf(p.in, "%s\n", line); err != nil {
		return r, err
	}
	if !p.scan() {
		return r, fmt.Errorf("%s ended: %s", p.name, tailOf(p.err.String()))
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Error != nil {
		return r, fmt.Errorf("%s: %v", p.name, r.Error)
	}
	return r, nil
}

// scan reads the next JSON line of the process; other lines (what the handler prints) go to stderr.
func (p *proc) scan() bool {
	for p.out.Scan() {
		if strings.HasPrefix(p.out.Text(), "{") {
			return true
		}
		fmt.Fprintf(os.Stderr, "%s: %s\n", p.name, p.out.Text())
	}
	return false
}

func (p *proc) stop() {
	_ = p.in.Close()
	_ = p.cmd.Wait()
}

// request runs f as one request of fn: the executor binds it to GPU 0 (swapping it in when evicted) and releases
// it after, as the gpuserver does between acquire and release.
func (n *node) request(ctx context.Context, fn string, f func() error) (time.Duration, error) {
	start := time.Now()
	b, err := n.xn.Acquire(ctx, fn, 0, executor.Host)
	if err != nil {
		return 0, err
	}
	n.b.mu.Lock()
	n.b.bound[fn] = true
	n.b.mu.Unlock()
	err = f()
	n.b.mu.Lock()
	n.b.bound[fn] = false
	n.b.mu.Unlock()
	b.Release()
	return time.Since(start), err
}

// stat is a mean over runs with its range.
type stat struct{ mean, lo, hi float64 }

func stats(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := stat{lo: slices.Min(v), hi: slices.Max(v)}
	for _, x := range v {
		s.mean += x
	}
	s.mean /= float64(len(v))
	return s
}

func (s stat) ms() string {
	return fmt.Sprintf("%.1f (%.1f-%.1f)", 1e3*s.mean, 1e3*s.lo, 1e3*s.hi)
}

func (s stat) plain() string { return fmt.Sprintf("%.1f (%.1f-%.1f)", s.mean, s.lo, s.hi) }

// prepare finds the pinned Python environment and builds the shim (returning its folder), for either bench.
func prepare() (py, shim string, err error) {
	if py, err = pyenv.Dir(); err != nil {
		return "", "", err
	}
	if shim, err = filepath.Abs("shim/build"); err != nil {
		return "", "", err
	}
	if out, err := exec.Command("make", "-s", "-C", "shim").CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("make -C shim: %w\n%s", err, out)
	}
	return py, shim, nil
}

// spec is the pool spec of an llm function of either bench: a model shared between its instances' images.
func spec(name string) pool.FunctionSpec {
	return pool.FunctionSpec{Name: name, MemoryBytes: 4 << 30, Isolation: pool.IsolationShared,
		Scratch: pool.ScratchRequest, Model: pool.ModelShared}
}

func run(ctx context.Context, c config) error {
	py, shim, err := prepare()
	if err != nil {
		return err
	}
	funcs := registry{"llm-a": spec("llm-a"), "llm-rt": spec("llm-rt")}
	for i := 1; i <= c.variants; i++ {
		name := variantName(i)
		funcs[name] = spec(name)
	}
	n, stop, err := startNode(ctx, funcs, c.timed)
	if err != nil {
		return err
	}
	defer stop()

	a, err := startProc(n, py, shim, "llm-a", c)
	if err != nil {
		return err
	}
	defer a.stop()
	// The first request ends the initialisation: the model's segments become its image in the repository.
	if _, err := n.request(ctx, "llm-a", func() error { _, err := a.complete(4, false); return err }); err != nil {
		return err
	}
	imageA := n.repo.Stats()

	// Decoding, with the shim answering the synchronize after each read (the default), and in a process of its
	// own without (FAAS_GPU_REMOTING_LOCAL_SYNC=0: every synchronize a round trip), same base, same requests, their
	// runs taking turns.
	rt, err := startProc(n, py, shim, "llm-rt", c, "FAAS_GPU_REMOTING_LOCAL_SYNC=0")
	if err != nil {
		return err
	}
	if _, err := n.request(ctx, "llm-rt", func() error { _, err := rt.complete(4, false); return err }); err != nil {
		rt.stop()
		return err
	}
	both, err := decodeModes(ctx, n, []side{{a, "llm-a"}, {rt, "llm-rt"}}, c)
	rt.stop()
	if err != nil {
		return err
	}
	modes, rtModes := both[0], both[1]
	sameTokens := slices.Equal(modes[0].tokens, modes[1].tokens)

	// Cold: the model is evicted from the GPU, then one request swaps it in from the host image and decodes its
	// first token.
	var cold, coldSwap []float64
	for range c.runs {
		if err := n.xn.Evict(ctx, "llm-a", 0); err != nil {
			return err
		}
		before := n.xn.Status()[0].SwapBytes
		d, err := n.request(ctx, "llm-a", func() error { _, err := a.complete(1, false); return err })
		if err != nil {
			return err
		}
		cold = append(cold, d.Seconds())
		coldSwap = append(coldSwap, float64(n.xn.Status()[0].SwapBytes-before))
	}

	// Sharing: c.variants variants of the base, a LoRA adapter each, deployed at once (one process each, started
	// one after the other; each is evicted from the GPU after its first request, which ends its initialisation and
	// makes its image). Their images share the base's chunks in host memory.
	type point struct {
		variants int
		st       repository.Stats
	}
	var points []point
	variantImage := uint64(0)
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for i := 1; i <= c.variants; i++ {
		name := variantName(i)
		before := n.repo.Stats()
		p, err := startProc(n, py, shim, name, c, fmt.Sprintf("LLM_ADAPTER_SEED=%d", i))
		if err != nil {
			return err
		}
		procs = append(procs, p)
		if _, err := n.request(ctx, name, func() error { _, err := p.complete(2, false); return err }); err != nil {
			return err
		}
		if err := n.xn.Evict(ctx, name, 0); err != nil {
			return err
		}
		after := n.repo.Stats()
		if variantImage == 0 {
			variantImage = after.LogicalBytes - before.LogicalBytes
		}
		if i == 4 || i == c.variants {
			points = append(points, point{variants: i, st: after})
		}
		fmt.Fprintf(os.Stderr, "llmbench: %d variants: host %d bytes, images %d bytes\n", i, after.HostBytes,
			after.LogicalBytes)
	}
	var pss, anon []float64
	for _, p := range procs {
		if m, err := memoryMB(p.cmd.Process.Pid); err == nil {
			pss, anon = append(pss, m["Pss"]), append(anon, m["Anonymous"])
		}
	}
	// With llm-a (the base) resident on GPU 0, the first variant's swap-in copies only its own chunks and maps the
	// base's.
	if _, err := n.request(ctx, "llm-a", func() error { _, err := a.complete(2, false); return err }); err != nil {
		return err
	}
	first := procs[0]
	beforeSwap, beforeShared := n.xn.Status()[0].SwapBytes, n.xn.Sharing().SharedBytes
	if _, err := n.request(ctx, variantName(1), func() error { _, err := first.complete(2, false); return err }); err != nil {
		return err
	}
	swapV, sharedV := n.xn.Status()[0].SwapBytes-beforeSwap, n.xn.Sharing().SharedBytes-beforeShared

	timing := "take no modelled time"
	if c.timed {
		timing = "on the sim's **timed virtual GPU** each takes 5 us of modelled GPU time on the GPU's one compute " +
			"engine (the launch latency: no profile of this model's kernels on a real GPU exists, so the GPU time is " +
			"a uniform assumption, not a calibration), and copies hold their PCIe link for their modelled time"
	}
	var report strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&report, format, args...) }
	w("# The llm function through the shim (simulated node)\n\n")
	w("Written by `make bench-llm` (`go run ./test/llmbench %s`) at commit %s on %s.\n\n",
		strings.Join(os.Args[1:], " "), commit(), time.Now().UTC().Format(time.RFC3339))
	w("Conditions: **2-core dev VM, no GPU** (%d CPUs seen by Go, shared with other work; Go %s); the llm function "+
		"(functions/llm, %d layers of Qwen2.5-0.5B's shape, %.0f M parameters with the head tied to the embedding, "+
		"bfloat16, random weights from seed 500) driven by `test/gpu/llm_bench.py` through the real shim, remoting "+
		"server, executor and repository on a simulated H100 node in **dry kernel mode**: kernels are accepted, not "+
		"computed, and %s. Greedy completions of %d tokens (ignore_eos) of one fixed prompt, %d per measurement "+
		"after one warm-up, each inside a request (the executor binds GPU 0 and releases after; scratch is the "+
		"request's). Figures are means with their range over the runs.\n\n", runtime.NumCPU(), runtime.Version(),
		c.layers, float64(a.load.Params)/1e6, timing, c.tokens, c.runs)
	if c.timed {
		w("**What these figures are, and are not.** No GPU ran: the times are host work (Python, PyTorch's " +
			"dispatch, the shim's records, the gpuserver's handling) on a loaded 2-core VM plus the modelled GPU time " +
			"of a uniform 5 us per kernel. No native side ran (there is no trace of this model on a real GPU to model it " +
			"from); below, the modelled kernel time gives a bound on native's decode rate. The targets (TTFT <= 100 ms from the host image, decode >= 0.95x native with CUDA graphs) are " +
			"measured by the GPU suite, which has not run yet.\n\n")
	} else {
		w("**What these figures are, and are not.** No GPU ran: every time below is host work (Python, PyTorch's " +
			"dispatch, the shim's records, the gpuserver's handling) on a loaded 2-core VM, with zero GPU time, so " +
			"they bound the remoting overhead from above for this machine and say nothing about GPU time. There is no " +
			"native side here (no GPU to run natively on); the targets (TTFT <= 100 ms from the host image, decode " +
			">= 0.95x native with CUDA graphs) are measured by the GPU suite, which has not run yet.\n\n")
	}
	w("## Decode through the shim\n\n| mode | synchronize after a read | TTFT, warm (ms) | decode steps/s | " +
		"kernels launched per token | async records per token | sync round trips per token | synchronizations answered in " +
		"the shim per token | calls answered in the shim per token |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, m := range modes {
		for _, side := range []struct {
			how string
			m   *mode
		}{{"answered in the shim", m}, {"a round trip (`FAAS_GPU_REMOTING_LOCAL_SYNC=0`)", rtModes[i]}} {
			w("| %s | %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", side.m.name, side.how,
				stats(side.m.ttft).ms(), stats(side.m.tps).plain(), side.m.calls["kernels"], side.m.calls["async"],
				side.m.calls["sync"], side.m.calls["syncs_answered"], side.m.calls["local"])
		}
	}
	g, gr := stats(modes[1].tps), stats(rtModes[1].tps)
	stepPart := "all of it host time"
	if c.timed {
		stepPart = fmt.Sprintf("%.2f ms of it modelled GPU time", modes[0].calls["kernels"]*5e-3)
	}
	overlap := "overlap"
	if g.lo > gr.hi || gr.lo > g.hi {
		overlap = "do not overlap, though with this few runs under a load that changes, that is no proof"
	}
	w("\nThe two sides are two processes of the same function code and base weights on the same node, their runs "+
		"taking turns (one completion of one, then one of the other), so that both meet the machine's load; the "+
		"counts are exact, the rates vary with the load of the shared machine (see the ranges). The calls answered "+
		"in the shim are driver calls it answers from its own state, without a round trip (the CUDA runtime's "+
		"context-local storage lookups around its calls, context and attribute queries); the synchronizations "+
		"answered in the shim are among them. What the saved round trip is worth in time, this run does not "+
		"resolve: a round trip through the shim's ring costs about 1 us at the median when both sides spin and "+
		"up to about 100 us when one has gone to sleep on this loaded VM (docs/bench/remoting.md, "+
		"docs/bench/tenants.md), against a decode step with graphs of %.2f ms here (%s; from the mean rate "+
		"with the synchronize answered in the shim); the two sides' rates with graphs differ by %+.1f%% in the mean "+
		"and their ranges %s. On a GPU it is one synchronous wait per token less, measured by the GPU suite "+
		"only as a whole (shim/native). The same %d tokens came out eagerly and with graphs: %v (dry kernels compute nothing, so this "+
		"shows that the replayed graph does the same copies and memsets as the eager step, not that the tokens are "+
		"right; the GPU suite compares them with a native run). With graphs a decode step is one record (the graph "+
		"launch) and the token read back: a copy, whose answer is the one round trip, and a synchronize, which the "+
		"shim answers itself because nothing was sent after the copy (a graph's replay launches no kernel one by "+
		"one: its kernels are the eager step's).\n\n", 1e3/g.mean, stepPart, 100*(g.mean/gr.mean-1), overlap,
		c.tokens, sameTokens)
	if c.timed {
		kernels := modes[0].calls["kernels"]
		step := kernels * 5e-6
		w("**Against native, on the timed virtual GPU.** An eager decode step launches %.0f kernels, and the "+
			"captured graph replays the same ones: %.2f ms of modelled GPU time per token at 5 us each. A native "+
			"decode with graphs on this modelled GPU can go no faster than that GPU time alone, %.0f steps/s (it "+
			"too reads each token back and decides on the host before the next replay, so host time adds to it). "+
			"Under this assumption the shim's rate with graphs is at least this fraction of native (mean, and "+
			"range over the runs), the host time of this loaded 2-core VM included:\n\n"+
			"| synchronize after a read | steps/s with graphs | at least x native |\n|---|---|---|\n",
			kernels, 1e3*step, 1/step)
		for _, side := range []struct {
			how string
			m   *mode
		}{{"answered in the shim", modes[1]}, {"a round trip", rtModes[1]}} {
			st := stats(side.m.tps)
			w("| %s | %s | %.3f (%.3f-%.3f) |\n", side.how, st.plain(), st.mean*step, st.lo*step, st.hi*step)
		}
		w("\nTarget: >= 0.95 x native with CUDA graphs. This is a bound from a uniform kernel time of 5 us, not a " +
			"measurement of native (the real kernels of this model take other times: shorter ones make the shim's " +
			"share of a step larger, longer ones smaller; and the host of a GPU machine is faster than this VM): the GPU suite measures both sides " +
			"on a GPU.\n\n")
	}
	w("## Time to first token from the host image (cold)\n\n| | ms | bytes copied to the GPU |\n|---|---|---|\n")
	w("| model evicted, then acquire (swap-in from the host image) + prefill + first token + release | %s | %.0f MB |\n",
		stats(cold).ms(), stats(coldSwap).mean/1e6)
	w("| warm (resident), eager | %s | 0 |\n", stats(modes[0].ttft).ms())
	w("| native load (build on the CPU, move to the GPU) in the function process, for scale | %.1f | - |\n\n",
		1e3*a.load.S)
	link := "The sim copies the image in host memory with no modelled link time"
	if c.timed {
		link = "The timed sim holds the host-to-GPU link for the copy's modelled time, and copies the image in host " +
			"memory besides"
	}
	w("%s; on a GPU the swap-in of %.0f MB at the 41 GB/s measured on an H100 (docs/bench/swap-cuda.md) takes about "+
		"%.0f ms, pipelined with the prefill.\n\n", link, stats(coldSwap).mean/1e6, stats(coldSwap).mean/41e9*1e3)

	model := float64(variantImage)
	w("## Sharing one base between variants\n\n"+
		"**What a variant is.** The base is the model above (its output head tied to the embedding, as "+
		"Qwen2.5-0.5B's). A variant is the base plus a LoRA adapter of its own (`LLM_ADAPTER_SEED`): rank 8 on the "+
		"query and value projections of every layer (PEFT's default targets for Qwen2, alpha = rank), kept unmerged "+
		"(W x + B (A x)), so the base's weights are the same bytes in every variant; 0.54 M parameters, 1.1 MB. "+
		"The function places the adapter in a 2 MiB chunk of its own after the base's, so each variant's image is "+
		"the base's chunks plus one chunk. The adapter's weights are random, like the base's: the variants answer "+
		"differently, not usefully. Unmerged, the adapter costs every decode step 6 kernels per layer (144 launches "+
		"per token eagerly, about 12%% more; nothing more with CUDA graphs, where the step is one record). Before "+
		"commit 2eab1cc variants differed in a whole output head (8,192 x 896, 2.2%% of the model), and 16 of them "+
		"took 1.34 times one model's host memory (computed from two deployed, not measured with 16).\n\n"+
		"**Measured**, each variant a process of the llm function deployed at once on the node (%d of them, started "+
		"one after the other, each evicted from the GPU after its first request), beside the base llm-a (no "+
		"adapter: its image, %.1f MB, is the base's chunks): one variant's image is %.1f MB, and each variant added "+
		"%.2f MB of host memory on average (its own chunks). The repository's host memory, llm-a's image included:"+
		"\n\n", c.variants, float64(imageA.HostBytes)/1e6, model/1e6,
		float64(points[len(points)-1].st.HostBytes-imageA.HostBytes)/float64(c.variants)/1e6)
	w("| variants | host memory without sharing (MB) | with sharing (MB) | ratio to one variant's image | saved (MB) |\n" +
		"|---|---|---|---|---|\n")
	for _, pt := range points {
		host := float64(pt.st.HostBytes)
		w("| %d | %.0f | %.0f | %.3f | %.0f |\n", pt.variants, float64(pt.variants)*model/1e6, host/1e6, host/model,
			(float64(pt.variants)*model-host)/1e6)
	}
	w("\nWith llm-a (the base) resident on GPU 0, the first variant's swap-in copied %.1f MB and mapped %.1f MB of "+
		"chunks already there (without sharing it would copy its whole %.1f MB image). GPU memory follows the same "+
		"arithmetic while variants are resident on one GPU: on the simulated GPU, which faults a copy or a kernel "+
		"that writes a shared chunk; on the real driver the GPU suite checks that shared chunks map and read back "+
		"and what a swap-in copies, not that writes into them fault (TestCUDAVariantSwapInMovesOnlyItsOwnChunks, "+
		"not run yet). The host memory measured is the repository's shared "+
		"memory (its images). Each variant's own process (Python, PyTorch, the CUDA libraries, the tokenizer) is "+
		"not in it: a variant is a function with its own process, which took %s MB of anonymous memory (its own) "+
		"and %s MB of proportional set size (the libraries' pages divided among the %d processes that map them) "+
		"with %d variants running.\n", float64(swapV)/1e6, float64(sharedV)/1e6, model/1e6, stats(anon).plain(),
		stats(pss).plain(), c.variants+1, c.variants)
	if err := os.WriteFile(c.out, []byte(report.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(report.String())
	if !sameTokens {
		return errors.New("eager and graph tokens differ")
	}
	return nil
}

// commit names the commit of the working tree the bench ran from, and says when the code differed from it (the
// reports under docs/bench do not count: the bench writes them).
func commit() string {
	head, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(head))
	dirty, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ".",
		":(exclude)docs/bench").Output()
	if err != nil || len(bytes.TrimSpace(dirty)) > 0 {
		c += " with uncommitted changes"
	}
	return c
}

func variantName(i int) string { return fmt.Sprintf("llm-v%d", i) }

// memoryMB is process pid's memory from /proc/PID/smaps_rollup in MB, by field (Pss, Anonymous, ...).
func memoryMB(pid int) (map[string]float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		var kb float64
		if ok && strings.HasSuffix(v, " kB") {
			if _, err := fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb); err == nil {
				m[k] = kb * 1024 / 1e6
			}
		}
	}
	if _, ok := m["Pss"]; !ok {
		return nil, errors.New("no Pss line")
	}
	return m, nil
}

// mode is one way of decoding (eager or with CUDA graphs) as measured.
type mode struct {
	name   string
	graphs bool
	ttft   []float64
	tps    []float64
	calls  map[string]float64
	tokens []int
	gerr   string
}

// side is one process of a function whose decoding is measured.
type side struct {
	p  *proc
	fn string
}

// decodeModes measures each side decoding eagerly and with CUDA graphs: one warm-up completion per side (the graph
// is captured in the first with graphs), then c.runs timed ones, the sides taking turns so that they meet the same
// load; calls per token from a 2-token and a c.tokens completion, so that the prompt's cost cancels. It returns the
// modes of each side.
func decodeModes(ctx context.Context, n *node, sides []side, c config) ([][]*mode, error) {
	out := make([][]*mode, len(sides))
	for i := range sides {
		out[i] = []*mode{{name: "eager"}, {name: "CUDA graphs", graphs: true}}
	}
	for k := range 2 {
		shorts := make([]reply, len(sides))
		shortKernels := make([]uint64, len(sides))
		for i, sd := range sides {
			graphs := out[i][k].graphs
			if _, err := n.request(ctx, sd.fn, func() error {
				var err error
				if _, err = sd.p.complete(c.tokens, graphs); err == nil {
					before := n.dev.DryLaunches()
					shorts[i], err = sd.p.complete(2, graphs)
					shortKernels[i] = n.dev.DryLaunches() - before
				}
				return err
			}); err != nil {
				return nil, err
			}
		}
		for range c.runs {
			for i, sd := range sides {
				m := out[i][k]
				var r reply
				var kernels uint64
				if _, err := n.request(ctx, sd.fn, func() error {
					var err error
					before := n.dev.DryLaunches()
					r, err = sd.p.complete(c.tokens, m.graphs)
					kernels = n.dev.DryLaunches() - before
					return err
				}); err != nil {
					return nil, err
				}
				m.ttft = append(m.ttft, r.TTFT)
				m.tps = append(m.tps, r.PerSecond)
				m.tokens, m.gerr = r.Tokens, r.GraphErr
				m.calls = map[string]float64{}
				for key, v := range r.Stats {
					m.calls[key] = (v - shorts[i].Stats[key]) / float64(c.tokens-2)
				}
				// Kernels launched one by one (a graph's replay counts none: its kernels are the eager step's).
				m.calls["kernels"] = (float64(kernels) - float64(shortKernels[i])) / float64(c.tokens-2)
				if m.graphs && !r.Graphs {
					return nil, fmt.Errorf("%s: the decode step was not captured: %s", sd.fn, r.GraphErr)
				}
			}
		}
	}
	return out, nil
}
