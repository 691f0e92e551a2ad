package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/internal/benchhost"
)

// The compute-sharing sweep: the product's faas-gpu (+ admission, simulate.Product) with every
// function exclusive (today) and with the functions asking for compute shares under static shares (HAMi-like),
// gShare's time slices and Dilu's request/limit (gpuserver/simulate/share.go: the latency-against-share model is an
// assumption), side by side on Torpor's trace at 560 functions, the Azure hours, bursty Gamma arrivals (CV 1, 2,
// 4, 6) and cluster sizing on the 8-hour trace at 98% of functions; writes sharing{,-quick}.{md,json}.

// sharingFlags are the sweep's flags.
type sharingFlags struct{ mode *string }

func registerSharing() sharingFlags {
	return sharingFlags{mode: flag.String("sharing", "on", "the compute-sharing sweep (sharing.go, writes "+
		"sharing.{md,json}): on (beside the others), off, or only (it alone)")}
}

func (f sharingFlags) check() error {
	switch *f.mode {
	case "on", "off", "only":
		return nil
	}
	return fmt.Errorf("-sharing: %q (want on, off or only)", *f.mode)
}

// shareRun is one run's figures beyond outcome's.
type shareRun struct {
	outcome
	P95   float64 `json:"latency_p95_over_deadline"`
	CoRan int64   `json:"corun_bound"`
}

type shareCell struct {
	Policy string     `json:"policy"`
	Runs   []shareRun `json:"runs"`
}

type sharePoint struct {
	Label string      `json:"label"`
	Cells []shareCell `json:"cells"`
}

type shareSweep struct {
	Name   string       `json:"name"`
	What   string       `json:"what"`
	Points []sharePoint `json:"points"`
}

type shareSizing struct {
	Policy  string     `json:"policy"`
	Runs    []shareRun `json:"runs"`
	Reached []bool     `json:"reached"`
	// GPUs per seed: the fewest one-GPU nodes reaching the target (else the most tried).
	GPUs []int `json:"gpus"`
}

type shareReport struct {
	Quick       bool     `json:"quick"`
	Seeds       []uint64 `json:"seeds"`
	GoVersion   string   `json:"go_version"`
	CPUs        int      `json:"nproc"`
	CPUModel    string   `json:"cpu_model"`
	Commit      string   `json:"commit"`
	Command     string   `json:"command"`
	Started     string   `json:"started"`
	WallSeconds float64  `json:"wall_seconds"`
	LoadStart   float64  `json:"load_start"`
	LoadEnd     float64  `json:"load_end"`
	// Profile is the assumed latency-against-share profile (u per model) and the shares each model asks for.
	Profile        map[string][3]float64 `json:"profile_u_request_limit"`
	Slowdown       float64               `json:"colocation_slowdown"`
	Sweeps         []shareSweep          `json:"sweeps"`
	ClusterTarget  float64               `json:"cluster_target"`
	ClusterMinutes int                   `json:"cluster_minutes"`
	MaxGPUs        int                   `json:"cluster_max_gpus"`
	Sizing         []shareSizing         `json:"cluster_sizing"`
}

// sharePolicies are the policies compared, exclusive (the reference) first.
var sharePolicyNames = []simulate.SharePolicy{simulate.ShareExclusive, simulate.ShareStatic, simulate.ShareGShare,
	simulate.ShareDilu}

// oneV100 is a node of one of v100x4's GPUs (cluster sizing counts GPUs one at a time).
const oneV100 = `name: v100x1
gpus:
- {name: Tesla V100-SXM2-32GB, memory_bytes: 34088157184, pcie_switch: 0, copy_engines: 2, h2d_bytes_per_sec: 12e9}
switch_uplink_bytes_per_sec: [12e9]
nvlink_bytes_per_sec: [[0]]
transfer_latency_sec: 20e-6
`

