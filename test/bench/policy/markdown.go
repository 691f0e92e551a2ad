package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// stat is a mean with its range.
type stat struct{ mean, lo, hi float64 }

func over(runs []outcome, f func(outcome) float64) stat {
	s := stat{lo: math.Inf(1), hi: math.Inf(-1)}
	for _, r := range runs {
		v := f(r)
		s.mean += v / float64(len(runs))
		s.lo, s.hi = min(s.lo, v), max(s.hi, v)
	}
	return s
}

// share formats a share as a mean with its range, e.g. 0.978 [0.954-0.995].
func (s stat) share() string { return fmt.Sprintf("%.3f [%.3f-%.3f]", s.mean, s.lo, s.hi) }

// fraction formats a fraction as a mean with its range, two decimals.
func (s stat) fraction() string {
	if fmt.Sprintf("%.2f", s.lo) == fmt.Sprintf("%.2f", s.hi) {
		return fmt.Sprintf("%.2f", s.mean)
	}
	return fmt.Sprintf("%.2f [%.2f-%.2f]", s.mean, s.lo, s.hi)
}

// count formats a count as a mean with its range.
func (s stat) count() string {
	if s.lo == s.hi {
		return fmt.Sprintf("%.0f", s.mean)
	}
	return fmt.Sprintf("%.0f [%.0f-%.0f]", s.mean, s.lo, s.hi)
}

func fnShare(o outcome) float64  { return o.fnShare() }
func reqShare(o outcome) float64 { return o.reqShare() }
func refused(o outcome) float64  { return float64(o.Refused) }

// notBelow counts the seeds on which policy a is not below b on both figures (functions and requests within SLO).
func notBelow(a, b cell) (ok, of int) {
	for i := range a.Runs {
		of++
		if a.Runs[i].Met >= b.Runs[i].Met && a.Runs[i].OnTime >= b.Runs[i].OnTime {
			ok++
		}
	}
	return ok, of
}

func find(pt point, policy string) (cell, bool) {
	for _, c := range pt.Cells {
		if c.Policy == policy {
			return c, true
		}
	}
	return cell{}, false
}

