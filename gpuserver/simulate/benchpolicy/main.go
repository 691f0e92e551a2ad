// Command benchpolicy runs the policy sweep of `make bench-policy`: every policy side by side on the Torpor node
// experiment and on the Azure 2019 trace, for a list of function counts, and writes docs/bench/policy.{md,json,png}.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
}

type report struct {
	Seed        uint64       `json:"seed"`
	GoVersion   string       `json:"go_version"`
	CPUs        int          `json:"nproc"`
	CPUModel    string       `json:"cpu_model"`
	Commit      string       `json:"commit"`
	Started     string       `json:"started"`
	WallSeconds float64      `json:"wall_seconds"`
	Policies    []string     `json:"policy_order"`
	Experiments []experiment `json:"experiments"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchpolicy:", err)
		os.Exit(1)
	}
}

func run() error {
	workloads := flag.String("workloads", "../shared/workloads", "directory of the shared workload CSVs")
	out := flag.String("out", "docs/bench", "output directory")
	countsArg := flag.String("counts", "40,80,160,320,480,560,720", "function counts")
	seed := flag.Uint64("seed", 1, "seed")
	torporMin := flag.Int("torpor-minutes", 10, "simulated minutes of the Torpor trace")
	azureMin := flag.Int("azure-minutes", 60, "simulated minutes of the Azure trace")
	flag.Parse()
	var counts []int
	for _, s := range strings.Split(*countsArg, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-counts: %q is not a positive count", s)
		}
		counts = append(counts, n)
	}
	start := time.Now()
	rep := report{Seed: *seed, GoVersion: runtime.Version(), CPUs: runtime.NumCPU(), CPUModel: cpuModel(),
		Commit: gitCommit(), Started: start.UTC().Format(time.RFC3339)}
	for _, p := range controller.Policies() {
		rep.Policies = append(rep.Policies, string(p))
	}
	exps := []experiment{
		{Name: "torpor-node", Trace: "torpor-203fn-31min.csv", Models: "models-torpor-v100.csv", Node: "v100x4",
			Minutes: *torporMin},
		{Name: "azure2019", Trace: "azure2019-500fn-8h.csv", Models: "models-clockwork-v100.csv", Node: "v100x4",
			Minutes: *azureMin},
	}
	for ei := range exps {
		e := &exps[ei]
		e.Counts, e.Results = counts, map[string][]simulate.Result{}
		tr, err := simulate.LoadTrace(filepath.Join(*workloads, e.Trace))
		if err != nil {
			return err
		}
		ms, err := simulate.LoadModels(filepath.Join(*workloads, e.Models))
		if err != nil {
			return err
		}
		node, err := topology.Preset(e.Node)
		if err != nil {
			return err
		}
		for _, n := range counts {
			for _, p := range controller.Policies() {
				r, err := simulate.Run(simulate.Config{Trace: tr, Models: ms, Functions: n, Node: node,
					Minutes: e.Minutes, Policy: p, Seed: *seed}, false)
				if err != nil {
					return fmt.Errorf("%s %d %s: %w", e.Name, n, p, err)
				}
				fmt.Fprintf(os.Stderr, "%s %4d %-17s %4d/%4d functions, %d/%d requests on time (%.1fs)\n", e.Name, n, p,
					r.FunctionsSLOMet, r.FunctionsWithTraffic, r.RequestsOnTime, r.Requests, r.WallSeconds)
				e.Results[string(p)] = append(e.Results[string(p)], r)
			}
		}
	}
	rep.Experiments = exps
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
	var panels []simulate.Panel
	maxX := 0.0
	for _, n := range counts {
		maxX = max(maxX, float64(n))
	}
	for _, e := range exps {
		var ss []simulate.Series
		for pi, p := range rep.Policies {
			s := simulate.Series{Name: p, Color: simulate.Palette[pi%len(simulate.Palette)]}
			for i, r := range e.Results[p] {
				s.X = append(s.X, float64(e.Counts[i]))
				s.Y = append(s.Y, r.FunctionsSLOMetShare)
			}
			ss = append(ss, s)
		}
		panels = append(panels, simulate.Panel{Title: fmt.Sprintf("%s: %s, %s, %d min", e.Name, e.Node,
			strings.TrimSuffix(e.Trace, ".csv"), e.Minutes), Series: ss})
	}
	var png bytes.Buffer
	if err := simulate.PlotPanels(&png, panels, maxX*1.05, 80, "functions",
		"share of functions meeting their SLO"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "policy.png"), png.Bytes(), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "policy.md"), []byte(markdown(rep)), 0o644)
}

func markdown(rep report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Policy benchmark: SLO-compliant functions per policy\n\n")
	fmt.Fprintf(&b, "Written by `make bench-policy` (gpuserver/simulate/benchpolicy). Every policy runs side by side in one "+
		"run on the same arrivals: the simulator drives gpuserver/controller, the code the gpuserver ships, on a "+
		"virtual clock with gpuserver/topology's link model.\n\n")
	fmt.Fprintf(&b, "## Conditions\n\n")
	fmt.Fprintf(&b, "- machine: %d CPUs (`nproc`), %s; %s; commit %s; started %s; whole sweep %.0f s wall\n",
		rep.CPUs, rep.CPUModel, rep.GoVersion, rep.Commit, rep.Started, rep.WallSeconds)
	fmt.Fprintf(&b, "- seed %d: arrivals are each minute's count spread as a Poisson process within the minute; with more "+
		"functions than trace rows, rows are sampled with replacement and shifted by a random whole number of minutes; "+
		"models assigned round-robin\n", rep.Seed)
	fmt.Fprintf(&b, "- a function meets its SLO when at least its percentile (98%%) of its requests finish within the "+
		"deadline (Torpor models: 80 ms CV, 200 ms bert_qa; Clockwork models: 100 ms); functions without a request in "+
		"the window are not counted; requests of functions that cannot run (native) count as missed\n")
	fmt.Fprintf(&b, "- GPU memory quota per function: weights x 1.25; native and keep-alive add a 1450 MiB CUDA context "+
		"per function (calibrated so that native runs 72 of 160 functions, Torpor Fig. 10); keep-alive cold start "+
		"3 s + weights at 1 GB/s; swap latency = the model's measured pipelined swap penalty (Torpor Table 4) scaled "+
		"by the link model's transfer time under concurrent transfers\n")
	fmt.Fprintf(&b, "- inputs: `../shared/workloads/` (Torpor trace and Table 4 models: Yu et al., Torpor; Azure Functions "+
		"trace 2019, Shahrad et al., CC-BY-4.0, sampled by vhive-serverless/invitro; Clockwork model table, Gujarati "+
		"et al., OSDI 2020)\n\n")
	fmt.Fprintf(&b, "- faas-gpu (our default) = torpor's groups, Algorithm 1 placement and heaviness-aware eviction, plus: "+
		"least slack first within a group; among equally good GPUs the one evicting fewer heavy models; swap times "+
		"learned as the time alone and predicted under the link model's slowdown from the transfers in progress; a "+
		"request that a contended host swap now would make miss its deadline stays queued when a later start (the "+
		"contending transfer ends, a busy GPU holding or freeing for the model, a loading copy to copy over NVLink) "+
		"is predicted to meet it; while at least %.0f%% of the functions meet their SLO a request competes until its "+
		"unmargined cost no longer fits (queueing.Config.RescueShare), otherwise late requests are demoted by the "+
		"margined slack\n\n", controller.DefaultRescueShare*100)
	fmt.Fprintf(&b, "![share of SLO-compliant functions against function count](policy.png)\n\n")
	fmt.Fprintf(&b, "policy.png: share of SLO-compliant functions (y, 0 to 1, gridlines every 0.1) against function count "+
		"(x, gridlines every 80), left the Torpor node experiment, right the Azure trace, labelled axes and legend. "+
		"Colours: ")
	for i, p := range rep.Policies {
		c := []string{"crimson", "blue", "green", "orange", "violet", "teal", "grey", "brown"}[i%8]
		fmt.Fprintf(&b, "%s %s", c, p)
		if i < len(rep.Policies)-1 {
			b.WriteString(", ")
		}
	}
	b.WriteString(".\n\n")
	for _, e := range rep.Experiments {
		fmt.Fprintf(&b, "## %s: %s, %s, node %s, %d simulated minutes\n\n", e.Name, e.Trace, e.Models, e.Node, e.Minutes)
		b.WriteString("SLO-compliant functions (met / with requests):\n\n| functions |")
		for _, p := range rep.Policies {
			fmt.Fprintf(&b, " %s |", p)
		}
		b.WriteString("\n|---:|")
		for range rep.Policies {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		for i, n := range e.Counts {
			fmt.Fprintf(&b, "| %d |", n)
			for _, p := range rep.Policies {
				r := e.Results[p][i]
				fmt.Fprintf(&b, " %d/%d (%.1f%%) |", r.FunctionsSLOMet, r.FunctionsWithTraffic, 100*r.FunctionsSLOMetShare)
			}
			b.WriteString("\n")
		}
		b.WriteString("\nDetails per policy and count: requests on time, latency over deadline (p50/p98/p99), swaps " +
			"(none/NVLink/PCIe), evictions, cold starts, rejected requests, mean GPU busy fraction, simulated events " +
			"per second:\n\n| functions | policy | on time | p50 | p98 | p99 | swaps | evictions | cold | rejected | busy | events/s |\n" +
			"|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
		for i, n := range e.Counts {
			for _, p := range rep.Policies {
				r := e.Results[p][i]
				busy := 0.0
				for _, x := range r.GPUBusy {
					busy += x / float64(len(r.GPUBusy))
				}
				fmt.Fprintf(&b, "| %d | %s | %d/%d | %.2f | %.2f | %.2f | %d/%d/%d | %d | %d | %d | %.2f | %.0f |\n", n, p,
					r.RequestsOnTime, r.Requests, r.P50, r.P98, r.P99, r.Swaps.None, r.Swaps.NVLink, r.Swaps.PCIe,
					r.Evictions, r.ColdStarts, r.Rejected, busy, r.EventsPerSecond)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
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
