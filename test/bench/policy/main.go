// Command policy runs the policy benchmarks of `make bench-policy` and writes docs/bench/policy.{md,json}.
// Every policy is judged on two figures side by side - functions within their SLO and requests served within it
// - with the requests refused beside them, each a mean with its range over the seeds: Torpor's node and trace;
// the Azure 2019 8-hour trace split into hours with Torpor's models; Torpor's node simulator's arrivals at 700
// functions with the overload control on its default and off; the cluster GPUs each policy needs for the 8-hour
// trace at the same target, against static packing, keep-alive and late binding without our policy; and the
// router against round robin. -quick runs a small version for CI.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/internal/benchhost"
)

// outcome is one run's figures.
type outcome struct {
	Seed      uint64 `json:"seed"`
	Functions int    `json:"functions_with_requests"`
	Met       int    `json:"functions_slo_met"`
	Requests  int64  `json:"requests"`
	OnTime    int64  `json:"requests_on_time"`
	Refused   int64  `json:"requests_refused"`
	// Admission counts the refusals of the admission rule (in Refused).
	Admission int64 `json:"requests_refused_admission,omitempty"`
	// BusyFunctions are the functions with at least simulate.BusyRequests requests, BusyMet those within SLO.
	BusyFunctions int `json:"functions_busy,omitempty"`
	BusyMet       int `json:"functions_busy_slo_met,omitempty"`
	// P98 is the 98th percentile of the served (admitted) requests' latency over their deadline.
	P98  float64 `json:"latency_p98_over_deadline,omitempty"`
	Busy float64 `json:"gpu_busy"`
	GPUs float64 `json:"gpus,omitempty"`
	// ImageLoads counts host images loaded on a node (router runs).
	ImageLoads int64 `json:"image_loads,omitempty"`
	// Pressure counts the data plane's own evictions (memory pressure); Instances the instances provisioned on
	// average, all functions (the autoscaler's).
	Pressure  int64   `json:"evictions_pressure,omitempty"`
	Instances float64 `json:"instances_mean,omitempty"`
}