// sharingJobs builds the sweep's jobs; finish writes its report once they have run.
func sharingJobs(in *inputs, node topology.Node, seeds []uint64, quick bool, out string) ([]job, func() error, error) {
	hours, cvs, clusterMin, maxGPUs := []int{0, 1, 2, 3, 4, 5, 6, 7}, []float64{1, 2, 4, 6}, 480, 8
	if quick {
		hours, cvs, clusterMin = []int{0, 1}, []float64{1, 6}, 120
	}
	start := time.Now()
	rep := &shareReport{Quick: quick, Seeds: seeds, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(),
		CPUModel: benchhost.CPUModel(), Commit: gitCommit(), Command: strings.Join(append([]string{"go run ./test/bench/policy"},
			os.Args[1:]...), " "), Started: start.UTC().Format(time.RFC3339), LoadStart: loadAverage(),
		Profile: map[string][3]float64{}, Slowdown: simulate.DefaultCoLocationSlowdown, ClusterTarget: 0.98,
		ClusterMinutes: clusterMin, MaxGPUs: maxGPUs}
	for m, p := range simulate.DefaultShareProfile() {
		rep.Profile[m] = [3]float64{p.U, p.Request(), p.Limit()}
	}
	fg := variant{name: refName, policy: controller.PolicyFaaSGPU, admission: true}
	var jobs []job
	// add appends a point: every policy on every seed, on the arrivals of arrivals(seed) and cfg(seed).
	add := func(sw *shareSweep, label string, arrivals func(seed uint64) (string, func() ([]simulate.Arrival, error)),
		cfg func(seed uint64) (simulate.Config, error)) {
		pt := sharePoint{Label: label}
		for _, p := range sharePolicyNames {
			pt.Cells = append(pt.Cells, shareCell{Policy: string(p), Runs: make([]shareRun, len(seeds))})
		}
		sw.Points = append(sw.Points, pt)
		cur := &sw.Points[len(sw.Points)-1]
		for si, seed := range seeds {
			key, build := arrivals(seed)
			for ci, p := range sharePolicyNames {
				c := &cur.Cells[ci]
				in.want(key)
				var sink outcome
				jobs = append(jobs, job{name: fmt.Sprintf("sharing %s %s %s seed %d", sw.Name, label, p, seed),
					out: &sink, run: func() (outcome, error) {
						defer in.release(key)
						sc, err := cfg(seed)
						if err != nil {
							return outcome{}, err
						}
						fg.apply(&sc)
						sc.Sharing = simulate.Sharing{Policy: p}
						if sc.Arrivals, err = in.arrivals(key, build); err != nil {
							return outcome{}, err
						}
						r, err := simulate.Run(sc, false)
						o := fromResult(seed, r)
						c.Runs[si] = shareRun{outcome: o, P95: r.P95, CoRan: r.CoRunBound}
						return o, err
					}})
			}
		}
	}
	trace := func(name string, functions, minutes, startMinute int, cv float64) (func(uint64) (string,
		func() ([]simulate.Arrival, error)), func(uint64) (simulate.Config, error)) {
		cfg := func(seed uint64) (simulate.Config, error) {
			tr, ms, err := in.load(name, "models-torpor-v100.csv")
			return simulate.Config{Trace: tr, Models: ms, Functions: functions, Node: node, Minutes: minutes,
				StartMinute: startMinute, Seed: seed, Assign: simulate.AssignSeeded, ArrivalCV: cv}, err
		}
		arr := func(seed uint64) (string, func() ([]simulate.Arrival, error)) {
			return fmt.Sprintf("%s-[]/%d/%d+%d/cv%g/%d", name, functions, startMinute, minutes, cv, seed),
				func() ([]simulate.Arrival, error) {
					c, err := cfg(seed)
					if err != nil {
						return nil, err
					}
					c.Assign = ""
					return simulate.TraceArrivals(c)
				}
		}
		return arr, cfg
	}
	rep.Sweeps = []shareSweep{
		{Name: "torpor-node", What: "Torpor's node (v100x4) and trace at 560 functions, Torpor's models drawn per " +
			"seed, 10 simulated minutes"},
		{Name: "azure-hours", What: "the Azure 2019 trace's 500 functions split into hours, Torpor's models drawn " +
			"per seed, node v100x4, 60 simulated minutes each; x: hour"},
		{Name: "bursty-arrivals", What: "Torpor's node and trace at 560 functions, Gamma inter-arrival times of " +
			"coefficient of variation x (1: Poisson), 10 simulated minutes; x: CV"},
	}
	a, c := trace("torpor-203fn-31min.csv", 560, 10, 0, 0)
	add(&rep.Sweeps[0], "560", a, c)
	for _, h := range hours {
		a, c := trace("azure2019-500fn-8h.csv", 500, 60, 60*h, 0)
		add(&rep.Sweeps[1], strconv.Itoa(h+1), a, c)
	}
	for _, cv := range cvs {
		a, c := trace("torpor-203fn-31min.csv", 560, 10, 0, cv)
		add(&rep.Sweeps[2], strconv.FormatFloat(cv, 'g', -1, 64), a, c)
	}
	sizing, err := shareSizingJobs(in, seeds, clusterMin, maxGPUs, rep)
	if err != nil {
		return nil, nil, err
	}
	jobs = append(sizing, jobs...) // the longest first
	finish := func() error {
		rep.WallSeconds, rep.LoadEnd = time.Since(start).Seconds(), loadAverage()
		name := "sharing"
		if quick {
			name = "sharing-quick"
		}
		js, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, name+".json"), append(js, '\n'), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(out, name+".md"), []byte(sharingMarkdown(*rep)), 0o644)
	}
	return jobs, finish, nil
}

