package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

func shareOutcomes(runs []shareRun) []outcome {
	out := make([]outcome, len(runs))
	for i, r := range runs {
		out[i] = r.outcome
	}
	return out
}

func shareStat(runs []shareRun, f func(shareRun) float64) stat {
	s := stat{lo: math.Inf(1), hi: math.Inf(-1)}
	for _, r := range runs {
		v := f(r)
		s.mean += v / float64(len(runs))
		s.lo, s.hi = min(s.lo, v), max(s.hi, v)
	}
	return s
}

// sharingVerdict is one of the targets: met or not, and the figure.
type sharingVerdict struct {
	what   string
	met    bool
	figure string
}

// sharingVerdicts judges the targets for Dilu (and says how the others fare).
func sharingVerdicts(rep shareReport) []sharingVerdict {
	var out []sharingVerdict
	gpus := map[string]float64{}
	reached := map[string]bool{}
	for _, s := range rep.Sizing {
		sum, all := 0.0, true
		for i, n := range s.GPUs {
			sum += float64(n) / float64(len(s.GPUs))
			all = all && s.Reached[i]
		}
		gpus[s.Policy], reached[s.Policy] = sum, all
	}
	if ex := gpus["exclusive"]; ex > 0 {
		r := gpus["dilu"] / ex
		out = append(out, sharingVerdict{what: fmt.Sprintf("8-hour trace (%d simulated minutes) at %.0f%% of "+
			"functions: Dilu needs <= 0.6x the GPUs of exclusive", rep.ClusterMinutes, 100*rep.ClusterTarget),
			met: r <= 0.6 && reached["dilu"], figure: fmt.Sprintf("%.2fx (%.1f against %.1f GPUs; reached on every "+
				"seed: dilu %v, exclusive %v)", r, gpus["dilu"], ex, reached["dilu"], reached["exclusive"])})
	}
	for _, sw := range rep.Sweeps {
		switch sw.Name {
		case "bursty-arrivals":
			for _, pt := range sw.Points {
				if pt.Label != "6" {
					continue
				}
				ex, di := pt.Cells[0], cellOf(pt, "dilu")
				r := shareStat(di.Runs, func(o shareRun) float64 { return o.P95 }).mean /
					shareStat(ex.Runs, func(o shareRun) float64 { return o.P95 }).mean
				out = append(out, sharingVerdict{what: "Gamma CV 6: Dilu's p95 latency within 1.1x of exclusive",
					met: r <= 1.1, figure: fmt.Sprintf("%.2fx", r)})
			}
		case "azure-hours":
			worst, below, n := 0.0, 0, 0
			for _, pt := range sw.Points {
				ex, di := pt.Cells[0], cellOf(pt, "dilu")
				for i := range ex.Runs {
					d := di.Runs[i].reqShare() - ex.Runs[i].reqShare()
					n++
					if d < -1e-12 {
						below++
					}
					worst = min(worst, d)
				}
			}
			out = append(out, sharingVerdict{what: "Azure hours: Dilu's requests within SLO never below exclusive's " +
				"(every hour, every seed)", met: below == 0, figure: fmt.Sprintf("below on %d of %d hour-seeds, "+
				"worst %+.4f", below, n, worst)})
		}
	}
	return out
}

func cellOf(pt sharePoint, policy string) shareCell {
	for _, c := range pt.Cells {
		if c.Policy == policy {
			return c
		}
	}
	return shareCell{}
}