func (o outcome) fnShare() float64   { return ratio(float64(o.Met), float64(o.Functions)) }
func (o outcome) reqShare() float64  { return ratio(float64(o.OnTime), float64(o.Requests)) }
func (o outcome) busyShare() float64 { return ratio(float64(o.BusyMet), float64(o.BusyFunctions)) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// cell is one policy at one point of a sweep, over the seeds.
type cell struct {
	Policy string    `json:"policy"`
	Runs   []outcome `json:"runs"`
}

// point is one x of a sweep (a function count, an hour).
type point struct {
	Label string `json:"label"`
	Cells []cell `json:"cells"`
	// Bound per seed: simulate.OfflineBound's functions (Met) of those with requests (Functions), an upper bound
	// on what any policy could keep within SLO on the node (memory, queueing and contention ignored).
	Bound []outcome `json:"offline_bound,omitempty"`
}

type sweep struct {
	Name   string  `json:"name"`
	What   string  `json:"what"`
	Points []point `json:"points"`
}

// sizing is how many GPUs a policy needs on one seed to keep Target of the functions within their SLO.
type sizing struct {
	Policy string    `json:"policy"`
	Runs   []outcome `json:"runs"` // per seed: the smallest cluster reaching the target, else the largest tried
	// Reached per seed.
	Reached []bool `json:"reached"`
	// Missed lists, per seed, the smaller clusters tried that missed the target.
	Missed [][]miss `json:"missed,omitempty"`
}

// miss is a cluster that missed the sizing target: its run stopped once the target was out of reach.
type miss struct {
	Nodes int `json:"nodes"`
	// StoppedAtMinutes is the simulated time at which the target was out of reach.
	StoppedAtMinutes float64 `json:"stopped_at_minutes"`
}

type report struct {
	Quick     bool     `json:"quick"`
	Seeds     []uint64 `json:"seeds"`
	GoVersion string   `json:"go_version"`
	CPUs      int      `json:"nproc"`
	CPUModel  string   `json:"cpu_model"`
	Commit    string   `json:"commit"`
	// Command is the benchmark's command line (make bench-policy runs it with go run).
	Command     string  `json:"command"`
	Started     string  `json:"started"`
	WallSeconds float64 `json:"wall_seconds"`
	// CPUSeconds is the processor time the whole run used (user and system).
	CPUSeconds float64 `json:"cpu_seconds"`
	// LoadStart and LoadEnd are the machine's 1-minute load averages when the run started and ended (other work
	// on the machine stretches the wall time, not the figures).
	LoadStart float64 `json:"load_start"`
	LoadEnd   float64 `json:"load_end"`
	Parallel  int     `json:"parallel"`
	Sweeps    []sweep `json:"sweeps"`
	// Cluster sizing at ClusterTarget over ClusterMinutes of the Azure trace.
	ClusterTarget  float64  `json:"cluster_target"`
	ClusterMinutes int      `json:"cluster_minutes"`
	Sizing         []sizing `json:"cluster_sizing"`
	// Router against round robin: faas-gpu on RouterNodes nodes.
	RouterNodes int    `json:"router_nodes"`
	Router      []cell `json:"router"`
	// Note says anything about how the report was produced that the conditions must show.
	Note string `json:"note,omitempty"`
}

type inputs struct {
	dir    string
	mu     sync.Mutex
	traces map[string]*simulate.Trace
	models map[string][]simulate.Model
	sets   map[string]*arrivalSet
}

// arrivalSet is one list of arrivals shared by the runs that replay it (policies, cluster sizes), built by the
// first to need it and dropped when the last has finished.
type arrivalSet struct {
	once  sync.Once
	arr   []simulate.Arrival
	err   error
	users int
}

// want registers one more run of the arrivals named key.
func (in *inputs) want(key string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.sets[key]
	if s == nil {
		s = &arrivalSet{}
		in.sets[key] = s
	}
	s.users++
}

// arrivals gives the arrivals named key, built by build on first use; release must follow once the run is done.
func (in *inputs) arrivals(key string, build func() ([]simulate.Arrival, error)) ([]simulate.Arrival, error) {
	in.mu.Lock()
	s := in.sets[key]
	in.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("arrivals %s: not registered", key)
	}
	s.once.Do(func() { s.arr, s.err = build() })
	return s.arr, s.err
}

func (in *inputs) release(key string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if s := in.sets[key]; s != nil {
		if s.users--; s.users <= 0 {
			delete(in.sets, key)
		}
	}
}

func (in *inputs) load(trace, models string) (*simulate.Trace, []simulate.Model, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	tr := in.traces[trace]
	if tr == nil {
		var err error
		if tr, err = simulate.LoadTrace(filepath.Join(in.dir, trace)); err != nil {
			return nil, nil, err
		}
		in.traces[trace] = tr
	}
	ms := in.models[models]
	if ms == nil {
		var err error
		if ms, err = simulate.LoadModels(filepath.Join(in.dir, models)); err != nil {
			return nil, nil, err
		}
		in.models[models] = ms
	}
	return tr, ms, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchpolicy:", err)
		os.Exit(1)
	}
}

// The node of Torpor's node simulator (misc/tools/node_simu.py): 4 GPUs of 100 models of 300 MB, pairs behind
// one PCIe switch each, 1.64x for two swaps behind one switch (Table 3).
const torporSimuNode = `name: torpor-simu
gpus:
- {name: V100, memory_bytes: 30094131200, pcie_switch: 0, copy_engines: 2, h2d_bytes_per_sec: 12e9}
- {name: V100, memory_bytes: 30094131200, pcie_switch: 0, copy_engines: 2, h2d_bytes_per_sec: 12e9}
- {name: V100, memory_bytes: 30094131200, pcie_switch: 1, copy_engines: 2, h2d_bytes_per_sec: 12e9}
- {name: V100, memory_bytes: 30094131200, pcie_switch: 1, copy_engines: 2, h2d_bytes_per_sec: 12e9}
switch_uplink_bytes_per_sec: [12e9, 12e9]
nvlink_bytes_per_sec: [[0, 24e9, 24e9, 48e9], [24e9, 0, 48e9, 24e9], [24e9, 48e9, 0, 48e9], [48e9, 24e9, 48e9, 0]]
slowdown: {host_same_switch: 1.64, host_other_switch: 1.0, nvlink_other_pair: 1.0}
transfer_latency_sec: 0
`

