package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/openfaas/faas-provider/auth"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate/replay"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
)

// replayReport is the output of faas-gpu replay: the window, what the real node did (in the schema of
// `faas-gpu sim --json`: its client's view and its gpuserver's), the simulator's prediction for the same
// arrivals, and the differences in points.
type replayReport struct {
	Window     replayWindow       `json:"window"`
	Load       replayLoad         `json:"load_average"`
	Replay     simReport          `json:"replay"`
	Simulator  simReport          `json:"simulator"`
	Accounting replay.Accounting  `json:"accounting"`
	Difference replayDifferences  `json:"difference"`
	Functions  []replayFunctionFx `json:"functions"`
	// Instances compares the replica counts over the window of every function that scaled on either side
	// (--scale-labels); absent without scale labels (one instance each, throughout).
	Instances *replayInstances `json:"instances,omitempty"`
}

// replayInstances is the autoscaled replay's instance comparison: the labels both sides ran with and, per
// function that scaled, its instances over time.
type replayInstances struct {
	Labels          map[string]string       `json:"labels"`
	ScaleDownWindow float64                 `json:"scale_down_window_s"`
	Interval        float64                 `json:"autoscale_interval_s"`
	InstanceStart   float64                 `json:"sim_instance_start_s"`
	SampleEvery     float64                 `json:"sample_every_s"`
	PollError       string                  `json:"poll_error,omitempty"`
	Functions       []replay.InstanceSeries `json:"functions"`
}

type replayWindow struct {
	Trace       string  `json:"trace"`
	Models      string  `json:"models"`
	Rows        []int   `json:"rows"`
	StartMinute int     `json:"start_minute"`
	Seconds     float64 `json:"length_seconds"`
	// TimeScale is the slow motion the window was replayed in (-time-scale); every figure is in the window's time.
	TimeScale float64 `json:"time_scale"`
	Seed      uint64  `json:"seed"`
	Node      string  `json:"node"`
	GPUMemory string  `json:"gpu_memory"`
	Requests  int     `json:"requests"`
	Command   string  `json:"command"`
}

// replayLoad is /proc/loadavg before and after the window's requests.
type replayLoad struct {
	Before string `json:"before"`
	After  string `json:"after"`
}

// replayDifferences are the real node's figures minus the simulator's, by view.
type replayDifferences struct {
	EndToEnd  replay.Difference `json:"end_to_end"`
	GPUServer replay.Difference `json:"gpuserver"`
}