func markdown(rep report) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	title := "Policy benchmark: functions and requests within SLO"
	if rep.Quick {
		title += " (quick run for CI)"
	}
	w("# %s\n\n", title)
	target := "make bench-policy"
	if rep.Quick {
		target = "make bench-policy-quick"
	}
	w("Written by `%s`, unedited. Every policy runs side by side on the same ", target)
	w("arrivals: the simulator drives gpuserver/controller, the code the gpuserver ships, on a virtual clock with " +
		"gpuserver/topology's link model. Each policy is judged on **two figures**: the share of functions (with at " +
		"least one request) that meet their SLO, and the share of requests served within their deadline (goodput); " +
		"requests refused (429 from the overload control, native binding without a GPU) count as missed in both and " +
		"are reported beside them. A policy wins only where it is not below another on either figure. Every figure " +
		"is a mean over the seeds with its range in brackets. The cross-check against Torpor's own node simulator is " +
		"in [policy-crosscheck.md](policy-crosscheck.md); [policy-notes.md](policy-notes.md) says what changed from " +
		"the previous figures and why.\n\n")
	w("## Conditions\n\n")
	w("- machine: %d CPUs (`nproc`), %s; %s; commit %s\n", rep.CPUs, rep.CPUModel, rep.GoVersion, rep.Commit)
	w("- command: `%s` (`%s`), %d simulations at once; started %s; whole run %.0f s wall, %.0f s of CPU; 1-minute load "+
		"average %.1f at the start, %.1f at the end (other work on the machine stretches the wall time, not the "+
		"figures: every run is deterministic given its seed)\n", target, rep.Command, rep.Parallel, rep.Started,
		rep.WallSeconds, rep.CPUSeconds, rep.LoadStart, rep.LoadEnd)
	w("- seeds %v (arrival times, row sampling, random placement); arrivals: each minute's count spread as a "+
		"Poisson process within the minute, except the torpor-arrivals sweep\n", rep.Seeds)
	w("- a function meets its SLO when at least its percentile (98%%) of its requests finish within the deadline " +
		"(Torpor's models: 80 ms CV, 200 ms bert_qa); node v100x4 is Torpor's (4x V100 32 GB, pairs behind one PCIe " +
		"switch, two swaps behind one switch 1.64x slower as Torpor measured, NVLink 24/48 GB/s)\n")
	w("- faas-gpu's overload control on its default (auto) unless said otherwise\n")
	if rep.Note != "" {
		w("- %s\n", rep.Note)
	}
	w("- inputs: `../shared/workloads/` (Torpor trace and Table 4 models: Yu et al., Torpor; Azure Functions trace " +
		"2019, Shahrad et al., CC-BY-4.0, sampled by vhive-serverless/invitro)\n\n")
	w("## Targets\n\n")
	targets(&b, rep)
	for _, sw := range rep.Sweeps {
		w("## %s\n\n%s.\n\n", sw.Name, sw.What)
		w("| x | policy | functions within SLO | requests within SLO | refused | GPU busy | not below faas-gpu's... |\n")
		w("|---|---|---:|---:|---:|---:|---|\n")
		for _, pt := range sw.Points {
			fg, _ := find(pt, "faas-gpu")
			for _, c := range pt.Cells {
				beat := ""
				if c.Policy != "faas-gpu" && len(fg.Runs) > 0 {
					ok, of := notBelow(fg, c)
					beat = fmt.Sprintf("faas-gpu not below it on both figures on %d/%d seeds", ok, of)
				}
				busy := over(c.Runs, func(o outcome) float64 { return o.Busy }).fraction()
				w("| %s | %s | %s | %s | %s | %s | %s |\n", pt.Label, c.Policy, over(c.Runs, fnShare).share(),
					over(c.Runs, reqShare).share(), over(c.Runs, refused).count(), busy, beat)
			}
		}
		w("\n")
	}
	w("## Cluster: GPUs needed for %s\n\n", traceSpan(rep.ClusterMinutes))
	w("The 500 functions of azure2019-500fn-8h.csv with Torpor's models over %d simulated minutes; each policy sized "+
		"per seed to the fewest GPUs that keep at least %.0f%% of the functions within their SLO (nodes of v100x4 "+
		"added one at a time from one node, at most %d; a cluster that misses the target is stopped as soon as it "+
		"can no longer reach it; faas-gpu, torpor and gshare-dqls late-bind behind gpuserver/router; static "+
		"packing places every model for good, hot ones replicated within their node, sized with the whole run's "+
		"arrivals known; keep-alive holds a GPU per warm instance: 10 minutes after its last request, or prewarmed "+
		"to each function's peak concurrency and never released). GPUs are the mean provisioned over the run.\n\n",
		rep.ClusterMinutes, 100*rep.ClusterTarget, maxNodes)
	w("| policy | GPUs needed | functions within SLO | requests within SLO | refused | reached the target on | smaller clusters (missed the target) |\n")
	w("|---|---:|---:|---:|---:|---|---|\n")
	for _, s := range rep.Sizing {
		reached := 0
		for _, r := range s.Reached {
			if r {
				reached++
			}
		}
		w("| %s | %s | %s | %s | %s | %d/%d seeds | %s |\n", s.Policy,
			over(s.Runs, func(o outcome) float64 { return o.GPUs }).count(), over(s.Runs, fnShare).share(),
			over(s.Runs, reqShare).share(), over(s.Runs, refused).count(), reached, len(s.Reached), missed(s))
	}
	w("\n")
	w("## Router against round robin\n\n")
	w("faas-gpu on %d nodes of v100x4, the 500 functions of the Azure trace with Torpor's models, %d minutes: "+
		"gpuserver/router (a node holding the model on a GPU, then its host image, within one outstanding request "+
		"per GPU of the least loaded node) against round robin over the same nodes.\n\n", rep.RouterNodes,
		rep.ClusterMinutes)
	w("| routing | functions within SLO | requests within SLO | refused | host image loads |\n|---|---:|---:|---:|---:|\n")
	for _, c := range rep.Router {
		w("| %s | %s | %s | %s | %s |\n", c.Policy, over(c.Runs, fnShare).share(), over(c.Runs, reqShare).share(),
			over(c.Runs, refused).count(), over(c.Runs, func(o outcome) float64 { return float64(o.ImageLoads) }).count())
	}
	w("\n## What these figures do not show\n\n")
	w("- They come from the simulator, not from GPUs: the link model, Torpor's Table 4 latencies and its measured " +
		"1.64x contention stand in for the hardware; [policy-crosscheck.md](policy-crosscheck.md) compares the " +
		"simulator with Torpor's.\n")
	w("- Static packing serialises a GPU's requests (MPS would overlap small kernels) and replicates models only " +
		"within the node their host image is on; keep-alive cold starts are Torpor's (3 s plus the model at 1 GB/s).\n")
	w("- The Azure hours are the trace's own 500 functions with Torpor's 8 models assigned round robin; other model " +
		"mixes move every policy's figures.\n")
	return b.String()
}

