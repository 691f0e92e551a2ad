// Command benchpolicy runs the policy benchmarks of `make bench-policy` and writes docs/bench/policy.{md,json,png}
// and docs/bench/policy-cluster.png: every policy side by side on the Torpor node experiment, on the Azure 2019
// trace with Clockwork's models and, overloaded, with Torpor's models (each result beside the offline upper
// bound); partial residency on the Torpor node; the cluster over the whole 8-hour Azure trace (GPUs needed per
// policy against keep-alive and native binding); the simulator's speed on a day of a 16-node cluster; and the
// headline conclusions checked on three seeds. With -previous, the figures of an earlier policy.json are shown
// beside the new ones.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

type experiment struct {
	Name    string                       `json:"name"`
	Trace   string                       `json:"trace"`
	Models  string                       `json:"models"`
	Node    string                       `json:"node"`
	Minutes int                          `json:"minutes"`
	Counts  []int                        `json:"function_counts"`
	Results map[string][]simulate.Result `json:"results"` // policy -> one per count
	Bounds  []simulate.Bound             `json:"offline_bounds"`
}

type partialRow struct {
	Functions int             `json:"functions"`
	Without   simulate.Result `json:"without"`
	With      simulate.Result `json:"with"`
}

type clusterReport struct {
	Trace   string                   `json:"trace"`
	Models  string                   `json:"models"`
	Node    string                   `json:"node"`
	Minutes int                      `json:"minutes"`
	Funcs   int                      `json:"functions"`
	Runs    []simulate.ClusterResult `json:"runs"`
	Target  float64                  `json:"target_share"`
	// Needed is, per policy, the fewest GPUs provisioned (fixed cluster: nodes x GPUs; autoscaled: the mean) with
	// which at least Target of the functions met their SLO; absent when no run reached it.
	Needed map[string]float64 `json:"gpus_needed"`
}

type seedCheck struct {
	Seed           uint64  `json:"seed"`
	OverloadFaaS   int     `json:"overload_faas_gpu"`
	OverloadBest   int     `json:"overload_best_other"`
	OverloadBestBy string  `json:"overload_best_other_policy"`
	OverloadActive int     `json:"overload_active"`
	OverloadBound  int     `json:"overload_bound"`
	ClusterFaaS    float64 `json:"cluster_faas_gpu_gpus"`
	ClusterShare   float64 `json:"cluster_faas_gpu_share"`
	ClusterKA      float64 `json:"cluster_keepalive_gpus"`
	ClusterKAShare float64 `json:"cluster_keepalive_share"`
	PartialBytes   [2]uint64
	PartialP99     [2]float64
}

type report struct {
	Seed        uint64          `json:"seed"`
	Seeds       []uint64        `json:"check_seeds"`
	GoVersion   string          `json:"go_version"`
	CPUs        int             `json:"nproc"`
	CPUModel    string          `json:"cpu_model"`
	Commit      string          `json:"commit"`
	Started     string          `json:"started"`
	WallSeconds float64         `json:"wall_seconds"`
	Policies    []string        `json:"policy_order"`
	Experiments []experiment    `json:"experiments"`
	Partial     []partialRow    `json:"partial_residency"`
	Cluster     clusterReport   `json:"cluster"`
	Speed       json.RawMessage `json:"speed"`
	Checks      []seedCheck     `json:"seed_checks"`
}