// replayFunctionFx is one function of the window: its model and requests.
type replayFunctionFx struct {
	Name     string `json:"name"`
	Row      int    `json:"trace_row"`
	Model    string `json:"model"`
	Requests int    `json:"requests"`
	// ExecMS is the model's GPU time per request (what the simulator holds a GPU for); HoldMS how long the real
	// node's bindings of the function were held on average in the window (the gpuserver's metering: GPU seconds
	// over requests), which adds the request's work in the function's process between acquire and release.
	ExecMS float64 `json:"exec_ms"`
	HoldMS float64 `json:"binding_hold_ms"`
	// Timing is where the function's process spent its requests' time (--timing; the three busiest functions,
	// one instance each), in the window's time like HoldMS.
	Timing *replay.Timing `json:"timing,omitempty"`
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	trace := fs.String("trace", "", "invocation trace CSV (one row per function, one column per minute)")
	models := fs.String("models", "", "model profile CSV (Torpor or Clockwork layout); function i runs model i mod "+
		"the table's length, as faas-gpu sim assigns them")
	functions := fs.Int("functions", 0, "functions: the trace's first rows (or give -rows)")
	rowsArg := fs.String("rows", "", "the trace's rows to replay, in order, e.g. 287,0-19 (instead of -functions)")
	startMinute := fs.Int("start-minute", 0, "the trace's minute the window starts at")
	length := fs.Duration("length", 2*time.Minute, "the window's length (arrivals at or after it are left out)")
	seed := fs.Uint64("seed", 1, "random seed of the arrivals (and the simulator's)")
	nodeArg := fs.String("node", "v100x4", "node preset ("+strings.Join(topology.PresetNames(), ", ")+") or node "+
		"file, for up's --gpus and the simulator's --node")
	gpuMemory := fs.String("gpu-memory", "2Gi", "every GPU's memory on both sides (up's and sim's --gpu-memory): "+
		"the simulated device reserves at most 2 GiB per GPU for remoted allocations, so a larger GPU is not one "+
		"the data plane can fill; empty: the node's")
	policyArg := fs.String("policy", string(controller.PolicyFaaSGPU), "the policy of both sides")
	overloadArg := fs.String("overload", controller.OverloadAuto, overloadUsage)
	admissionArg := fs.String("admission", string(controller.DefaultAdmission), "the admission rule of both sides "+
		"(up's and sim's --admission): "+admissionUsage)
	templatesDir := fs.String("templates-dir", "./template", "the folder of templates (the repository's ./template): "+
		"the model function runs on its gpu-python")
	workDir := fs.String("work-dir", "", "where up's state, build context and log go (default: a new temporary "+
		"folder, removed afterwards)")
	timeout := fs.Duration("request-timeout", 60*time.Second, "how long one request may take before the client "+
		"gives up on it (it is then lost)")
	warm := fs.Bool("warm", true, "before the window, call every function once (its instance's first request "+
		"captures its image: a cold start of about half a second on a loaded 2-core machine) and start the "+
		"simulator with every function resident (its prewarm), as a node that has run a while; false: both start "+
		"as deployed, the real node with every model still on the GPU it initialised on, the simulator with none")
	timeScale := fs.Float64("time-scale", 1, "replay in slow motion: the timed virtual GPU's every modelled time, "+
		"the arrivals and the SLOs the gpuserver holds functions to are this many times longer, and latencies are "+
		"divided by it, so that the host's CPU costs (the gateway, the function's process, acquire and release) "+
		"weigh that many times less against the GPU's; 1: real time")
	readyTimeout := fs.Duration("deploy-timeout", 5*time.Minute, "how long the functions may take to be ready")
	scaleArg := fs.String("scale-labels", "", "deploy every function with these com.openfaas.scale.* labels, "+
		"comma-separated (e.g. max=8 or min=1,max=4,target-proportion=0.9; the prefix may be left out), so that "+
		"up's autoscaler scales its instances, and run the simulator's autoscaler with the policy they parse to; "+
		"empty: one instance each without scale labels, what up gives a function deployed as stack.yml's are")
	scaleWindow := fs.Duration("scale-down-window", autoscale.DefaultScaleDownWindow, "with -scale-labels: up's "+
		"and the simulator's -scale-down-window")
	scaleInterval := fs.Duration("autoscale-interval", autoscale.DefaultInterval, "with -scale-labels: up's and "+
		"the simulator's -autoscale-interval")
	instanceStart := fs.Duration("instance-start", simulate.DefaultInstanceStart, "with -scale-labels: how long a "+
		"new instance takes to serve in the simulator (the real node's is its own: the replica's process starting, "+
		"the shim's session, the model's allocation and writes)")
	timing := fs.Bool("timing", false, "time each request's phases in the functions' processes (the acquire's "+
		"and the release's round trips, the template's work around the handler, the launch and the synchronize) "+
		"and report them for the three busiest functions: where a binding's hold beyond the kernel goes")
	sampleEvery := fs.Duration("sample-every", time.Second, "with -scale-labels: how often the real node's "+
		"replica counts are read (GET /system/functions) for the comparison over time")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	flagErr := func(name string, err error) error { return usageError{fmt.Errorf("-%s: %w", name, err)} }
	switch {
	case *trace == "":
		return flagErr("trace", errors.New("required"))
	case *models == "":
		return flagErr("models", errors.New("required"))
	case *functions == 0 && *rowsArg == "":
		return flagErr("functions", errors.New("give -functions or -rows"))
	case *functions < 0 || *functions > 1000:
		return flagErr("functions", errors.New("must be in [1, 1000]"))
	case *timeout <= 0:
		return flagErr("request-timeout", errors.New("must be positive"))
	case !(*timeScale >= 1 && *timeScale <= 100):
		return flagErr("time-scale", errors.New("must be in [1, 100]"))
	case *readyTimeout <= 0:
		return flagErr("deploy-timeout", errors.New("must be positive"))
	case *scaleInterval <= 0:
		return flagErr("autoscale-interval", errors.New("must be positive"))
	case *scaleWindow < 0:
		return flagErr("scale-down-window", errors.New("must not be negative"))
	case *instanceStart < 0:
		return flagErr("instance-start", errors.New("must not be negative"))
	case *sampleEvery <= 0:
		return flagErr("sample-every", errors.New("must be positive"))
	}
	scaleLabels, scaling, err := replay.ParseScaleLabels(*scaleArg, simulate.DefaultMaxInstances)
	if err != nil {
		return flagErr("scale-labels", err)
	}
	autoscaled := scaleLabels != nil
	if autoscaled && scaling.Min == 0 {
		return flagErr("scale-labels", errors.New("min 0: a replay deploys every function awake (give min 1 or "+
			"more)"))
	}
	var rows []int
	if *rowsArg != "" {
		var err error
		if rows, err = replay.ParseRows(*rowsArg); err != nil {
			return flagErr("rows", err)
		}
		if *functions != 0 && *functions != len(rows) {
			return flagErr("functions", fmt.Errorf("%d, but -rows names %d", *functions, len(rows)))
		}
	} else {
		for i := range *functions {
			rows = append(rows, i)
		}
	}
	policy, err := controller.ParsePolicy(*policyArg)
	if err != nil {
		return flagErr("policy", err)
	}
	overload, err := controller.ParseOverload(*overloadArg)
	if err != nil {
		return flagErr("overload", err)
	}
	admission, err := parseAdmission(*admissionArg)
	if err != nil {
		return err
	}
	node, err := topology.Resolve(*nodeArg)
	if err != nil {
		return flagErr("node", err)
	}
	if *gpuMemory != "" {
		size, err := topology.ParseSize(*gpuMemory)
		if err != nil {
			return flagErr("gpu-memory", err)
		}
		if node, err = node.WithGPUMemory(size); err != nil {
			return flagErr("gpu-memory", err)
		}
	}
	tr, err := simulate.LoadTrace(*trace)
	if err != nil {
		return flagErr("trace", err)
	}
	ms, err := simulate.LoadModels(*models)
	if err != nil {
		return flagErr("models", err)
	}
	w := replay.Window{Trace: tr, Rows: rows, StartMinute: *startMinute, Length: *length, Seed: *seed}
	arrivals, err := w.Arrivals(ms)
	if err != nil {
		return flagErr("rows", err)
	}
	if len(arrivals) == 0 {
		return flagErr("length", errors.New("the window has no arrivals"))
	}
	fns, err := replay.Functions(ms, len(rows))
	if err != nil {
		return flagErr("models", err)
	}

	// The simulator's prediction: the same arrivals, functions, models, SLOs and node, and the data plane the
	// node runs (sim's default): the executors' chunks, 0.9 of each simulated GPU's memory (the simulated device
	// has no gpuserver context), the controller planning with them, their own evictions beyond that.
	cfg := simulate.Config{Arrivals: arrivals, Models: ms, Functions: len(fns), Node: node, Policy: policy,
		Seed: *seed, Overload: overload, Admission: admission, MaxInFlight: simulate.DefaultMaxInFlight,
		Instances: 1, Prewarm: *warm, DataPlane: true, DataPlaneContextBytes: simulate.NoDataPlaneContext}
	if autoscaled {
		// up's autoscaler, as the labels ask, with up's settings (simulate.Config: a zero window or start is the
		// default, a negative one at once).
		cfg.Instances, cfg.Autoscale, cfg.Scaling, cfg.AutoscaleInterval = 0, true, scaling, *scaleInterval
		cfg.ScaleDownWindow, cfg.InstanceStart = *scaleWindow, *instanceStart
		if cfg.ScaleDownWindow == 0 {
			cfg.ScaleDownWindow = -1
		}
		if cfg.InstanceStart == 0 {
			cfg.InstanceStart = -1
		}
	}
	predicted, err := simulate.Run(cfg, autoscaled)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	bound, err := simulate.OfflineBound(cfg)
	if err != nil {
		return fmt.Errorf("offline bound: %w", err)
	}

	dir := *workDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "faas-gpu-replay"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	stateDir, buildDir := filepath.Join(dir, "state"), filepath.Join(dir, "build")
	if err := replay.WriteBuildContext(*templatesDir, buildDir); err != nil {
		return flagErr("templates-dir", err)
	}
	upArgs := []string{"--state-dir", stateDir, "--build-dir", buildDir, "--gpus", *nodeArg,
		"--sim-time-scale", strconv.FormatFloat(*timeScale, 'f', -1, 64), "--policy", string(policy), "--overload", *overloadArg,
		"--admission", string(admission), "--log-level", "warn",
		// Every request comes from this one client, standing in for many: the gateway's bound per peer (a quarter
		// of its connections) would refuse a backlog that many clients would not hit.
		"--max-conns", "4096", "--max-conns-per-peer", "4096"}
	if *gpuMemory != "" {
		upArgs = append(upArgs, "--gpu-memory", *gpuMemory)
	}
	if autoscaled { // the autoscaler's clock runs on the wall clock: in slow motion its times are scaled too
		upArgs = append(upArgs, "--scale-down-window", scaleDuration(*scaleWindow, *timeScale).String(),
			"--autoscale-interval", scaleDuration(*scaleInterval, *timeScale).String())
	}
	u, err := startReplayUp(ctx, upArgs, filepath.Join(dir, "up.log"))
	if err != nil {
		return err
	}
	defer u.stop(stderr)
	fmt.Fprintf(stderr, "faas-gpu replay: up on %s (log %s); deploying %d functions\n", u.url, u.logPath, len(fns))
	initial := 1
	if autoscaled {
		initial = int(scaling.Min)
	}
	deployOpt := replay.DeployOptions{Scale: scaleLabels, Timing: *timing}
	if err := u.deploy(ctx, stateDir, fns, *timeScale, deployOpt, initial, *readyTimeout); err != nil {
		return err
	}
	if *warm {
		if err := u.warm(ctx, fns, time.Duration(float64(*timeout)**timeScale)); err != nil {
			return err
		}
	}
	if *timing { // the warm-up's phases are not the window's
		for _, f := range fns {
			if _, err := u.timing(ctx, f.Name, *timeScale); err != nil {
				return err
			}
		}
	}
	var gs readerFlags
	gpuserver, err := gs.client(stateDir)
	if err != nil {
		return err
	}
	before, err := gpuserver.Status(ctx)
	if err != nil {
		return fmt.Errorf("gpuserver status: %w", err)
	}
	usageBefore, err := gpuserver.Usage(ctx, time.Time{})
	if err != nil {
		return fmt.Errorf("gpuserver usage: %w", err)
	}
	load := replayLoad{Before: loadAverage()}
	fmt.Fprintf(stderr, "faas-gpu replay: %d requests over %v (load %s)\n", len(arrivals), *length, load.Before)
	var samples []replay.Sample
	var pollErr error
	polled := make(chan struct{})
	pollCtx, stopPoll := context.WithCancel(ctx)
	go func() {
		defer close(polled)
		if autoscaled {
			samples, pollErr = replay.PollReplicas(pollCtx, *sampleEvery, *timeScale, u.replicasOf(fns))
		}
	}()
	recs := replay.Fire(ctx, replay.Client(), u.url, fns, arrivals, *timeScale,
		time.Duration(float64(*timeout)**timeScale))
	stopPoll()
	<-polled
	load.After = loadAverage()
	if err := ctx.Err(); err != nil {
		return err
	}
	after, err := gpuserver.Status(ctx)
	if err != nil {
		return fmt.Errorf("gpuserver status: %w", err)
	}
	usageAfter, err := gpuserver.Usage(ctx, time.Time{})
	if err != nil {
		return fmt.Errorf("gpuserver usage: %w", err)
	}
	held := map[string][2]float64{} // function: GPU seconds, requests in the window
	for sign, r := range map[float64]metering.Report{1: usageAfter, -1: usageBefore} {
		for _, f := range r.Functions {
			h := held[f.Function]
			h[0] += sign * f.GPUSeconds
			h[1] += sign * float64(f.Requests)
			held[f.Function] = h
		}
	}

	e2e := replay.Summarize(string(policy)+" (up, client)", node.Name, fns, recs, *length)
	replay.Observe(&e2e, before, after)
	atServer := replay.GPUServerView(string(policy)+" (up, gpuserver)", node.Name, fns, before, after, *length)
	rep := replayReport{
		Window: replayWindow{Trace: *trace, Models: *models, Rows: rows, StartMinute: *startMinute,
			Seconds: length.Seconds(), TimeScale: *timeScale, Seed: *seed, Node: node.Name, GPUMemory: *gpuMemory, Requests: len(arrivals),
			Command: "faas-gpu replay " + strings.Join(args, " ")},
		Load:       load,
		Replay:     simReport{Trace: *trace, Models: *models, Node: node.Name, Functions: len(fns), Seed: *seed, Policies: []simulate.Result{e2e, atServer}, Bound: bound},
		Simulator:  simReport{Trace: *trace, Models: *models, Node: node.Name, Functions: len(fns), Seed: *seed, Policies: []simulate.Result{predicted}, Bound: bound},
		Accounting: replay.Account(recs),
		Difference: replayDifferences{EndToEnd: replay.Compare(e2e, predicted), GPUServer: replay.Compare(atServer, predicted)},
	}
	if autoscaled {
		ri := &replayInstances{Labels: scaleLabels, ScaleDownWindow: scaleWindow.Seconds(),
			Interval: scaleInterval.Seconds(), InstanceStart: instanceStart.Seconds(), SampleEvery: sampleEvery.Seconds(),
			Functions: replay.CompareInstances(fns, samples, predicted.Scaling, initial, *instanceStart)}
		if pollErr != nil {
			ri.PollError = pollErr.Error()
		}
		rep.Instances = ri
	}
	counts := make([]int, len(fns))
	for _, a := range arrivals {
		counts[a.Function]++
	}
	for i, f := range fns {
		fx := replayFunctionFx{Name: f.Name, Row: rows[i], Model: f.Model.Name, Requests: counts[i],
			ExecMS: float64(f.Model.Remote) / 1e6}
		if h := held[f.Name]; h[1] > 0 {
			fx.HoldMS = math.Round(h[0]/h[1]/(*timeScale)*1e6) / 1e3
		}
		rep.Functions = append(rep.Functions, fx)
	}
	if *timing {
		busiest := slices.Clone(rep.Functions)
		slices.SortStableFunc(busiest, func(a, b replayFunctionFx) int { return b.Requests - a.Requests })
		for _, f := range busiest[:min(3, len(busiest))] {
			t, err := u.timing(ctx, f.Name, *timeScale)
			if err != nil {
				return err
			}
			for i := range rep.Functions {
				if rep.Functions[i].Name == f.Name {
					rep.Functions[i].Timing = &t
				}
			}
		}
	}
	if *workDir != "" {
		if err := writeReplayRecords(filepath.Join(dir, "requests.csv"), fns, recs); err != nil {
			return err
		}
	}
	writeReplayTable(stderr, rep)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// writeReplayTable prints the key figures of both sides.
func writeReplayTable(w io.Writer, rep replayReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "side\tfunctions within SLO\trequests\twithin SLO\trefused\tswaps none/nvlink/pcie\tevictions\tp98/ddl\t")
	rs := append(append([]simulate.Result{}, rep.Replay.Policies...), rep.Simulator.Policies...)
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%d\t%d/%d/%d\t%d\t%.2f\t\n", r.Name, r.FunctionsSLOMet,
			r.FunctionsWithTraffic, r.Requests, r.RequestsOnTime, r.Rejected, r.Swaps.None, r.Swaps.NVLink,
			r.Swaps.PCIe, r.Evictions, r.P98)
	}
	_ = tw.Flush()
	for _, d := range []struct {
		name string
		d    replay.Difference
	}{{"client", rep.Difference.EndToEnd}, {"gpuserver", rep.Difference.GPUServer}} {
		fmt.Fprintf(w, "difference (%s - simulator, points): functions %+.1f, requests on time %+.1f, refused %+.1f, "+
			"swaps %+.1f; within %.0f: %v\n", d.name, d.d.FunctionsSLOMet, d.d.RequestsOnTime, d.d.Refused, d.d.Swaps,
			replay.Target, d.d.Within)
	}
	busiest := slices.Clone(rep.Functions)
	slices.SortStableFunc(busiest, func(a, b replayFunctionFx) int { return b.Requests - a.Requests })
	for _, f := range busiest[:min(3, len(busiest))] {
		fmt.Fprintf(w, "%s (row %d): %d requests, GPU time %.1f ms, binding held %.1f ms on average\n", f.Name, f.Row,
			f.Requests, f.ExecMS, f.HoldMS)
		if t := f.Timing; t != nil {
			fmt.Fprintf(w, "  its process, mean (p90) ms over %d requests: acquire round trip %.2f (%.2f), template "+
				"before %.2f (%.2f), launch %.2f (%.2f), synchronize %.2f (%.2f), template after %.2f (%.2f), "+
				"release round trip %.2f (%.2f)\n", t.Requests, t.AcquireRoundTrip.Mean, t.AcquireRoundTrip.P90,
				t.TemplateBefore.Mean, t.TemplateBefore.P90, t.Launch.Mean, t.Launch.P90, t.Synchronize.Mean,
				t.Synchronize.P90, t.TemplateAfter.Mean, t.TemplateAfter.P90, t.ReleaseRoundTrip.Mean,
				t.ReleaseRoundTrip.P90)
		}
	}
	if in := rep.Instances; in != nil {
		fmt.Fprintf(w, "instances (ready, real/simulator; labels %v):\n", in.Labels)
		for _, s := range in.Functions {
			fmt.Fprintf(w, "  %s: mean %.2f/%.2f, peak %d/%d, ups %d/%d, downs %d/%d, mean |difference| %.2f; %s\n",
				s.Function, s.RealMean, s.SimMean, s.RealPeak, s.SimPeak, s.RealUps, s.SimUps, s.RealDowns,
				s.SimDowns, s.MeanAbsDiff, s.Timeline(10*time.Second))
		}
	}
	a := rep.Accounting
	fmt.Fprintf(w, "accounting: sent %d = ok %d + refused %d + failed %d + lost %d; send lag p99 %.1f ms; load %s -> %s\n",
		a.Sent, a.OK, a.Refused, a.Failed, a.Lost, a.LagP99, rep.Load.Before, rep.Load.After)
}