// torporSimuModel is node_simu.py's one model: 19 ms resident or over NVLink, 25 ms swapped from host alone,
// deadline 50 ms at the 98th percentile.
const torporSimuModel = "model,weights_mb,native_ms,remoting_ms,swap_pcie_ms,swap_nvlink_ms,heavy,slo_ms,slo_percentile\n" +
	"a,300,19,19,25,19,true,50,98\n"

// job is one simulation; its outcome lands in *out.
type job struct {
	name string
	run  func() (outcome, error)
	out  *outcome
}

// runJobs runs jobs on parallel workers in the order given (the longest first keeps the tail short), logging
// each as it ends; the first error stops handing out more.
func runJobs(jobs []job, parallel int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	next, done := 0, 0
	var failed error
	t0 := time.Now()
	for range min(parallel, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if failed != nil || next == len(jobs) {
					mu.Unlock()
					return
				}
				j := jobs[next]
				next++
				mu.Unlock()
				t := time.Now()
				o, err := j.run()
				mu.Lock()
				done++
				if err != nil {
					if failed == nil {
						failed = fmt.Errorf("%s: %w", j.name, err)
					}
					mu.Unlock()
					return
				}
				*j.out = o
				logf("[%3d/%3d %5.0fs] %-54s functions %4d/%4d  requests %7d/%7d  refused %6d  (%.1fs)", done,
					len(jobs), time.Since(t0).Seconds(), j.name, o.Met, o.Functions, o.OnTime, o.Requests, o.Refused,
					time.Since(t).Seconds())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

func fromResult(seed uint64, r simulate.Result) outcome {
	busy := 0.0
	for _, b := range r.GPUBusy {
		busy += b / float64(len(r.GPUBusy))
	}
	o := outcome{Seed: seed, Functions: r.FunctionsWithTraffic, Met: r.FunctionsSLOMet, Requests: r.Requests,
		OnTime: r.RequestsOnTime, Refused: r.Rejected, Admission: r.Refused, BusyFunctions: r.FunctionsBusy,
		BusyMet: r.FunctionsBusyMet, P98: r.P98, Busy: busy, Pressure: r.DataPlaneEvictions["pressure"]}
	if a := r.Autoscaler; a != nil {
		o.Instances = a.Mean
	}
	return o
}

func fromCluster(seed uint64, r simulate.ClusterResult) outcome {
	return outcome{Seed: seed, Functions: r.FunctionsWithTraffic, Met: r.FunctionsSLOMet, Requests: r.Requests,
		OnTime: r.RequestsOnTime, Refused: r.Rejected, GPUs: r.GPUsMean}
}

func run() error {
	workloads := flag.String("workloads", "../shared/workloads", "directory of the shared workload CSVs")
	out := flag.String("out", "docs/bench", "output directory")
	seedsArg := flag.String("seeds", "1,2,3,4,5", "seeds every figure is averaged over")
	quick := flag.Bool("quick", false, "a small run for CI: seeds 1 and 3, fewer points, shorter cluster runs")
	parallel := flag.Int("parallel", runtime.NumCPU(), "simulations run at once")
	from := flag.String("report", "", "render the markdown of an earlier run's JSON report instead of running")
	sh := registerSharing() // sharing.go
	flag.Parse()
	if *from != "" {
		data, err := os.ReadFile(*from)
		if err != nil {
			return fmt.Errorf("-report: %w", err)
		}
		var rep report
		if err := json.Unmarshal(data, &rep); err != nil {
			return fmt.Errorf("-report: %w", err)
		}
		return os.WriteFile(strings.TrimSuffix(*from, ".json")+".md", []byte(markdown(rep)), 0o644)
	}
	var seeds []uint64
	for _, f := range strings.Split(*seedsArg, ",") {
		s, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("-seeds: %q is not a seed", f)
		}
		seeds = append(seeds, s)
	}
	if *parallel < 1 {
		return fmt.Errorf("-parallel: must be >= 1")
	}
	torporCounts, hours, arrivalsMin, clusterMin := []int{160, 320, 560, 720}, []int{0, 1, 2, 3, 4, 5, 6, 7}, 31, 480
	hoursWithout, cvs := hours, []float64{1, 2, 4, 6}
	if *quick {
		if *seedsArg == "1,2,3,4,5" {
			// Seed 3 gives the Azure trace's dominant function (287) bert_qa, seed 1 a CV model: one overloaded
			// and one light draw.
			seeds = []uint64{1, 3}
		}
		torporCounts, hours, hoursWithout, arrivalsMin, clusterMin = []int{560}, []int{0, 1}, []int{1}, 10, 120
		cvs = []float64{1, 4}
	}
	in := &inputs{dir: *workloads, traces: map[string]*simulate.Trace{}, models: map[string][]simulate.Model{},
		sets: map[string]*arrivalSet{}}
	node, err := topology.Preset("v100x4")
	if err != nil {
		return err
	}
	if only, err := sh.only(in, node, seeds, *quick, *out, *parallel); only {
		return err
	}
	shareJobs, shareFinish, err := sh.jobs(in, node, seeds, *quick, *out)
	if err != nil {
		return err
	}
	simuNode, err := topology.Parse([]byte(torporSimuNode))
	if err != nil {
		return err
	}
	simuModels, err := simulate.ParseModels(strings.NewReader(torporSimuModel))
	if err != nil {
		return err
	}
	start := time.Now()
	rep := report{Quick: *quick, Seeds: seeds, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
		CPUModel: benchhost.CPUModel(), Commit: gitCommit(), Command: strings.Join(append([]string{"go run ./test/bench/policy"}, os.Args[1:]...), " "),
		Started: start.UTC().Format(time.RFC3339), LoadStart: loadAverage(), Parallel: *parallel,
		ClusterTarget: 0.98, ClusterMinutes: clusterMin, RouterNodes: 2}
	all := variants(!*quick)
	// add appends a point of sweep sw: every variant on every seed, the runs of one seed next to each other (they
	// share its arrivals, built once); arrivals gives a seed's arrivals, cfg a run's configuration before the
	// variant's settings.
	add := func(jobs *[]job, sw *sweep, label string, vs []variant,
		arrivals func(seed uint64) (key string, build func() ([]simulate.Arrival, error)),
		cfg func(seed uint64) (simulate.Config, error)) {
		pt := point{Label: label}
		for _, v := range vs {
			pt.Cells = append(pt.Cells, cell{Policy: v.name, Runs: make([]outcome, len(seeds))})
		}
		pt.Bound = make([]outcome, len(seeds))
		sw.Points = append(sw.Points, pt)
		cur := &sw.Points[len(sw.Points)-1]
		for si, seed := range seeds {
			key, build := arrivals(seed)
			in.want(key)
			*jobs = append(*jobs, job{name: fmt.Sprintf("%s %s offline bound seed %d", sw.Name, label, seed),
				out: &cur.Bound[si], run: func() (outcome, error) {
					defer in.release(key)
					sc, err := cfg(seed)
					if err != nil {
						return outcome{}, err
					}
					vs[0].apply(&sc)
					if sc.Arrivals, err = in.arrivals(key, build); err != nil {
						return outcome{}, err
					}
					b, err := simulate.OfflineBound(sc)
					return outcome{Seed: seed, Functions: b.FunctionsWithTraffic, Met: b.Functions}, err
				}})
			for ci := range cur.Cells {
				c, v := &cur.Cells[ci], vs[ci]
				in.want(key)
				*jobs = append(*jobs, job{name: fmt.Sprintf("%s %s %s seed %d", sw.Name, label, c.Policy, seed),
					out: &c.Runs[si], run: func() (outcome, error) {
						defer in.release(key)
						sc, err := cfg(seed)
						if err != nil {
							return outcome{}, err
						}
						v.apply(&sc)
						if sc.Arrivals, err = in.arrivals(key, build); err != nil {
							return outcome{}, err
						}
						r, err := simulate.Run(sc, false)
						return fromResult(seed, r), err
					}})
			}
		}
	}
	// fromTrace gives the arrivals of a trace (without the rows drop) for a seed: functions, minutes from
	// startMinute, each function's inter-arrival times of coefficient of variation cv (0: Poisson within each
	// minute).
	fromTrace := func(trace string, drop []int, functions, minutes, startMinute int, cv float64) func(seed uint64) (string,
		func() ([]simulate.Arrival, error)) {
		return func(seed uint64) (string, func() ([]simulate.Arrival, error)) {
			return fmt.Sprintf("%s-%v/%d/%d+%d/cv%g/%d", trace, drop, functions, startMinute, minutes, cv, seed),
				func() ([]simulate.Arrival, error) {
					tr, ms, err := in.load(trace, "models-torpor-v100.csv")
					if err != nil {
						return nil, err
					}
					return simulate.TraceArrivals(simulate.Config{Trace: tr.Without(drop...), Models: ms,
						Functions: functions, Minutes: minutes, StartMinute: startMinute, Seed: seed, ArrivalCV: cv})
				}
		}
	}
	// traceCfg is a run of trace (without the rows drop) on Torpor's node with Torpor's models drawn per seed.
	traceCfg := func(trace string, drop []int, functions, minutes, startMinute int) func(seed uint64) (simulate.Config, error) {
		return func(seed uint64) (simulate.Config, error) {
			tr, ms, err := in.load(trace, "models-torpor-v100.csv")
			return simulate.Config{Trace: tr.Without(drop...), Models: ms, Functions: functions, Node: node,
				Minutes: minutes, StartMinute: startMinute, Seed: seed, Assign: simulate.AssignSeeded}, err
		}
	}
	rep.Sweeps = make([]sweep, 6)
	var nodeJobs, hourJobs, arrivalJobs []job
	tn := &rep.Sweeps[0]
	*tn = sweep{Name: "torpor-node", What: "Torpor's node (v100x4) and trace (torpor-203fn-31min.csv) with Torpor's " +
		"models (models-torpor-v100.csv) drawn per seed, 10 simulated minutes; x: functions"}
	for _, n := range torporCounts {
		add(&nodeJobs, tn, strconv.Itoa(n), all, fromTrace("torpor-203fn-31min.csv", nil, n, 10, 0, 0),
			traceCfg("torpor-203fn-31min.csv", nil, n, 10, 0))
	}
	hr := &rep.Sweeps[1]
	*hr = sweep{Name: "azure-hours", What: "the Azure 2019 trace (azure2019-500fn-8h.csv, its 500 functions as they " +
		"are) split into its 8 hours, Torpor's models drawn per seed (function 287, 61-65% of every hour's " +
		"requests, gets a different model on each seed), node v100x4, 60 simulated minutes each; x: hour"}
	for _, h := range hours {
		add(&hourJobs, hr, strconv.Itoa(h+1), all, fromTrace("azure2019-500fn-8h.csv", nil, 500, 60, 60*h, 0),
			traceCfg("azure2019-500fn-8h.csv", nil, 500, 60, 60*h))
	}
	hw := &rep.Sweeps[2]
	*hw = sweep{Name: "azure-hours-without-287", What: "the same hours without function 287 (the other 499 " +
		"functions, 35-39% of the requests), Torpor's models drawn per seed; x: hour"}
	for _, h := range hoursWithout {
		add(&hourJobs, hw, strconv.Itoa(h+1), all, fromTrace("azure2019-500fn-8h.csv", []int{dominant}, 499, 60, 60*h, 0),
			traceCfg("azure2019-500fn-8h.csv", []int{dominant}, 499, 60, 60*h))
	}
	gm := &rep.Sweeps[3]
	*gm = sweep{Name: "bursty-arrivals", What: fmt.Sprintf("Torpor's node and trace at %d functions, Torpor's "+
		"models drawn per seed, 10 simulated minutes, each function's arrivals a renewal process with Gamma "+
		"inter-arrival times of the coefficient of variation x whose rate follows the trace's per-minute counts "+
		"(simulate.Config.ArrivalCV; 1 is Poisson); x: CV", burstyFunctions)}
	bursty := pick(all, "faas-gpu", "faas-gpu + admission", "faas-gpu (overload off) + admission", "torpor",
		"torpor + admission", "torpor (1 in flight) + admission", "gshare-dqls + admission")
	for _, cv := range cvs {
		add(&nodeJobs, gm, strconv.FormatFloat(cv, 'g', -1, 64), bursty,
			fromTrace("torpor-203fn-31min.csv", nil, burstyFunctions, 10, 0, cv),
			traceCfg("torpor-203fn-31min.csv", nil, burstyFunctions, 10, 0))
	}
	ta := &rep.Sweeps[4]
	*ta = sweep{Name: "torpor-arrivals", What: fmt.Sprintf("arrivals drawn as Torpor's node simulator draws them "+
		"(simulate.TorporArrivals) from its trace, its one model (19 ms, 25 ms swapped from host, 50 ms deadline) "+
		"and its node (100 models per GPU, 1.64x for two swaps behind one switch), %d minutes; faas-gpu with the "+
		"overload control on its default (auto) and off; torpor with its re-tuned alpha and with node_simu.py's "+
		"fixed alpha 0.01; each function one instance without the autoscaler (functions deployed without scale labels, "+
		"one request in flight each); x: functions", arrivalsMin)}
	for _, n := range []int{700} {
		add(&arrivalJobs, ta, strconv.Itoa(n), pick(all, "faas-gpu", "faas-gpu (overload off)",
			"faas-gpu + admission", "torpor", "torpor (alpha 0.01)", "torpor + admission"),
			func(seed uint64) (string, func() ([]simulate.Arrival, error)) {
				return fmt.Sprintf("torpor-arrivals/%d/%d/%d", n, arrivalsMin, seed),
					func() ([]simulate.Arrival, error) {
						tr, _, err := in.load("torpor-203fn-31min.csv", "models-torpor-v100.csv")
						if err != nil {
							return nil, err
						}
						return simulate.TorporArrivals(tr, n, arrivalsMin, seed)
					}
			},
			func(seed uint64) (simulate.Config, error) {
				// One instance per function, not autoscaled (functions without scale labels): with the autoscaler
				// a run of this sweep takes tens of minutes (product.go).
				return simulate.Config{Models: simuModels, Functions: n, Node: simuNode, MemoryFactor: 1, Seed: seed,
					Instances: 1}, nil
			})
	}
	pr := &rep.Sweeps[5]
	*pr = sweep{Name: "product", What: "faas-gpu with the admission rule as shipped (simulate.Product) and with each " +
		"part of the product's behaviour changed (what changed: see the section above); x: Azure hour 1 (500 " +
		"functions, Torpor's models drawn per seed) and Torpor's trace at 560 functions (10 minutes)"}
	add(&hourJobs, pr, "azure-1", productVariants(), fromTrace("azure2019-500fn-8h.csv", nil, 500, 60, 0, 0),
		traceCfg("azure2019-500fn-8h.csv", nil, 500, 60, 0))
	add(&nodeJobs, pr, "torpor-560", productVariants(), fromTrace("torpor-203fn-31min.csv", nil, 560, 10, 0, 0),
		traceCfg("torpor-203fn-31min.csv", nil, 560, 10, 0))
	clusterJobs, sizings, router, err := clusterRuns(in, node, seeds, clusterMin, rep.ClusterTarget, rep.RouterNodes)
	if err != nil {
		return err
	}
	rep.Sizing, rep.Router = sizings, router
	// The longest runs first: the 8-hour cluster runs, Torpor's arrivals (31 minutes at 700 functions), the
	// Azure hours, Torpor's node.
	jobs := slices.Concat(clusterJobs, shareJobs, arrivalJobs, hourJobs, nodeJobs)
	if err := runJobs(jobs, *parallel); err != nil {
		return err
	}
	rep.WallSeconds = time.Since(start).Seconds()
	rep.CPUSeconds = cpuSeconds()
	rep.LoadEnd = loadAverage()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	name := "policy"
	if *quick {
		name = "policy-quick"
	}
	if err := os.WriteFile(filepath.Join(*out, name+".json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := shareFinish(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, name+".md"), []byte(markdown(rep)), 0o644)
}

// Cluster sizing: clusters of 1 to maxNodes nodes.
const maxNodes = 8

// clusterRuns builds the cluster jobs over the 500 functions of the Azure trace with Torpor's models, the runs of
// one seed next to each other (they share its arrivals). Sizing finds, per seed, the fewest GPUs with which each
// policy keeps target of the functions within their SLO: fixed clusters of v100x4 nodes, from one node, grown one
// node at a time until the target is reached (at most maxNodes); a cluster that misses the target is stopped as
// soon as it can no longer reach it (simulate.Config.StopBelow), except the largest, which runs to the end so that
// its figures are complete. Keep-alive runs on a GPU per instance (10 minutes, and prewarmed). The router runs
// faas-gpu on a fixed cluster of routerNodes with the router and with round robin.
func clusterRuns(in *inputs, node topology.Node, seeds []uint64, minutes int, target float64,
	routerNodes int) ([]job, []sizing, []cell, error) {
	tr, ms, err := in.load("azure2019-500fn-8h.csv", "models-torpor-v100.csv")
	if err != nil {
		return nil, nil, nil, err
	}
	policies := []variant{{name: "faas-gpu", policy: controller.PolicyFaaSGPU},
		{name: "torpor", policy: controller.PolicyTorpor}, {name: "gshare-dqls", policy: controller.PolicyGShareDQLS},
		{name: "static", policy: controller.PolicyStatic},
		{name: "static (remoted times)", policy: controller.PolicyStatic, remoted: true},
		{name: "static-deadline (remoted times)", policy: controller.PolicyStaticDeadline, remoted: true}}
	sizings := make([]sizing, 0, len(policies)+2)
	newSizing := func(name string) sizing {
		return sizing{Policy: name, Runs: make([]outcome, len(seeds)), Reached: make([]bool, len(seeds)),
			Missed: make([][]miss, len(seeds))}
	}
	for _, p := range policies {
		sizings = append(sizings, newSizing(p.name))
	}
	sizings = append(sizings, newSizing("keepalive (10 min)"), newSizing("keepalive (prewarmed)"))
	router := []cell{{Policy: "router", Runs: make([]outcome, len(seeds))},
		{Policy: "round robin", Runs: make([]outcome, len(seeds))}}
	var jobs, cheap []job
	for si, seed := range seeds {
		base := simulate.Config{Trace: tr, Models: ms, Functions: 500, Node: node, Minutes: minutes, Seed: seed,
			Assign: simulate.AssignSeeded}
		key := fmt.Sprintf("cluster/%d/%d", minutes, seed)
		build := func() ([]simulate.Arrival, error) { return simulate.TraceArrivals(base) }
		// with runs f on the seed's arrivals.
		with := func(f func(arr []simulate.Arrival) (outcome, error)) func() (outcome, error) {
			in.want(key)
			return func() (outcome, error) {
				defer in.release(key)
				arr, err := in.arrivals(key, build)
				if err != nil {
					return outcome{}, err
				}
				return f(arr)
			}
		}
		for pi, p := range policies {
			s := &sizings[pi]
			jobs = append(jobs, job{name: fmt.Sprintf("cluster %s seed %d", p.name, seed), out: &s.Runs[si],
				run: with(func(arr []simulate.Arrival) (outcome, error) {
					for n := 1; ; n++ {
						cfg := base
						p.apply(&cfg)
						clusterConcurrency(&cfg)
						cfg.Arrivals = arr
						if n < maxNodes {
							cfg.StopBelow = target
						}
						r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: n})
						if err != nil {
							return outcome{}, err
						}
						o := fromCluster(seed, r)
						if !r.Stopped && o.fnShare() >= target {
							s.Reached[si] = true
							return o, nil
						}
						if n == maxNodes {
							return o, nil
						}
						s.Missed[si] = append(s.Missed[si], miss{Nodes: n, StoppedAtMinutes: r.SimulatedSeconds / 60})
					}
				})})
		}
		for ci := range router {
			c := &router[ci]
			jobs = append(jobs, job{name: fmt.Sprintf("router %s seed %d", c.Policy, seed), out: &c.Runs[si],
				run: with(func(arr []simulate.Arrival) (outcome, error) {
					cfg := base
					cfg.Arrivals, cfg.Policy = arr, controller.PolicyFaaSGPU
					r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: routerNodes,
						RoundRobin: ci == 1})
					o := fromCluster(seed, r)
					o.ImageLoads = r.ImageLoads
					return o, err
				})})
		}
		for k, prewarmed := range []bool{false, true} {
			s := &sizings[len(policies)+k]
			cheap = append(cheap, job{name: fmt.Sprintf("cluster %s seed %d", s.Policy, seed), out: &s.Runs[si],
				run: with(func(arr []simulate.Arrival) (outcome, error) {
					cfg := base
					cfg.Arrivals, cfg.Policy = arr, controller.PolicyKeepAlive
					r, err := simulate.RunKeepAlive(simulate.KeepAliveConfig{Config: cfg, Prewarmed: prewarmed})
					o := fromCluster(seed, r)
					s.Reached[si] = o.fnShare() >= target
					return o, err
				})})
		}
	}
	// Keep-alive is quick: each seed's runs go right after the seed's others, while its arrivals are at hand.
	var ordered []job
	per := len(jobs) / len(seeds)
	for si := range seeds {
		ordered = append(ordered, jobs[si*per:(si+1)*per]...)
		ordered = append(ordered, cheap[si*2:si*2+2]...)
	}
	return ordered, sizings, router, nil
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