// traceSpan names the part of the Azure trace a cluster run replays: the whole 8-hour trace, or (quick runs) its
// first minutes.
func traceSpan(minutes int) string {
	if minutes == 8*60 {
		return "the 8-hour trace"
	}
	return fmt.Sprintf("the trace's first %d minutes", minutes)
}

// missed says, for a sizing, which smaller clusters missed the target on how many seeds, and when (simulated
// minutes) each run could no longer reach it.
func missed(s sizing) string {
	byNodes := map[int][]float64{}
	var nodes []int
	for _, ms := range s.Missed {
		for _, m := range ms {
			if byNodes[m.Nodes] == nil {
				nodes = append(nodes, m.Nodes)
			}
			byNodes[m.Nodes] = append(byNodes[m.Nodes], m.StoppedAtMinutes)
		}
	}
	if len(nodes) == 0 {
		return "-"
	}
	slices.Sort(nodes)
	var out []string
	for _, n := range nodes {
		at := byNodes[n]
		lo, hi := slices.Min(at), slices.Max(at)
		when := fmt.Sprintf("after %.0f simulated min", lo)
		if hi-lo >= 1 {
			when = fmt.Sprintf("after %.0f-%.0f simulated min", lo, hi)
		}
		out = append(out, fmt.Sprintf("%d node%s on %d seeds (%s)", n, map[bool]string{true: "s"}[n > 1], len(at),
			when))
	}
	return strings.Join(out, "; ")
}