type speedRun struct {
	Functions  int     `json:"functions"`
	Nodes      int     `json:"nodes"`
	Minutes    int     `json:"minutes"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	Requests   int64   `json:"requests"`
	Events     int64   `json:"events"`
	Wall       float64 `json:"wall_seconds"`
	PerSecond  float64 `json:"events_per_second"`
	SLOMet     string  `json:"slo_met"`
}

type inputs struct {
	dir    string
	traces map[string]*simulate.Trace
	models map[string][]simulate.Model
}

func (in *inputs) load(trace, models string) (*simulate.Trace, []simulate.Model, error) {
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

func counts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive count", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run() error {
	workloads := flag.String("workloads", "../shared/workloads", "directory of the shared workload CSVs")
	out := flag.String("out", "docs/bench", "output directory")
	countsArg := flag.String("counts", "40,80,160,320,480,560,720", "function counts of the node sweeps")
	overloadArg := flag.String("overload-counts", "250,500,750,1000,1250", "function counts of the overload sweep")
	seed := flag.Uint64("seed", 1, "seed of the figures")
	seedsArg := flag.String("check-seeds", "1,2,3", "seeds the headline conclusions are checked on")
	torporMin := flag.Int("torpor-minutes", 10, "simulated minutes of the Torpor trace")
	azureMin := flag.Int("azure-minutes", 60, "simulated minutes of the Azure trace (node sweeps)")
	clusterMin := flag.Int("cluster-minutes", 480, "simulated minutes of the cluster runs (the whole 8-hour trace)")
	speedMin := flag.Int("speed-minutes", 1440, "simulated minutes of the speed run (a day: the trace repeats)")
	previous := flag.String("previous", "", "an earlier policy.json whose figures are shown beside the new ones")
	flag.Parse()
	nodeCounts, err := counts("counts", *countsArg)
	if err != nil {
		return err
	}
	overloadCounts, err := counts("overload-counts", *overloadArg)
	if err != nil {
		return err
	}
	var seeds []uint64
	for _, f := range strings.Split(*seedsArg, ",") {
		s, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("-check-seeds: %q is not a seed", f)
		}
		seeds = append(seeds, s)
	}
	var prev *report
	if *previous != "" {
		data, err := os.ReadFile(*previous)
		if err != nil {
			return fmt.Errorf("-previous: %w", err)
		}
		prev = &report{}
		if err := json.Unmarshal(data, prev); err != nil {
			return fmt.Errorf("-previous: %w", err)
		}
	}
	in := &inputs{dir: *workloads, traces: map[string]*simulate.Trace{}, models: map[string][]simulate.Model{}}
	node, err := topology.Preset("v100x4")
	if err != nil {
		return err
	}
	start := time.Now()
	rep := report{Seed: *seed, Seeds: seeds, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
		CPUModel: cpuModel(), Commit: gitCommit(), Started: start.UTC().Format(time.RFC3339)}
	for _, p := range controller.Policies() {
		rep.Policies = append(rep.Policies, string(p))
	}
	exps := []experiment{
		{Name: "torpor-node", Trace: "torpor-203fn-31min.csv", Models: "models-torpor-v100.csv", Node: "v100x4",
			Minutes: *torporMin, Counts: nodeCounts},
		{Name: "azure2019", Trace: "azure2019-500fn-8h.csv", Models: "models-clockwork-v100.csv", Node: "v100x4",
			Minutes: *azureMin, Counts: nodeCounts},
		{Name: "azure2019-overload", Trace: "azure2019-500fn-8h.csv", Models: "models-torpor-v100.csv",
			Node: "v100x4", Minutes: *azureMin, Counts: overloadCounts},
	}
	for ei := range exps {
		e := &exps[ei]
		if err := sweep(in, node, e, *seed); err != nil {
			return err
		}
	}
	rep.Experiments = exps
	if rep.Partial, err = partialSweep(in, node, []int{320, 480, 560, 720}, *torporMin, *seed); err != nil {
		return err
	}
	if rep.Cluster, err = clusterSweep(in, node, *clusterMin, *seed); err != nil {
		return err
	}
	speed, err := speedRun1(in, node, *speedMin, *seed)
	if err != nil {
		return err
	}
	if rep.Speed, err = json.Marshal(speed); err != nil {
		return err
	}
	for _, s := range seeds {
		c, err := check(in, node, s, *azureMin, *clusterMin, *torporMin)
		if err != nil {
			return err
		}
		rep.Checks = append(rep.Checks, c)
	}
	rep.WallSeconds = time.Since(start).Seconds()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "policy.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := plots(*out, rep); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "policy.md"), []byte(markdown(rep, speed, prev)), 0o644)
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

// sweep runs every policy at every count of e, with the offline bound.
func sweep(in *inputs, node topology.Node, e *experiment, seed uint64) error {
	tr, ms, err := in.load(e.Trace, e.Models)
	if err != nil {
		return err
	}
	e.Results = map[string][]simulate.Result{}
	for _, n := range e.Counts {
		cfg := simulate.Config{Trace: tr, Models: ms, Functions: n, Node: node, Minutes: e.Minutes,
			Policy: controller.PolicyFaaSGPU, Seed: seed}
		b, err := simulate.OfflineBound(cfg)
		if err != nil {
			return err
		}
		e.Bounds = append(e.Bounds, b)
		for _, p := range controller.Policies() {
			cfg.Policy = p
			r, err := simulate.Run(cfg, false)
			if err != nil {
				return fmt.Errorf("%s %d %s: %w", e.Name, n, p, err)
			}
			logf("%s %4d %-17s %4d/%4d functions (bound %d), %d/%d requests on time (%.1fs)", e.Name, n, p,
				r.FunctionsSLOMet, r.FunctionsWithTraffic, b.Functions, r.RequestsOnTime, r.Requests, r.WallSeconds)
			e.Results[string(p)] = append(e.Results[string(p)], r)
		}
	}
	return nil
}

func partialSweep(in *inputs, node topology.Node, ns []int, minutes int, seed uint64) ([]partialRow, error) {
	tr, ms, err := in.load("torpor-203fn-31min.csv", "models-torpor-v100.csv")
	if err != nil {
		return nil, err
	}
	var rows []partialRow
	for _, n := range ns {
		row := partialRow{Functions: n}
		for _, partial := range []bool{false, true} {
			r, err := simulate.Run(simulate.Config{Trace: tr, Models: ms, Functions: n, Node: node, Minutes: minutes,
				Policy: controller.PolicyFaaSGPU, Seed: seed, PartialResidency: partial}, false)
			if err != nil {
				return nil, err
			}
			logf("partial %v %d: %d/%d functions, %.1f GB swapped, p99 %.2f", partial, n, r.FunctionsSLOMet,
				r.FunctionsWithTraffic, float64(r.SwappedBytes)/1e9, r.P99)
			if partial {
				row.With = r
			} else {
				row.Without = r
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// clusterSweep runs the 500 functions of the Azure trace with Torpor's models over the whole trace: each late-
// binding policy on fixed clusters of 1 to 4 nodes and autoscaled, native binding on growing clusters until every
// function has a GPU, and keep-alive (lazy and prewarmed).
func clusterSweep(in *inputs, node topology.Node, minutes int, seed uint64) (clusterReport, error) {
	const functions, target = 500, 0.98
	cr := clusterReport{Trace: "azure2019-500fn-8h.csv", Models: "models-torpor-v100.csv", Node: node.Name,
		Minutes: minutes, Funcs: functions, Target: target, Needed: map[string]float64{}}
	tr, ms, err := in.load(cr.Trace, cr.Models)
	if err != nil {
		return cr, err
	}
	base := simulate.Config{Trace: tr, Models: ms, Functions: functions, Node: node, Minutes: minutes, Seed: seed}
	note := func(r simulate.ClusterResult, err error) error {
		if err != nil {
			return fmt.Errorf("cluster %s: %w", r.Name, err)
		}
		logf("cluster %-19s nodes %d autoscale %-5v %3d/%3d functions, GPUs mean %.1f peak %d (%.1fs)", r.Name,
			r.NodesStart, r.Autoscale, r.FunctionsSLOMet, r.FunctionsWithTraffic, r.GPUsMean, r.GPUsPeak,
			r.WallSeconds)
		cr.Runs = append(cr.Runs, r)
		if r.FunctionsSLOMetShare >= target {
			g := r.GPUsMean
			if have, ok := cr.Needed[r.Name]; !ok || g < have {
				cr.Needed[r.Name] = g
			}
		}
		return nil
	}
	for _, p := range []controller.Policy{controller.PolicyFaaSGPU, controller.PolicyTorpor, controller.PolicyFIFO,
		controller.PolicyGShareDQLS} {
		cfg := base
		cfg.Policy = p
		for n := 1; n <= 4; n++ {
			r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: n})
			if err := note(r, err); err != nil {
				return cr, err
			}
		}
		r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: 1, Autoscale: true})
		r.Name += " (autoscaled)"
		if err := note(r, err); err != nil {
			return cr, err
		}
	}
	cfg := base
	cfg.Policy = controller.PolicyNative
	best := -1.0
	for n := 2; n <= 16; n += 2 { // until it reaches the target or more nodes stop helping
		r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: n})
		if err := note(r, err); err != nil {
			return cr, err
		}
		if r.FunctionsSLOMetShare >= target || r.FunctionsSLOMetShare <= best {
			break
		}
		best = r.FunctionsSLOMetShare
	}
	cfg.Policy = controller.PolicyKeepAlive
	for _, prewarmed := range []bool{false, true} {
		r, err := simulate.RunKeepAlive(simulate.KeepAliveConfig{Config: cfg, Prewarmed: prewarmed})
		if err := note(r, err); err != nil {
			return cr, err
		}
	}
	return cr, nil
}

func speedRun1(in *inputs, node topology.Node, minutes int, seed uint64) (speedRun, error) {
	tr, ms, err := in.load("azure2019-500fn-8h.csv", "models-torpor-v100.csv")
	if err != nil {
		return speedRun{}, err
	}
	old := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(old)
	runtime.GC()
	r, err := simulate.RunCluster(simulate.ClusterConfig{Config: simulate.Config{Trace: tr, Models: ms,
		Functions: 1000, Node: node, Minutes: minutes, Policy: controller.PolicyFaaSGPU, Seed: seed}, Nodes: 16})
	if err != nil {
		return speedRun{}, err
	}
	s := speedRun{Functions: 1000, Nodes: 16, Minutes: minutes, GOMAXPROCS: 1, Requests: r.Requests,
		Events: r.Events, Wall: r.WallSeconds, PerSecond: r.EventsPerSecond,
		SLOMet: fmt.Sprintf("%d/%d", r.FunctionsSLOMet, r.FunctionsWithTraffic)}
	logf("speed: %d events in %.1f s (%.0f events/s)", s.Events, s.Wall, s.PerSecond)
	return s, nil
}

// check reruns the headline comparisons on one seed.
func check(in *inputs, node topology.Node, seed uint64, azureMin, clusterMin, torporMin int) (seedCheck, error) {
	c := seedCheck{Seed: seed}
	tr, ms, err := in.load("azure2019-500fn-8h.csv", "models-torpor-v100.csv")
	if err != nil {
		return c, err
	}
	cfg := simulate.Config{Trace: tr, Models: ms, Functions: 1000, Node: node, Minutes: azureMin, Seed: seed}
	b, err := simulate.OfflineBound(cfg)
	if err != nil {
		return c, err
	}
	c.OverloadBound = b.Functions
	for _, p := range controller.Policies() {
		if p == controller.PolicyKeepAlive || p == controller.PolicyNative {
			continue // far below (see the sweep); slow to simulate overloaded
		}
		cfg.Policy = p
		r, err := simulate.Run(cfg, false)
		if err != nil {
			return c, err
		}
		c.OverloadActive = r.FunctionsWithTraffic
		if p == controller.PolicyFaaSGPU {
			c.OverloadFaaS = r.FunctionsSLOMet
		} else if r.FunctionsSLOMet > c.OverloadBest || c.OverloadBestBy == "" {
			c.OverloadBest, c.OverloadBestBy = r.FunctionsSLOMet, string(p)
		}
	}
	cc := simulate.Config{Trace: tr, Models: ms, Functions: 500, Node: node, Minutes: clusterMin, Seed: seed,
		Policy: controller.PolicyFaaSGPU}
	r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cc, Nodes: 1, Autoscale: true})
	if err != nil {
		return c, err
	}
	c.ClusterFaaS, c.ClusterShare = r.GPUsMean, r.FunctionsSLOMetShare
	cc.Policy = controller.PolicyKeepAlive
	ka, err := simulate.RunKeepAlive(simulate.KeepAliveConfig{Config: cc, Prewarmed: true})
	if err != nil {
		return c, err
	}
	c.ClusterKA, c.ClusterKAShare = ka.GPUsMean, ka.FunctionsSLOMetShare
	ttr, tms, err := in.load("torpor-203fn-31min.csv", "models-torpor-v100.csv")
	if err != nil {
		return c, err
	}
	for i, partial := range []bool{false, true} {
		r, err := simulate.Run(simulate.Config{Trace: ttr, Models: tms, Functions: 720, Node: node,
			Minutes: torporMin, Policy: controller.PolicyFaaSGPU, Seed: seed, PartialResidency: partial}, false)
		if err != nil {
			return c, err
		}
		c.PartialBytes[i], c.PartialP99[i] = r.SwappedBytes, r.P99
	}
	logf("seed %d: overload faas-gpu %d (best other %s %d) of %d, bound %d; cluster %.1f GPUs vs keep-alive %.1f",
		seed, c.OverloadFaaS, c.OverloadBestBy, c.OverloadBest, c.OverloadActive, c.OverloadBound, c.ClusterFaaS,
		c.ClusterKA)
	return c, nil
}

func plots(out string, rep report) error {
	var panels []simulate.Panel
	for _, e := range rep.Experiments {
		var ss []simulate.Series
		maxX := 0.0
		for _, n := range e.Counts {
			maxX = max(maxX, float64(n))
		}
		for pi, p := range rep.Policies {
			s := simulate.Series{Name: p, Color: simulate.Palette[pi%len(simulate.Palette)]}
			for i, r := range e.Results[p] {
				s.X = append(s.X, float64(e.Counts[i]))
				s.Y = append(s.Y, r.FunctionsSLOMetShare)
			}
			ss = append(ss, s)
		}
		bound := simulate.Series{Name: "offline bound", Color: simulate.Palette[len(simulate.Palette)-1],
			Dashed: true}
		for i, b := range e.Bounds {
			bound.X = append(bound.X, float64(e.Counts[i]))
			bound.Y = append(bound.Y, b.Share)
		}
		ss = append(ss, bound)
		step := 80.0
		if maxX > 800 {
			step = 250
		}
		panels = append(panels, simulate.Panel{Title: fmt.Sprintf("%s: %s, %s, %d min", e.Name,
			strings.TrimSuffix(e.Trace, ".csv"), strings.TrimSuffix(e.Models, ".csv"), e.Minutes), Series: ss,
			XMax: maxX * 1.05, XStep: step})
	}
	var png bytes.Buffer
	if err := simulate.PlotPanels(&png, panels, 760, 80, "functions", "share of functions meeting their SLO"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "policy.png"), png.Bytes(), 0o644); err != nil {
		return err
	}
	var bars []simulate.Bar
	for i, name := range sortedNeeded(rep.Cluster) {
		label := strings.Replace(name, " (", "\n(", 1)
		bars = append(bars, simulate.Bar{Label: label, Value: rep.Cluster.Needed[name],
			Color: simulate.Palette[i%len(simulate.Palette)]})
	}
	for _, m := range missed(rep.Cluster) { // never reached the target: its best run, greyed
		bars = append(bars, simulate.Bar{Label: fmt.Sprintf("%s\n(best %.1f%%)", m.Name, 100*m.FunctionsSLOMetShare),
			Value: m.GPUsMean, Color: color.RGBA{170, 170, 170, 255}})
	}
	png.Reset()
	if err := simulate.PlotBars(&png, fmt.Sprintf("GPUs needed for %.0f%% of functions within SLO (grey: never reached), %s, %d functions, %.1f h",
		100*rep.Cluster.Target, strings.TrimSuffix(rep.Cluster.Trace, ".csv"), rep.Cluster.Funcs,
		float64(rep.Cluster.Minutes)/60), "GPUs (mean provisioned, log scale)", bars); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "policy-cluster.png"), png.Bytes(), 0o644)
}

var errNoResult = errors.New("no result")

// missed lists, for each policy of the cluster runs that never reached the target, its best run (the highest
// share, then the fewest GPUs).
func missed(cl clusterReport) []simulate.ClusterResult {
	best := map[string]simulate.ClusterResult{}
	var order []string
	for _, r := range cl.Runs {
		if _, ok := cl.Needed[r.Name]; ok {
			continue
		}
		b, seen := best[r.Name]
		if !seen {
			order = append(order, r.Name)
		}
		if !seen || r.FunctionsSLOMetShare > b.FunctionsSLOMetShare ||
			r.FunctionsSLOMetShare == b.FunctionsSLOMetShare && r.GPUsMean < b.GPUsMean {
			best[r.Name] = r
		}
	}
	out := make([]simulate.ClusterResult, 0, len(order))
	for _, name := range order {
		out = append(out, best[name])
	}
	return out
}

func find(e experiment, policy string, n int) (simulate.Result, error) {
	i := slices.Index(e.Counts, n)
	if i < 0 || i >= len(e.Results[policy]) {
		return simulate.Result{}, errNoResult
	}
	return e.Results[policy][i], nil
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