// loadAverage is the machine's 1-minute load average (0 where /proc/loadavg cannot be read).
func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// cpuSeconds is the processor time this process has used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// dominant is the row of azure2019-500fn-8h.csv that carries 61-65% of every hour's requests.
const dominant = 287

// burstyFunctions is the size of the bursty-arrivals sweep (Torpor's trace).
const burstyFunctions = 560

// variant is one policy as a benchmark runs it: a controller policy with its settings.
type variant struct {
	name      string
	policy    controller.Policy
	overload  controller.Overload
	admission bool
	inFlight  int     // at most so many requests of a function bound at once (0: unlimited)
	alpha     float64 // fixed Torpor alpha (0: re-tuned)
	remoted   bool    // charged the remoted execution times
	// shape changes the product's behaviour for this variant (product.go)
	shape func(cfg *simulate.Config)
}

func (v variant) apply(cfg *simulate.Config) {
	asShipped(cfg, v) // the product's instances, autoscaler and data plane (product.go)
	cfg.Policy, cfg.Overload, cfg.Alpha, cfg.RemotedTimes = v.policy, v.overload, v.alpha, v.remoted
	if v.admission {
		cfg.Admission = controller.AdmissionDeadline
	}
}

// variants are the node sweeps' policies: faas-gpu with its overload control on its default (auto) and off; the
// baselines as their authors run them (torpor with its re-tuned alpha, with one request in flight per function
// as its router allows, and with alpha fixed at 0.01 as its node simulator runs it; gShare's least-slack-first);
// each of them with and without the admission rule (gshare-dqls with it is gShare's redirect of hopeless requests
// as a single-node refusal); the ablations (full runs only) and native binding without it.
func variants(ablations bool) []variant {
	off := controller.Overload{Mode: controller.OverloadOff}
	base := []variant{
		{name: "faas-gpu", policy: controller.PolicyFaaSGPU},
		{name: "faas-gpu (overload off)", policy: controller.PolicyFaaSGPU, overload: off},
		{name: "torpor", policy: controller.PolicyTorpor},
		{name: "torpor (1 in flight)", policy: controller.PolicyTorpor, inFlight: 1},
		{name: "torpor (alpha 0.01)", policy: controller.PolicyTorpor, alpha: 0.01},
		{name: "gshare-dqls", policy: controller.PolicyGShareDQLS},
	}
	var out []variant
	for _, v := range base {
		w := v
		w.name, w.admission = v.name+" + admission", true
		out = append(out, v, w)
	}
	if ablations {
		out = append(out, variant{name: "fifo", policy: controller.PolicyFIFO},
			variant{name: "random-placement", policy: controller.PolicyRandomPlacement},
			variant{name: "lru-eviction", policy: controller.PolicyLRUEviction})
	}
	return append(out, variant{name: "native", policy: controller.PolicyNative})
}

// pick returns the variants named, in that order.
func pick(vs []variant, names ...string) []variant {
	var out []variant
	for _, n := range names {
		for _, v := range vs {
			if v.name == n {
				out = append(out, v)
			}
		}
	}
	return out
}