func sharingMarkdown(rep shareReport) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	title := "Compute sharing in the simulator: exclusive, static shares, gShare, Dilu"
	if rep.Quick {
		title += " (quick)"
	}
	w("# %s\n\n", title)
	w("Written by `make bench-policy` (test/bench/policy/sharing.go) from sharing%s.json. "+
		"The product's faas-gpu with the admission rule and the product's behaviour (simulate.Product: one request "+
		"per instance, up's autoscaler, the data plane's evictions), every function exclusive (today) or asking for "+
		"a compute share under one of three policies, co-running where the controller (controller.Config.Sharing, "+
		"the product's code: memory fits, requests sum <= 1, limits <= 1.5) places it. Dilu's shares are moved by "+
		"gpuserver/compute's arbiter (the product's four-state controller) ticked every 5 ms of virtual time.\n\n",
		map[bool]string{true: "-quick", false: ""}[rep.Quick])
	w("**The latency-against-share model is an assumption, not a measurement** (gpuserver/simulate/shareprofile.csv): "+
		"a model's kernels keep a fraction u of the GPU busy at batch 1, so with a share s a request takes "+
		"t_exclusive x max(1, u/s) (static, Dilu) or t_exclusive / s with gShare's time slice s, times %.2f "+
		"while another binding runs on the GPU. The shares asked (the benchmark's rule, as a user following Dilu's "+
		"profile would set them): request = u/2 rounded up to 0.1 (at most twice the exclusive latency), limit = u "+
		"rounded up to 0.1; static (HAMi) uses the request as its one number; gShare's slice is the larger of the "+
		"memory quota's fraction of the GPU and the request. Until the GPU suite measures latency against share, "+
		"every figure below depends on these.\n\n", 1+rep.Slowdown)
	w("| model | u (assumed) | request | limit |\n|---|---:|---:|---:|\n")
	models := make([]string, 0, len(rep.Profile))
	for m := range rep.Profile {
		models = append(models, m)
	}
	slices.Sort(models)
	for _, m := range models {
		p := rep.Profile[m]
		w("| %s | %.2f | %.1f | %.1f |\n", m, p[0], p[1], p[2])
	}
	w("\n## Targets\n\n")
	for _, v := range sharingVerdicts(rep) {
		mark := "NOT MET"
		if v.met {
			mark = "met"
		}
		w("- %s: **%s**, %s\n", v.what, mark, v.figure)
	}
	w("\n")
	for _, sw := range rep.Sweeps {
		w("## %s\n\n%s. Means over the seeds with their range; p95 is the 95th percentile of the served requests' "+
			"latency over their deadline; co-run is the requests bound beside another binding.\n\n", sw.Name, sw.What)
		w("| x | policy | functions within SLO | requests within SLO | refused | p95 / deadline | p95 vs exclusive | " +
			"co-run | GPU busy |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, pt := range sw.Points {
			exP95 := shareStat(pt.Cells[0].Runs, func(o shareRun) float64 { return o.P95 }).mean
			for _, c := range pt.Cells {
				o := shareOutcomes(c.Runs)
				p95 := shareStat(c.Runs, func(o shareRun) float64 { return o.P95 })
				w("| %s | %s | %s | %s | %s | %s | %.2fx | %s | %s |\n", pt.Label, c.Policy, over(o, fnShare).share(),
					over(o, reqShare).share(), over(o, refused).count(), p95.ratio(), ratio(p95.mean, exP95),
					shareStat(c.Runs, func(o shareRun) float64 { return float64(o.CoRan) }).count(),
					over(o, func(o outcome) float64 { return o.Busy }).fraction())
			}
		}
		w("\n")
	}
	w("## Cluster: GPUs needed for the 8-hour trace\n\n")
	w("The 500 functions of azure2019-500fn-8h.csv with Torpor's models over %d simulated minutes, each policy "+
		"sized per seed to the fewest one-GPU nodes (a V100 32 GB each, behind gpuserver/router; one GPU at a time, "+
		"from 1 to %d) keeping at least %.0f%% of the functions within their SLO; the cluster runs' concurrency "+
		"(a function's requests share its copies on every GPU of a node, as the policy sweep's cluster runs) and "+
		"the data plane's evictions.\n\n", rep.ClusterMinutes, rep.MaxGPUs, 100*rep.ClusterTarget)
	w("| policy | GPUs needed | vs exclusive | functions within SLO | requests within SLO | refused | reached the " +
		"target on |\n|---|---:|---:|---:|---:|---:|---|\n")
	var exGPUs float64
	for _, s := range rep.Sizing {
		g := stat{lo: math.Inf(1), hi: math.Inf(-1)}
		reached := 0
		for i, n := range s.GPUs {
			g.mean += float64(n) / float64(len(s.GPUs))
			g.lo, g.hi = min(g.lo, float64(n)), max(g.hi, float64(n))
			if s.Reached[i] {
				reached++
			}
		}
		if s.Policy == "exclusive" {
			exGPUs = g.mean
		}
		o := shareOutcomes(s.Runs)
		w("| %s | %s | %.2fx | %s | %s | %s | %d/%d seeds |\n", s.Policy, g.count(), ratio(g.mean, exGPUs),
			over(o, fnShare).share(), over(o, reqShare).share(), over(o, refused).count(), reached, len(s.GPUs))
	}
	w("\n## Conditions\n\n")
	w("- Command: `%s`; commit %s; %s; %d CPUs (%s), 1-minute load average %.1f at the start, %.1f at the end; "+
		"%.0f s wall. Seeds %v.\n", rep.Command, rep.Commit, rep.GoVersion, rep.CPUs, rep.CPUModel, rep.LoadStart,
		rep.LoadEnd, rep.WallSeconds, rep.Seeds)
	w("- Assumed, not measured or fitted: u per model, the %.2fx co-location slowdown, the rule that sets the "+
		"shares. gShare runs as a fluid share of its 20 ms round robin (a request's latency within one round of "+
		"the fluid figure), its slices not lent when their owner is idle; static shares are fixed caps, also "+
		"alone on a GPU.\n\n", 1+rep.Slowdown)
	w("## What these figures do not show\n\n")
	w("- They come from the simulator with an assumed latency-against-share profile; the GPU suite has to measure " +
		"latency at shares 0.1 to 1.0 (Dilu's 10-point steps) before any of them says what a GPU does.\n")
	w("- Dilu's emergency state does not fire in the simulator: each binding is one request (the product binds one " +
		"request per instance) and its cycle is reported when it ends; the increase state (a binding held at its " +
		"gate doubles its share every period while the GPU has room) does the scaling.\n")
	w("- The controller predicts a co-runner's execution as exclusive / request until it has observed co-runs " +
		"(controller/corun.go); the admission rule and the overload control act on that prediction.\n")
	w("- The product cannot run gShare's time slices (the gate issues tokens in share-time, Dilu's design), nor " +
		"HAMi's fixed caps as a separate mode: static shares are request = limit under the same gate.\n")
	w("- One request per binding at batch 1: no batching, so Dilu's gain from a burst is the neighbours' idle " +
		"share, not a larger batch.\n")
	return b.String()
}