// shareSizingJobs sizes each policy per seed: the fewest one-GPU nodes (v100x1, behind gpuserver/router) that keep
// the target of the 500 functions of the 8-hour trace within their SLO, from one GPU up to maxGPUs; the cluster's
// concurrency as the policy sweep's cluster runs have it (clusterConcurrency).
func shareSizingJobs(in *inputs, seeds []uint64, minutes, maxGPUs int, rep *shareReport) ([]job, error) {
	tr, ms, err := in.load("azure2019-500fn-8h.csv", "models-torpor-v100.csv")
	if err != nil {
		return nil, err
	}
	node, err := topology.Parse([]byte(oneV100))
	if err != nil {
		return nil, err
	}
	for _, p := range sharePolicyNames {
		rep.Sizing = append(rep.Sizing, shareSizing{Policy: string(p), Runs: make([]shareRun, len(seeds)),
			Reached: make([]bool, len(seeds)), GPUs: make([]int, len(seeds))})
	}
	var jobs []job
	for si, seed := range seeds {
		base := simulate.Config{Trace: tr, Models: ms, Functions: 500, Node: node, Minutes: minutes, Seed: seed,
			Assign: simulate.AssignSeeded}
		key := fmt.Sprintf("cluster/%d/%d", minutes, seed)
		build := func() ([]simulate.Arrival, error) { return simulate.TraceArrivals(base) }
		for pi, p := range sharePolicyNames {
			s := &rep.Sizing[pi]
			in.want(key)
			var sink outcome
			jobs = append(jobs, job{name: fmt.Sprintf("sharing cluster %s seed %d", p, seed), out: &sink,
				run: func() (outcome, error) {
					defer in.release(key)
					arr, err := in.arrivals(key, build)
					if err != nil {
						return outcome{}, err
					}
					for n := 1; ; n++ {
						cfg := base
						cfg.Policy = controller.PolicyFaaSGPU
						clusterConcurrency(&cfg)
						cfg.DataPlane = true
						cfg.Arrivals, cfg.Sharing = arr, simulate.Sharing{Policy: p}
						if n < maxGPUs {
							cfg.StopBelow = rep.ClusterTarget
						}
						r, err := simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: n})
						if err != nil {
							return outcome{}, err
						}
						o := fromCluster(seed, r)
						s.Runs[si], s.GPUs[si] = shareRun{outcome: o}, n
						if !r.Stopped && o.fnShare() >= rep.ClusterTarget {
							s.Reached[si] = true
							return o, nil
						}
						if n == maxGPUs {
							return o, nil
						}
					}
				}})
		}
	}
	return jobs, nil
}

// jobs are the sweep's jobs beside the others' (none when -sharing off) and what writes its report after them.
func (f sharingFlags) jobs(in *inputs, node topology.Node, seeds []uint64, quick bool, out string) ([]job,
	func() error, error) {
	if err := f.check(); err != nil {
		return nil, nil, err
	}
	if *f.mode == "off" {
		return nil, func() error { return nil }, nil
	}
	return sharingJobs(in, node, seeds, quick, out)
}

// only reports whether the sweep runs alone (-sharing only), and then runs it.
func (f sharingFlags) only(in *inputs, node topology.Node, seeds []uint64, quick bool, out string,
	parallel int) (bool, error) {
	if *f.mode != "only" {
		return false, nil
	}
	jobs, finish, err := f.jobs(in, node, seeds, quick, out)
	if err != nil {
		return true, err
	}
	if err := runJobs(jobs, parallel); err != nil {
		return true, err
	}
	return true, finish()
}