// writeReplayRecords writes every request's record as CSV: at_ms, function, status, latency_ms, lag_ms, error.
func writeReplayRecords(path string, fns []replay.Function, recs []replay.Record) error {
	var b strings.Builder
	b.WriteString("at_ms,function,status,latency_ms,lag_ms,error\n")
	for _, r := range recs {
		fmt.Fprintf(&b, "%.3f,%s,%d,%.3f,%.3f,%q\n", float64(r.At)/1e6, fns[r.Function].Name, r.Status,
			float64(r.Latency)/1e6, float64(r.Lag)/1e6, r.Err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("replay: requests: %w", err)
	}
	return nil
}

// loadAverage is the first three fields of /proc/loadavg ("" where there is none).
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// replayUp is the `faas-gpu up` a replay runs: this binary again, on a free port of 127.0.0.1.
type replayUp struct {
	cmd     *exec.Cmd
	url     string
	logPath string
	log     *os.File
	done    chan struct{}
	client  *http.Client
	// creds are up's gateway credentials (read by deploy).
	creds *auth.BasicAuthCredentials
}

func startReplayUp(ctx context.Context, args []string, logPath string) (*replayUp, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("replay: this binary: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("replay: a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("replay: up's log: %w", err)
	}
	cmd := exec.Command(self, append([]string{"up", "--port", strconv.Itoa(port)}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("replay: start up: %w", err)
	}
	u := &replayUp{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d", port), logPath: logPath, log: logFile,
		done: make(chan struct{}), client: &http.Client{Timeout: 30 * time.Second}}
	go func() { _ = cmd.Wait(); close(u.done) }()
	err = u.until(ctx, time.Minute, "the gateway to answer", func() error {
		resp, err := u.client.Get(u.url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz: %d", resp.StatusCode)
		}
		return nil
	})
	if err != nil {
		u.stop(io.Discard)
		return nil, err
	}
	return u, nil
}

// until polls cond every 200 ms until it returns nil, up exits, ctx ends or limit passes.
func (u *replayUp) until(ctx context.Context, limit time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-u.done:
			return fmt.Errorf("replay: up exited while waiting for %s (its log: %s)", what, u.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replay: %s: not within %v: %w (up's log: %s)", what, limit, err, u.logPath)
		}
	}
}

// system calls the gateway's /system API with up's credentials; out, when given, is filled from the JSON answer.
func (u *replayUp) system(ctx context.Context, method, path string, body any, out any) error {
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.url+path, r)
	if err != nil {
		return err
	}
	req.SetBasicAuth(u.creds.User, u.creds.Password)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// deploy deploys the functions through the gateway's /system/functions, with the scale labels given, and waits
// until each has `ready` ready replicas.
func (u *replayUp) deploy(ctx context.Context, stateDir string, fns []replay.Function, timeScale float64,
	opt replay.DeployOptions, ready int, limit time.Duration) error {
	creds, err := basicauth.Read(filepath.Join(stateDir, "secrets"))
	if err != nil {
		return fmt.Errorf("replay: up's credentials: %w", err)
	}
	u.creds = creds
	for _, f := range fns {
		if err := u.system(ctx, http.MethodPost, "/system/functions", f.Deployment(timeScale, opt), nil); err != nil {
			return fmt.Errorf("replay: deploy %s: %w", f.Name, err)
		}
	}
	return u.until(ctx, limit, "every function to be ready", func() error {
		for _, f := range fns {
			var st types.FunctionStatus
			if err := u.system(ctx, http.MethodGet, "/system/function/"+f.Name, nil, &st); err != nil {
				return err
			}
			if st.AvailableReplicas < uint64(ready) {
				return fmt.Errorf("%s has %d ready replicas of %d", f.Name, st.AvailableReplicas, ready)
			}
		}
		return nil
	})
}

// replicasOf reads every function's replicas (GET /system/functions), by the functions' index.
func (u *replayUp) replicasOf(fns []replay.Function) func(context.Context) ([]replay.Replicas, error) {
	index := make(map[string]int, len(fns))
	for i, f := range fns {
		index[f.Name] = i
	}
	return func(ctx context.Context) ([]replay.Replicas, error) {
		var list []types.FunctionStatus
		if err := u.system(ctx, http.MethodGet, "/system/functions", nil, &list); err != nil {
			return nil, err
		}
		out := make([]replay.Replicas, len(fns))
		for _, st := range list {
			if i, ok := index[st.Name]; ok {
				out[i] = replay.Replicas{Desired: int(st.Replicas), Ready: int(st.AvailableReplicas)}
			}
		}
		return out, nil
	}
}

// scaleDuration is d times k.
func scaleDuration(d time.Duration, k float64) time.Duration { return time.Duration(float64(d) * k) }

// timing asks function name's process for its requests' phases (replay.Timing; --timing) and starts them
// afresh; the durations are divided by timeScale (the window's time). With several instances one answers.
func (u *replayUp) timing(ctx context.Context, name string, timeScale float64) (replay.Timing, error) {
	c := &http.Client{Timeout: 30 * time.Second * time.Duration(max(1, timeScale))}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.url+"/function/"+name+"?timing=1",
		strings.NewReader("{}"))
	if err != nil {
		return replay.Timing{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return replay.Timing{}, fmt.Errorf("replay: timing of %s: %w", name, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return replay.Timing{}, fmt.Errorf("replay: timing of %s: %d %s", name, resp.StatusCode,
			strings.TrimSpace(string(raw)))
	}
	var t replay.Timing
	if err := json.Unmarshal(raw, &t); err != nil {
		return replay.Timing{}, fmt.Errorf("replay: timing of %s: %w", name, err)
	}
	for _, p := range []*replay.PhaseTiming{&t.AcquireRoundTrip, &t.TemplateBefore, &t.Launch, &t.Synchronize,
		&t.TemplateAfter, &t.ReleaseRoundTrip} {
		p.Mean, p.P50, p.P90 = p.Mean/timeScale, p.P50/timeScale, p.P90/timeScale
	}
	return t, nil
}

// warm calls every function once, one after another, and wants 200 from each.
func (u *replayUp) warm(ctx context.Context, fns []replay.Function, timeout time.Duration) error {
	c := &http.Client{Timeout: timeout}
	for _, f := range fns {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.url+"/function/"+f.Name, strings.NewReader("{}"))
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err != nil {
			return fmt.Errorf("replay: warm %s: %w", f.Name, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("replay: warm %s: %d %s", f.Name, resp.StatusCode, strings.TrimSpace(string(raw)))
		}
	}
	return nil
}

// stop ends up with SIGINT (its orderly stop) and waits for it.
func (u *replayUp) stop(stderr io.Writer) {
	select {
	case <-u.done:
	default:
		_ = u.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-u.done:
		case <-time.After(30 * time.Second):
			fmt.Fprintf(stderr, "faas-gpu replay: up did not stop within 30s of SIGINT; killing it\n")
			_ = u.cmd.Process.Kill()
			<-u.done
		}
	}
	u.log.Close()
}