// targets checks the policy's targets on the figures and says each with its figure.
func targets(b *strings.Builder, rep report) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	bySweep := map[string]sweep{}
	for _, s := range rep.Sweeps {
		bySweep[s.Name] = s
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	for _, t := range []struct {
		label string
		min   float64
	}{{"160", 0.99}, {"560", 0.95}} {
		for _, pt := range bySweep["torpor-node"].Points {
			if pt.Label != t.label {
				continue
			}
			fg, _ := find(pt, "faas-gpu")
			fs := over(fg.Runs, fnShare)
			allOK, worst := true, ""
			for _, c := range pt.Cells {
				if c.Policy == "faas-gpu" {
					continue
				}
				if ok, of := notBelow(fg, c); ok < of {
					allOK, worst = false, fmt.Sprintf(" (below %s on %d of %d seeds)", c.Policy, of-ok, of)
				}
			}
			w("- Torpor's node and trace, %s functions: faas-gpu keeps %s of functions within SLO (target >= %.2f "+
				"mean: %s) and %s of requests; not below any other policy on both figures on every seed: %s%s\n",
				t.label, fs.share(), t.min, verdict(fs.mean >= t.min), over(fg.Runs, reqShare).share(), verdict(allOK),
				worst)
		}
	}
	if hs, ok := bySweep["azure-hours"]; ok && len(hs.Points) > 0 {
		var all []outcome
		var below []string
		for _, pt := range hs.Points {
			fg, _ := find(pt, "faas-gpu")
			all = append(all, fg.Runs...)
			for _, c := range pt.Cells {
				if c.Policy == "faas-gpu" {
					continue
				}
				for i := range c.Runs {
					if fg.Runs[i].OnTime < c.Runs[i].OnTime {
						below = append(below, fmt.Sprintf("hour %s seed %d: %s %d > %d", pt.Label, fg.Runs[i].Seed,
							c.Policy, c.Runs[i].OnTime, fg.Runs[i].OnTime))
					}
				}
			}
		}
		var held []outcome
		for _, pt := range hs.Points {
			if pt.Label != "1" { // hour 1 was seen while the overload control was designed
				fg, _ := find(pt, "faas-gpu")
				held = append(held, fg.Runs...)
			}
		}
		if len(held) > 0 {
			w("- Azure hours 2-8 only (never looked at while the overload control was designed; hour 1, the "+
				"previous benchmark's overloaded hour, was): faas-gpu keeps %s of functions and %s of requests\n",
				over(held, fnShare).share(), over(held, reqShare).share())
		}
		fs := over(all, fnShare)
		w("- Azure hours (%d hours x %d seeds): faas-gpu keeps %s of functions within SLO (target >= 0.93 mean: %s), "+
			"%s of requests, refuses %s requests per hour; requests within SLO not below every other policy on "+
			"every hour and seed: %s", len(hs.Points), len(rep.Seeds), fs.share(), verdict(fs.mean >= 0.93),
			over(all, reqShare).share(), over(all, refused).count(), verdict(len(below) == 0))
		if len(below) > 0 {
			w(" (%s)", strings.Join(below, "; "))
		}
		w("\n")
	}
	if ta, ok := bySweep["torpor-arrivals"]; ok {
		for _, pt := range ta.Points {
			on, _ := find(pt, "faas-gpu")
			off, _ := find(pt, "faas-gpu (overload off)")
			ok, of := notBelow(on, off)
			w("- Torpor's arrivals, %s functions: the overload control on its default keeps %s of functions and %s "+
				"of requests, off %s and %s; not below off on both figures on %d/%d seeds: %s\n", pt.Label,
				over(on.Runs, fnShare).share(), over(on.Runs, reqShare).share(), over(off.Runs, fnShare).share(),
				over(off.Runs, reqShare).share(), ok, of, verdict(ok == of))
		}
	}
	var ours stat
	bestName, best := "", stat{mean: math.Inf(1)}
	var static *stat
	var ratios []string
	for _, s := range rep.Sizing {
		reached := true
		for _, r := range s.Reached {
			reached = reached && r
		}
		g := over(s.Runs, func(o outcome) float64 { return o.GPUs })
		switch {
		case s.Policy == "faas-gpu":
			ours = g
		case reached:
			ratios = append(ratios, fmt.Sprintf("%s %s", s.Policy, g.count()))
			if s.Policy == "static" {
				static = &g
			}
			if g.mean < best.mean {
				bestName, best = s.Policy, g
			}
		}
	}
	if static != nil {
		w("- Cluster, %s at %.0f%% of functions, against the best fair baseline a user without late "+
			"binding would run, static packing on shared GPUs: faas-gpu needs %s GPUs, static packing %s, a ratio of "+
			"%.2f\n", strings.TrimPrefix(traceSpan(rep.ClusterMinutes), "the "), 100*rep.ClusterTarget, ours.count(), static.count(), ours.mean/static.mean)
	}
	if bestName != "" {
		w("- Cluster, %s at %.0f%% of functions, against every baseline that reaches the target: the "+
			"fewest GPUs, %s, for %s: a ratio of %.2f (%s)\n", strings.TrimPrefix(traceSpan(rep.ClusterMinutes), "the "),
			100*rep.ClusterTarget, best.count(), bestName,
			ours.mean/best.mean, strings.Join(ratios, ", "))
	}
	if len(rep.Router) == 2 {
		r, rr := rep.Router[0], rep.Router[1]
		w("- Router against round robin (faas-gpu, %d nodes): functions %s against %s, requests %s against %s\n",
			rep.RouterNodes, over(r.Runs, fnShare).share(), over(rr.Runs, fnShare).share(),
			over(r.Runs, reqShare).share(), over(rr.Runs, reqShare).share())
	}
	w("\n")
}
