// Command replay is the replay bench (docs/design.md, decision 8): recorded forward passes (the replay traces of
// shim/testdata/trace) driven through the real shim, the real transport and a real gpuserver whose device is the
// timed simulated GPU, at the recorded issue rate, beside the native pass computed from the same trace. It writes
// the shim/native p50 per pass, what the pass spent where (client issue, GPU, the synchronize's overshoot, the
// server's time per record), the session's sleeps during the bound pass and the client's CPU in the shim against
// the native driver's, with the conditions it ran under.
//
//	go run ./test/bench/replay -out docs/bench/remoting-replay.md     (make bench-remoting)
//
// The client is shim/build/replay (shim/test/replay.c), linked against the shim: per call of the trace it spins
// for the recorded gap, makes the recorded number of driver calls the shim answers locally, then the remoted call
// (a launch of busy(gpu_ns), whose record has the recorded size; a memset; the final synchronize). Every pass runs
// in a request (acquire before, release after), as through the gpu-python template.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/nvml"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/internal/benchhost"
	"github.com/faas-gpu/faas-gpu/test/bench/replay/trace"
)

type config struct {
	traces, only, out, jsonOut, bin, ptx, node, note, device, driverDir string
	passes, warmup, repeat                                              int
	pin                                                                 bool
	nice                                                                int
	maxLoad                                                             float64
	force                                                               bool
	launchCPU                                                           time.Duration
	// set by run: the load when the run started, and the report's label of a forced loaded run
	loadStart, loadLabel string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		var code exitCode
		if errors.As(err, &code) { // the bench re-executed in its own session said why
			os.Exit(int(code))
		}
		fmt.Fprintln(os.Stderr, "replay:", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

func run(ctx context.Context, args []string, log io.Writer) error {
	var c config
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.StringVar(&c.traces, "traces", "shim/testdata/trace", "directory of replay-<model>-b<batch>.tsv traces")
	fs.StringVar(&c.only, "only", "", "replay only these traces (comma-separated, e.g. resnet152-b1,bert-base-b8)")
	fs.StringVar(&c.out, "out", "docs/bench/remoting-replay.md", "Markdown report to write")
	fs.StringVar(&c.jsonOut, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&c.bin, "client", "shim/build/replay", "the replay client (make -C shim)")
	fs.StringVar(&c.ptx, "ptx", "gpuserver/device/sim/kernels/kernels.ptx", "the module holding busy")
	fs.StringVar(&c.node, "node", "h100x8", "simulated node (topology preset or file)")
	fs.StringVar(&c.device, "device", "sim", "sim: the timed simulated GPU; cuda: this machine's GPU (the client "+
		"then also replays natively, against the real driver)")
	fs.StringVar(&c.driverDir, "driver-dir", "", "cuda: the directory of the real libcuda.so.1 for the native "+
		"replay (found with ldconfig when empty)")
	fs.StringVar(&c.note, "note", "", "a line for the report saying what this run is")
	fs.IntVar(&c.passes, "passes", 200, "timed passes per trace")
	fs.IntVar(&c.warmup, "warmup", 10, "passes before the timed ones")
	fs.BoolVar(&c.pin, "pin", runtime.NumCPU() >= 2, "pin the client to CPU 0 and this process (the gpuserver) to "+
		"CPU 1, as on a GPU host they run on cores of their own (default where there are two CPUs)")
	fs.IntVar(&c.repeat, "repeat", 3, "runs of every trace (figures are means over runs, with their range)")
	fs.IntVar(&c.nice, "nice", -15, "run the bench and its client at this nice, in a session (autogroup) of their "+
		"own with that nice; below 0 needs root or CAP_SYS_NICE; 0 keeps the inherited priority")
	fs.Float64Var(&c.maxLoad, "max-load", float64(runtime.NumCPU()), "refuse to run when the 1-minute load "+
		"average is above this (default: the CPU count; 0: no check)")
	fs.BoolVar(&c.force, "force", false, "run above -max-load; the report is then labelled as a loaded run")
	fs.DurationVar(&c.launchCPU, "server-launch-cpu", 2500*time.Nanosecond, "sim: the driver CPU the gpuserver's "+
		"thread spends per launch (sim.Options.LaunchCPU); the default is the traces' native_call_ns, an "+
		"assumption (the H100's per-pass CPU divided up, not measured per call) until the GPU suite measures it")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if c.passes < 1 || c.warmup < 0 || c.repeat < 1 {
		return usageError{errors.New("-passes and -repeat must be >= 1, -warmup >= 0")}
	}
	if c.nice < -20 || c.nice > 19 || c.launchCPU < 0 {
		return usageError{errors.New("-nice must be in [-20, 19], -server-launch-cpu >= 0")}
	}
	if c.nice != 0 {
		if handled, err := ownSession(ctx, args, os.Stdout, log); handled {
			return err
		}
		if err := setNice(c.nice); err != nil {
			return err
		}
	}
	l, err := readLoad()
	if err != nil {
		return err
	}
	c.loadStart = l.Line
	if c.loadLabel, err = checkLoad(l, c.maxLoad, c.force); err != nil {
		return err
	}
	if c.loadLabel != "" {
		fmt.Fprintln(log, "replay:", c.loadLabel)
	}
	paths, err := filepath.Glob(filepath.Join(c.traces, "replay-*.tsv"))
	if err != nil || len(paths) == 0 {
		return usageError{fmt.Errorf("-traces: no replay-*.tsv in %s", c.traces)}
	}
	var traces []*trace.Trace
	for _, p := range paths {
		if c.only != "" && !slices.Contains(strings.Split(c.only, ","),
			strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "replay-"), ".tsv")) {
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		t, err := trace.Parse(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		traces = append(traces, t)
	}
	if len(traces) == 0 {
		return usageError{fmt.Errorf("-only: no trace %s in %s", c.only, c.traces)}
	}
	slices.SortFunc(traces, func(a, b *trace.Trace) int {
		if a.Model != b.Model {
			return -strings.Compare(a.Model, b.Model) // resnet152 first, as in the GPU report
		}
		return a.Batch - b.Batch
	})
	for _, p := range []*string{&c.bin, &c.ptx} {
		if _, err := os.Stat(*p); err != nil {
			return usageError{fmt.Errorf("%w (build the shim: make -C shim)", err)}
		}
	}
	if c.pin {
		if err := pinProcess(1); err != nil {
			return fmt.Errorf("-pin: %w", err)
		}
	}
	var (
		node topology.Node
		dev  device.Backend
		gpu  endOfWork
	)
	switch c.device {
	case "sim":
		if node, err = topology.Resolve(c.node); err != nil {
			return usageError{fmt.Errorf("-node: %w", err)}
		}
		b, err := sim.New(sim.Options{Node: node, TimeScale: 1, LaunchCPU: c.launchCPU})
		if err != nil {
			return err
		}
		dev, gpu = b, b
	case "cuda":
		if node, err = nvml.Discover(gonvml.New(), "local"); err != nil {
			return fmt.Errorf("NVML discovery: %w", err)
		}
		if dev, err = cuda.Open(""); err != nil {
			return err
		}
		if c.driverDir == "" {
			if c.driverDir, err = driverDir(); err != nil {
				return usageError{fmt.Errorf("-driver-dir: %w", err)}
			}
		}
	default:
		return usageError{fmt.Errorf("-device: %q is neither sim nor cuda", c.device)}
	}
	dir, err := os.MkdirTemp("", "replay-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	repo, err := os.MkdirTemp(benchhost.ShmDir(), "replay-bench-repo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(repo)
	srv, err := server.Start(ctx, server.Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: repo, Device: dev,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	runs := make([][]result, len(traces))
	for i := range c.repeat {
		for j, t := range traces {
			r, err := replay(ctx, c, srv, gpu, t, log)
			if err != nil {
				return fmt.Errorf("%s: %w", t.Name(), err)
			}
			runs[j] = append(runs[j], r)
			fmt.Fprintf(log, "run %d %s: shim p50 %s ms, native run %s ms (computed %s), ratio %.3f (computed %.3f, "+
				"against the H100 native %.3f), sleeps per pass %.2f\n", i+1, t.Name(), trace.Ms(r.ShimP50),
				trace.Ms(r.NativeRunP50), trace.Ms(r.NativeP50), r.Ratio, r.RatioComputed, r.RatioFixed, r.SleepsPerPass)
		}
	}
	var results []result
	for _, rs := range runs {
		results = append(results, mean(rs))
	}
	md := report(c, node, results, args)
	if err := os.MkdirAll(filepath.Dir(c.out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(c.out, []byte(md), 0o644); err != nil {
		return err
	}
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// result is one trace's figures.
type result struct {
	Model string `json:"model"`
	Batch int    `json:"batch"`
	// the H100's figures the trace was calibrated against (0: unknown)
	RefNativeP50 time.Duration `json:"ref_native_p50_ns"`
	RefShimP50   time.Duration `json:"ref_shim_p50_ns"`
	// through the shim, measured
	ShimP50, ShimP99   time.Duration
	ShimP10            time.Duration // the best tenth of passes: what the mechanism gives when this machine's other work leaves it alone
	Issue              time.Duration // p50 of the client's time to the synchronize's call
	GPU                time.Duration // the trace's GPU time per pass
	Overshoot          time.Duration // p50 of the synchronize's return after max(its call, the GPU's end)
	ServerPerRecord    time.Duration // the sessions' time executing async records, per async record
	SleepsPerPass      float64       // the session's sleeps between acquire and release
	BoundSleepsPerPass float64       // of which while its function held the binding
	BoundPollPerPass   time.Duration // the session's polling of an empty ring while bound, per pass
	LatePerPass        float64       // async records that waited for the synchronize, per pass
	Records            float64       // per pass
	ShimClient         time.Duration // p50 of the client's time inside the shim (remoted and local calls)
	ShimRemoted        time.Duration // of which inside remoted calls
	ShimLocal          time.Duration // of which inside local calls
	ClientCPU          time.Duration // p50 of the client process's CPU per pass (its gaps are spun, so ~ the pass)
	RecordMismatch     int           // calls whose record differs from the trace's (kind or size)
	// native, computed from the trace
	NativeP50    time.Duration
	NativeIssue  time.Duration
	NativeDriver time.Duration // the native driver's CPU per pass (local and remoted calls)
	// MeasuredNativeP50 is the trace replayed natively on a real GPU (-device cuda; 0 on the sim): the ratio is
	// then taken against it.
	MeasuredNativeP50 time.Duration `json:",omitempty"`
	// On a real GPU, the native replay's time inside the real driver's entry points on the issuing thread, per
	// call kind (p50 over the passes, divided by the pass's calls of that kind): what native_call_ns and
	// native_local_ns assume; and the native client process's CPU per pass.
	MeasuredNativeCall  time.Duration `json:",omitempty"`
	MeasuredNativeLocal time.Duration `json:",omitempty"`
	MeasuredNativeCPU   time.Duration `json:",omitempty"`
	MeasuredNativeP99   time.Duration `json:",omitempty"`
	// NativeRunP50 is the native model of the trace run on this machine between the shim's passes (the client
	// spinning the trace's native costs): the native side under the same load as the shim's.
	NativeRunP50  time.Duration
	Ratio         float64 // shim p50 / native run p50 (on a GPU: / measured native p50)
	RatioComputed float64 // shim p50 / native computed
	RatioFixed    float64 `json:",omitempty"` // shim p50 / the H100's measured native p50 (RefNativeP50)
	// over the runs: the range of the shim p50 and of the ratio, and the runs' figures
	ShimP50Min, ShimP50Max time.Duration
	RatioMin, RatioMax     float64
	Runs                   []result `json:",omitempty"`
}

// mean averages the runs of one trace (every figure), keeping the range of the p50 and of the ratio.
func mean(rs []result) result {
	m := rs[0]
	avg := func(f func(r result) float64) float64 {
		var s float64
		for _, r := range rs {
			s += f(r)
		}
		return s / float64(len(rs))
	}
	d := func(f func(r result) time.Duration) time.Duration {
		return time.Duration(avg(func(r result) float64 { return float64(f(r)) }))
	}
	m.ShimP50, m.ShimP99 = d(func(r result) time.Duration { return r.ShimP50 }), d(func(r result) time.Duration { return r.ShimP99 })
	m.ShimP10 = d(func(r result) time.Duration { return r.ShimP10 })
	m.MeasuredNativeP50 = d(func(r result) time.Duration { return r.MeasuredNativeP50 })
	m.MeasuredNativeP99 = d(func(r result) time.Duration { return r.MeasuredNativeP99 })
	m.MeasuredNativeCall = d(func(r result) time.Duration { return r.MeasuredNativeCall })
	m.MeasuredNativeLocal = d(func(r result) time.Duration { return r.MeasuredNativeLocal })
	m.MeasuredNativeCPU = d(func(r result) time.Duration { return r.MeasuredNativeCPU })
	m.Issue, m.Overshoot = d(func(r result) time.Duration { return r.Issue }), d(func(r result) time.Duration { return r.Overshoot })
	m.ServerPerRecord = d(func(r result) time.Duration { return r.ServerPerRecord })
	m.ShimClient, m.ShimRemoted = d(func(r result) time.Duration { return r.ShimClient }), d(func(r result) time.Duration { return r.ShimRemoted })
	m.ShimLocal, m.ClientCPU = d(func(r result) time.Duration { return r.ShimLocal }), d(func(r result) time.Duration { return r.ClientCPU })
	m.SleepsPerPass = avg(func(r result) float64 { return r.SleepsPerPass })
	m.BoundSleepsPerPass = avg(func(r result) float64 { return r.BoundSleepsPerPass })
	m.BoundPollPerPass = d(func(r result) time.Duration { return r.BoundPollPerPass })
	m.LatePerPass = avg(func(r result) float64 { return r.LatePerPass })
	m.Records = avg(func(r result) float64 { return r.Records })
	m.Ratio = avg(func(r result) float64 { return r.Ratio })
	m.RatioComputed = avg(func(r result) float64 { return r.RatioComputed })
	m.RatioFixed = avg(func(r result) float64 { return r.RatioFixed })
	m.NativeRunP50 = d(func(r result) time.Duration { return r.NativeRunP50 })
	m.ShimP50Min, m.ShimP50Max, m.RatioMin, m.RatioMax = rs[0].ShimP50, rs[0].ShimP50, rs[0].Ratio, rs[0].Ratio
	for _, r := range rs {
		m.ShimP50Min, m.ShimP50Max = min(m.ShimP50Min, r.ShimP50), max(m.ShimP50Max, r.ShimP50)
		m.RatioMin, m.RatioMax = min(m.RatioMin, r.Ratio), max(m.RatioMax, r.Ratio)
		m.RecordMismatch = max(m.RecordMismatch, r.RecordMismatch)
	}
	m.Runs = rs
	return m
}

type passLine struct {
	wall, issue, remoted, local, cpu time.Duration
	start                            int64 // CLOCK_MONOTONIC ns
}

// startClient starts the replay client and waits for it to say it is ready on the driver it expects (shim or
// native).
func startClient(ctx context.Context, bin string, args, env []string, want string, pin bool) (*client, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	cl := &client{cmd: cmd, in: in, out: bufio.NewReader(outp), stderr: &stderr}
	if pin {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(cmd.Process.Pid, &set); err != nil {
			cl.quit()
			return nil, fmt.Errorf("pin the client to CPU 0: %w", err)
		}
	}
	if s, err := cl.out.ReadString('\n'); err != nil || strings.TrimSpace(s) != "ready "+want {
		cl.quit()
		return nil, fmt.Errorf("client did not start on the %s driver (%q, %v): %s", want, s, err, stderr.String())
	}
	return cl, nil
}

func (cl *client) quit() {
	_, _ = io.WriteString(cl.in, "quit\n")
	_ = cl.in.Close()
	_ = cl.cmd.Wait()
}

type client struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *strings.Builder
}

func (cl *client) do(line string) (string, error) {
	if _, err := io.WriteString(cl.in, line+"\n"); err != nil {
		return "", fmt.Errorf("%w: %s", err, cl.stderr.String())
	}
	s, err := cl.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("client: %w: %s", err, cl.stderr.String())
	}
	return strings.TrimSpace(s), nil
}

func (cl *client) pass() (passLine, error) { return cl.run("pass") }

// model runs one pass of the native model in the client (no driver: the trace's native costs spun in real time).
func (cl *client) model() (passLine, error) { return cl.run("model") }

func (cl *client) run(cmd string) (passLine, error) {
	s, err := cl.do(cmd)
	if err != nil {
		return passLine{}, err
	}
	f := strings.Fields(s)
	if len(f) != 7 || f[0] != "pass" {
		return passLine{}, fmt.Errorf("client answered %q", s)
	}
	var v [6]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return passLine{}, fmt.Errorf("client answered %q", s)
		}
	}
	p := passLine{wall: time.Duration(v[0]), issue: time.Duration(v[1]), remoted: time.Duration(v[2]),
		local: time.Duration(v[3]), cpu: time.Duration(v[4]), start: v[5]}
	return p, nil
}

// monoNow is CLOCK_MONOTONIC in ns (the client's clock).
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// endOfWork is the timed sim's end of the modelled GPU work (nil on a real GPU: no overshoot is measured).
type endOfWork interface{ ComputeEnd(gpu int) time.Time }

func replay(ctx context.Context, c config, srv *server.Server, dev endOfWork, t *trace.Trace,
	log io.Writer) (result, error) {
	name := fmt.Sprintf("replay-%s-b%d", t.Model, t.Batch)
	if err := srv.Pool().Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 1 << 30}); err != nil {
		return result{}, err
	}
	tf, err := os.CreateTemp("", "replay-trace-*.tsv")
	if err != nil {
		return result{}, err
	}
	defer os.Remove(tf.Name())
	if err := t.Write(tf); err != nil {
		return result{}, err
	}
	tf.Close()
	cl, err := startClient(ctx, c.bin, []string{tf.Name(), c.ptx}, []string{
		"FAAS_GPU_REMOTING_SOCKET=" + srv.RemotingSocket(), "FAAS_GPU_FUNCTION=" + name,
		"FAAS_GPU_TOKEN=" + srv.Token(name)}, "shim", c.pin)
	if err != nil {
		return result{}, err
	}
	defer func() { // the client hangs up before its function goes
		cl.quit()
		if err := srv.Pool().Deregister(context.WithoutCancel(ctx), name); err != nil {
			fmt.Fprintf(log, "%s: deregister: %v\n", name, err)
		}
	}()
	gauge := func(metric string) float64 { return counter(srv.Metrics(), metric) }
	request := func(f func(gpu int) error) error {
		b, err := srv.Pool().Acquire(ctx, name)
		if err != nil {
			return err
		}
		err = f(b.GPU)
		return errors.Join(err, srv.Pool().Release(ctx, b.ID))
	}
	onePass := func(int) error { _, err := cl.pass(); return err }
	for range 1 + c.warmup { // the first request ends the initialisation (captures the model image)
		if err := request(onePass); err != nil {
			return result{}, err
		}
	}
	// one pass with the shim's call log: the records must be the trace's
	logPath := filepath.Join(os.TempDir(), name+"-calllog.tsv")
	defer os.Remove(logPath)
	if s, err := cl.do("log " + logPath); err != nil || s != "log ok" {
		return result{}, fmt.Errorf("call log: %q %v", s, err)
	}
	if err := request(onePass); err != nil {
		return result{}, err
	}
	mismatch, err := compareLog(logPath, t)
	if err != nil {
		return result{}, err
	}
	var walls, issues, overs, shimc, rem, loc, cpus, models []time.Duration
	late0, records0, busy0 := gauge("faas_gpu_remoting_late_records_total"),
		gauge("faas_gpu_remoting_records_total"),
		gauge("faas_gpu_remoting_record_seconds_total")
	var sleeps, boundSleeps float64
	var boundPoll time.Duration
	for i := range c.passes {
		if ctx.Err() != nil {
			return result{}, ctx.Err()
		}
		err := request(func(gpu int) error {
			s0 := srv.RemotingStats() // a few counters: the session must not wait for the bench's own work
			p, err := cl.pass()
			if err != nil {
				return err
			}
			s1 := srv.RemotingStats()
			sleeps += float64(s1.Sleeps - s0.Sleeps)
			boundPoll += s1.BoundPoll - s0.BoundPoll
			boundSleeps += float64(s1.BoundSleeps - s0.BoundSleeps)
			if dev != nil {
				// the GPU's end in the client's clock: the sim's modelled end, placed relative to now
				gpuEnd := monoNow() + int64(time.Until(dev.ComputeEnd(gpu)))
				end, syncCall := p.start+int64(p.wall), p.start+int64(p.issue)
				overs = append(overs, max(time.Duration(end-max(gpuEnd, syncCall)), 0))
			}
			walls, issues = append(walls, p.wall), append(issues, p.issue)
			shimc, rem, loc = append(shimc, p.remoted+p.local), append(rem, p.remoted), append(loc, p.local)
			cpus = append(cpus, p.cpu)
			return nil
		})
		if err != nil {
			return result{}, fmt.Errorf("pass %d: %w", i, err)
		}
		// the native pass of the same trace, run next on the same machine (between the shim's passes, so that
		// both meet the same load)
		m, err := cl.model()
		if err != nil {
			return result{}, fmt.Errorf("native model pass %d: %w", i, err)
		}
		models = append(models, m.wall)
	}
	n := float64(c.passes)
	records := (gauge("faas_gpu_remoting_records_total") - records0) / n
	busy := (gauge("faas_gpu_remoting_record_seconds_total") - busy0) / n
	tot := t.Totals()
	native, nativeIssue, _ := t.Native()
	remoted := 0
	for _, cl := range t.Calls {
		if cl.Kind != trace.Sync {
			remoted++
		}
	}
	r := result{Model: t.Model, Batch: t.Batch, RefNativeP50: t.NativeP50, RefShimP50: t.ShimP50,
		ShimP50: p(walls, 50), ShimP99: p(walls, 99), ShimP10: p(walls, 10), Issue: p(issues, 50), GPU: tot.GPU,
		Overshoot:       p(overs, 50),
		ServerPerRecord: time.Duration(busy / math.Max(records-1, 1) * 1e9),
		SleepsPerPass:   sleeps / n, BoundSleepsPerPass: boundSleeps / n,
		BoundPollPerPass: boundPoll / time.Duration(c.passes), LatePerPass: (gauge("faas_gpu_remoting_late_records_total") - late0) / n,
		Records: records, ShimClient: p(shimc, 50), ShimRemoted: p(rem, 50), ShimLocal: p(loc, 50),
		ClientCPU: p(cpus, 50), RecordMismatch: mismatch, NativeP50: native, NativeIssue: nativeIssue,
		NativeDriver: time.Duration(tot.Local)*t.NativeLocal + time.Duration(remoted)*t.NativeCall}
	r.NativeRunP50 = p(models, 50)
	r.Ratio = float64(r.ShimP50) / float64(r.NativeRunP50)
	r.RatioComputed = float64(r.ShimP50) / float64(r.NativeP50)
	if r.RefNativeP50 > 0 {
		r.RatioFixed = float64(r.ShimP50) / float64(r.RefNativeP50)
	}
	if c.device == "cuda" { // the same trace natively on the same GPU
		nat, err := startClient(ctx, c.bin, []string{tf.Name(), c.ptx}, []string{"LD_LIBRARY_PATH=" + c.driverDir},
			"native", c.pin)
		if err != nil {
			return result{}, fmt.Errorf("native replay: %w", err)
		}
		defer nat.quit()
		var nw, nrem, nloc, ncpu []time.Duration
		for i := range c.warmup + c.passes {
			p, err := nat.pass()
			if err != nil {
				return result{}, fmt.Errorf("native replay: %w", err)
			}
			if i >= c.warmup {
				nw, nrem, nloc, ncpu = append(nw, p.wall), append(nrem, p.remoted), append(nloc, p.local),
					append(ncpu, p.cpu)
			}
		}
		r.MeasuredNativeP50, r.MeasuredNativeP99 = p(nw, 50), p(nw, 99)
		r.MeasuredNativeCall = p(nrem, 50) / time.Duration(max(remoted, 1))
		r.MeasuredNativeLocal = p(nloc, 50) / time.Duration(max(tot.Local, 1))
		r.MeasuredNativeCPU = p(ncpu, 50)
		r.Ratio = float64(r.ShimP50) / float64(r.MeasuredNativeP50)
	}
	return r, nil
}

// compareLog counts the calls of the client's call log whose kind or record size differ from the trace's.
func compareLog(path string, t *trace.Trace) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("call log: %w", err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	// the log also holds the setup's calls of the first pass only when logged then; here: one pass
	if len(lines) != len(t.Calls) {
		return len(t.Calls), fmt.Errorf("call log: %d calls, the trace has %d", len(lines), len(t.Calls))
	}
	bad := 0
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 6 || f[2] != t.Calls[i].Kind || f[3] != strconv.Itoa(t.Calls[i].RecordBytes) {
			bad++
		}
	}
	return bad, nil
}

func p(d []time.Duration, pct int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(float64(pct)/100*float64(len(s)))) - 1
	return s[max(i, 0)]
}

func counter(g prometheus.Gatherer, name string) float64 {
	families, err := g.Gather()
	if err != nil {
		return 0
	}
	var v float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// pinProcess pins every thread of this process (and so the threads it starts later) to CPU cpu, and runs its
// goroutines on one thread at a time (GOMAXPROCS 1: the runtime sized it from the CPUs it had at start), so that
// its threads do not take the CPU from each other.
func pinProcess(cpu int) error {
	runtime.GOMAXPROCS(1)
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	return nil
}

// driverDir finds the directory of the real libcuda.so.1 (ldconfig's cache).
func driverDir() (string, error) {
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		return "", fmt.Errorf("ldconfig -p: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if _, path, ok := strings.Cut(l, "=> "); ok && strings.HasPrefix(strings.TrimSpace(l), "libcuda.so.1 ") {
			return filepath.Dir(strings.TrimSpace(path)), nil
		}
	}
	return "", errors.New("no libcuda.so.1 in ldconfig's cache")
}

func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 2, 64) }

func report(c config, node topology.Node, rs []result, args []string) string {
	var b strings.Builder
	title, devDesc := "the timed virtual GPU", fmt.Sprintf("the simulated node %s in its timed mode (one compute "+
		"engine per GPU, modelled time on the wall clock)", node.Name)
	if c.device == "cuda" {
		title = "a GPU"
		devDesc = fmt.Sprintf("**%s** (cuda backend; each trace also replayed natively against the real driver in "+
			"%s, the ratio taken against that)", node.GPUs[0].Name, c.driverDir)
	}
	fmt.Fprintf(&b, "# Replay bench: recorded passes through the shim on %s\n\n", title)
	fmt.Fprintf(&b, "Written by `make bench-remoting` (`go run ./test/bench/replay %s`) on %s, tree %s.\n\n",
		strings.Join(args, " "), time.Now().UTC().Format(time.RFC3339), commit())
	if c.note != "" {
		fmt.Fprintf(&b, "%s\n\n", c.note)
	}
	if c.loadLabel != "" {
		fmt.Fprintf(&b, "%s\n\n", c.loadLabel)
	}
	if c.device == "sim" {
		fmt.Fprintf(&b, "> **What these figures are.** Timed-virtual-GPU figures, not GPU measurements. Per pass the "+
			"trace has 4 H100 inputs (native p50, shim p50, native and shim client CPU) and the bench derives or fits "+
			"4 quantities from them (the GPU time, fitted so that the old shim's model hits the H100 shim p50; the "+
			"client's gaps, from the shim's CPU; native_local_ns, solved so that the native pass equals the H100 "+
			"native p50; native_call_ns = 2.5 us, assumed): 16 inputs, 16 fitted or derived, **0 degrees of freedom "+
			"left, nothing held out**. *Native, run* and *computed* reproduce the H100 native p50 by construction; "+
			"*shim/H100 native* divides by the H100's measured native p50 instead. The server's driver CPU per "+
			"launch is %v (-server-launch-cpu, an assumption until the GPU suite measures it). It cannot see: the "+
			"real driver's per-call costs (one constant per call kind, solved per pass: 34-401 ns for the same "+
			"getters), the mix of short and long kernels (every launch of a pass has the same length), doorbells "+
			"and kernel start latency, the real synchronize, Python competing with a polling session for a core, "+
			"copies, NUMA, the p99 of a GPU host. See docs/remoting-speed.md for the predictions these figures "+
			"make and their bands.\n\n", c.launchCPU)
	}
	fmt.Fprintf(&b, "Conditions: %d CPUs (%s), %s, Go %s, %s/%s, load average %s when it ended, %s; device: "+
		"%s; load average (1, 5, 15 min, runnable/tasks) %s at the start; the client `shim/build/replay` through the "+
		"shim (`shim/build/libcuda.so.1`) to an in-process gpuserver; "+
		"%d timed passes per trace after %d warm-up passes, each in a request (acquire, pass, release); traces "+
		"`%s/replay-*.tsv`; no randomness (the traces fix every gap and GPU time).\n\n", runtime.NumCPU(),
		benchhost.CPUModel(), kernel(), runtime.Version(), runtime.GOOS, runtime.GOARCH, loadavg(), scheduling(c.pin),
		devDesc, c.loadStart, c.passes, c.warmup, c.traces)
	fmt.Fprintf(&b, "## Latency of one pass\n\nMeans over %d runs, ranges in brackets. *Native, run*: the native "+
		"model of the trace run by the same client between the shim's passes (no driver: the trace's native costs "+
		"spun, the GPU's end computed), so that both sides meet this machine's load; the ratio is taken against it "+
		"(on a GPU: against the trace replayed natively). *Native, computed*: the same model without any "+
		"machine. *Shim/H100 native*: the shim p50 against the H100's measured native p50 (a fixed figure, not "+
		"run here).\n\n| model | batch | native run p50 ms | native computed ms | shim p50 ms | **shim/native** | "+
		"shim/native computed | **shim/H100 native** | shim p10 ms | shim p99 ms | reference GPU: native p50 ms | "+
		"shim p50 ms | bench shim / reference shim |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
		c.repeat)
	for _, r := range rs {
		ref := "-"
		if r.RefShimP50 > 0 {
			ref = fmt.Sprintf("%.3f", float64(r.ShimP50)/float64(r.RefShimP50))
		}
		native := trace.Ms(r.NativeRunP50)
		if r.MeasuredNativeP50 > 0 {
			native = trace.Ms(r.MeasuredNativeP50) + " (on the GPU)"
		}
		fixed := "-"
		if r.RefNativeP50 > 0 {
			fixed = fmt.Sprintf("**%.3f** [%.3f-%.3f]", float64(r.ShimP50)/float64(r.RefNativeP50),
				float64(r.ShimP50Min)/float64(r.RefNativeP50), float64(r.ShimP50Max)/float64(r.RefNativeP50))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s [%s-%s] | **%.3f** [%.3f-%.3f] | %.3f | %s | %s | %s | %s | %s | %s |\n",
			r.Model, r.Batch, native, trace.Ms(r.NativeP50), trace.Ms(r.ShimP50), trace.Ms(r.ShimP50Min),
			trace.Ms(r.ShimP50Max), r.Ratio, r.RatioMin, r.RatioMax, r.RatioComputed, fixed, trace.Ms(r.ShimP10),
			trace.Ms(r.ShimP99), trace.Ms(r.RefNativeP50), trace.Ms(r.RefShimP50), ref)
	}
	fmt.Fprintf(&b, "\n%s\n", spreadNote(c.repeat, rs))
	fmt.Fprintf(&b, "\n## Where the shim's pass goes\n\n| model | batch | client issue ms (p50) | GPU ms | "+
		"synchronize overshoot ms (p50) | server us per async record | records per pass | late records per pass | "+
		"server sleeps per pass (of which bound) | record mismatches |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %.1f | %.1f | %.2f (%.2f) | %d |\n", r.Model, r.Batch,
			trace.Ms(r.Issue), trace.Ms(r.GPU), trace.Ms(r.Overshoot), us(r.ServerPerRecord), r.Records,
			r.LatePerPass, r.SleepsPerPass, r.BoundSleepsPerPass, r.RecordMismatch)
	}
	fmt.Fprintf(&b, "\n*Client issue*: from the pass's start to the synchronize's call. *Overshoot*: from the "+
		"later of that call and the modelled GPU's end to the synchronize's return. *Late records*: async records "+
		"that reached the server together with the synchronize (held back until the client waited). *Server "+
		"sleeps*: times the session slept on its socket between acquire and release; *bound*: of which while its "+
		"function held the binding (it found no record for its whole bound spin time). *Record mismatches*: "+
		"calls of one "+
		"logged pass whose record kind or size differ from the trace's.\n")
	fmt.Fprintf(&b, "\nThe server's CPU for its polling while bound: %s per pass on average over all traces "+
		"(faas_gpu_remoting_bound_poll_seconds_total), one core at most while a request runs.\n", boundPollNote(rs))
	fmt.Fprintf(&b, "\n## Client CPU in the driver per pass\n\n| model | batch | shim: remoted calls ms | "+
		"local calls ms | total ms | native driver ms (trace constants) | shim - native ms | native issue ms | "+
		"client process CPU ms |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", r.Model, r.Batch,
			trace.Ms(r.ShimRemoted), trace.Ms(r.ShimLocal), trace.Ms(r.ShimClient), trace.Ms(r.NativeDriver),
			trace.Ms(r.ShimClient-r.NativeDriver), trace.Ms(r.NativeIssue), trace.Ms(r.ClientCPU))
	}
	if c.device == "cuda" {
		fmt.Fprintf(&b, "\n## The real driver's cost per call kind, measured (native replay)\n\nTime inside the real "+
			"driver's entry points on the issuing thread, p50 per pass divided by the pass's calls of the kind, "+
			"against the traces' assumed constants: these replace native_call_ns and native_local_ns (one measured "+
			"cost per call kind, shared by every trace).\n\n| model | batch | launch/memset us (trace: native_call_ns) "+
			"| local getter ns (trace: native_local_ns) | native client process CPU per pass ms | native p50 ms | native p99 "+
			"ms |\n|---|---|---|---|---|---|---|\n")
		for _, r := range rs {
			fmt.Fprintf(&b, "| %s | %d | %.2f | %d | %s | %s | %s |\n", r.Model, r.Batch,
				float64(r.MeasuredNativeCall)/1e3, r.MeasuredNativeLocal.Nanoseconds(), trace.Ms(r.MeasuredNativeCPU),
				trace.Ms(r.MeasuredNativeP50), trace.Ms(r.MeasuredNativeP99))
		}
	}
	fmt.Fprintf(&b, "\nThe client spins through its recorded gaps, so its process CPU is about the pass; the "+
		"driver columns are the time inside the shim's entry points, against the trace's native driver constants "+
		"(native_call_ns per remoted call, native_local_ns per local call).\n")
	return b.String()
}

// boundPollNote is the sessions' bound polling per pass over the traces, in ms.
func boundPollNote(rs []result) string {
	var s time.Duration
	for _, r := range rs {
		s += r.BoundPollPerPass
	}
	return trace.Ms(s/time.Duration(max(len(rs), 1))) + " ms"
}

func commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func kernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "linux"
	}
	return "Linux " + unix.ByteSliceToString(u.Release[:])
}

// scheduling says how the bench was scheduled against the machine's other work (autogroup and process nice).
func scheduling(pin bool) string {
	s := "scheduled at process nice "
	if p, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err == nil {
		s += strconv.Itoa(20 - p) // the raw syscall answers 20 - nice
	} else {
		s += "?"
	}
	if b, err := os.ReadFile("/proc/self/autogroup"); err == nil {
		s += ", " + strings.TrimSpace(string(b))
	}
	if pin {
		s += ", the client pinned to CPU 0 and the gpuserver to CPU 1"
	}
	return s
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
