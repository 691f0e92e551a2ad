package main

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
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

func fnShare(o outcome) float64   { return o.fnShare() }
func busyShare(o outcome) float64 { return o.busyShare() }

// ratio formats a multiple (p98 over the deadline) as a mean with its range.
func (s stat) ratio() string {
	f := func(v float64) string {
		if v >= 10 {
			return fmt.Sprintf("%.0f", v)
		}
		return fmt.Sprintf("%.2f", v)
	}
	if f(s.lo) == f(s.hi) {
		return f(s.mean)
	}
	return fmt.Sprintf("%s [%s-%s]", f(s.mean), f(s.lo), f(s.hi))
}

// refName is the policy every other is compared with: faas-gpu with the admission rule every policy may run.
const refName = "faas-gpu + admission"

// reference is the cell of a point every other is compared with: faas-gpu + admission, else faas-gpu.
func reference(pt point) (cell, bool) {
	if c, ok := find(pt, refName); ok {
		return c, true
	}
	return find(pt, "faas-gpu")
}

// gains writes the admission rule's gain for each policy run with and without it, and the overload control's
// own gain (faas-gpu against faas-gpu with the control off, each with and without the rule), per sweep point:
// means over the seeds of the differences in both figures.
func gains(b *strings.Builder, rep report) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## What the admission rule and the overload control each add\n\n")
	w("Differences of the means over the seeds (functions within SLO / requests within SLO), same arrivals. " +
		"**Admission rule**: a policy with the rule against the same policy without it. **Overload control**: " +
		"faas-gpu (its control on its default) against faas-gpu with the control off, both with the admission rule " +
		"(its own gain beyond the rule every policy may run) and both without.\n\n")
	w("| sweep | x | what | functions | requests |\n|---|---|---|---:|---:|\n")
	diff := func(a, c cell) (float64, float64) {
		return over(a.Runs, fnShare).mean - over(c.Runs, fnShare).mean,
			over(a.Runs, reqShare).mean - over(c.Runs, reqShare).mean
	}
	for _, sw := range rep.Sweeps {
		for _, pt := range sw.Points {
			for _, c := range pt.Cells {
				if !strings.HasSuffix(c.Policy, " + admission") {
					continue
				}
				if base, ok := find(pt, strings.TrimSuffix(c.Policy, " + admission")); ok {
					f, r := diff(c, base)
					w("| %s | %s | admission rule on %s | %+.3f | %+.3f |\n", sw.Name, pt.Label, base.Policy, f, r)
				}
			}
			for _, pair := range [][2]string{{"faas-gpu + admission", "faas-gpu (overload off) + admission"},
				{"faas-gpu", "faas-gpu (overload off)"}} {
				on, ok1 := find(pt, pair[0])
				off, ok2 := find(pt, pair[1])
				if ok1 && ok2 {
					f, r := diff(on, off)
					w("| %s | %s | overload control (%s against %s) | %+.3f | %+.3f |\n", sw.Name, pt.Label,
						pair[0], pair[1], f, r)
				}
			}
		}
	}
	w("\n")
}
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
		"requests refused (429 from the admission rule or the overload control, native binding without a GPU) " +
		"count as missed in both and are reported beside them, with the functions of at least 50 requests counted " +
		"apart (a function of a few requests meets or misses its SLO by one) and the 98th percentile of the " +
		"admitted requests' latency as a multiple of their deadline (a bounded queue keeps it near 1). A policy " +
		"wins only where it is not below another on either figure. Every figure is a mean over the seeds with its " +
		"range in brackets. **Overload handling is separate from the policy**: one admission rule " +
		"(controller.AdmissionDeadline: refuse a request whose predicted completion misses its deadline, " +
		"Retry-After when a retry is predicted to fit; drop a queued request once it can no longer make its " +
		"deadline) is offered to every policy, and each policy is reported with and without it (`+ admission`); " +
		"faas-gpu's own overload control (shedding the costliest functions) is reported on and off, so its gain " +
		"beyond the rule shows separately. The predictions written before this run are in " +
		"[policy-predictions.md](policy-predictions.md); the cross-check against Torpor's own node simulator is " +
		"in [policy-crosscheck.md](policy-crosscheck.md) (its mixed-model comparison is of the current " +
		"simulator, its earlier tables of earlier ones).\n\n")
	w("## Conditions\n\n")
	w("- machine: %d CPUs (`nproc`), %s; %s; commit %s\n", rep.CPUs, rep.CPUModel, rep.GoVersion, rep.Commit)
	w("- command: `%s` (`%s`), %d simulations at once; started %s; whole run %.0f s wall, %.0f s of CPU; 1-minute load "+
		"average %.1f at the start, %.1f at the end (other work on the machine stretches the wall time, not the "+
		"figures: every run is deterministic given its seed)\n", target, rep.Command, rep.Parallel, rep.Started,
		rep.WallSeconds, rep.CPUSeconds, rep.LoadStart, rep.LoadEnd)
	w("- seeds %v (arrival times, row sampling, random placement, and which model each function runs: Torpor's 8 "+
		"models are drawn per function and seed, not assigned round robin, except in the torpor-arrivals sweep's "+
		"one model); arrivals: each minute's count spread as a Poisson process within the minute, except the "+
		"bursty-arrivals and torpor-arrivals sweeps\n", rep.Seeds)
	w("- tuning and report split: the only tuned constants are the overload control's (DefaultShedTarget 0.9, " +
		"DefaultRescueShare 0.8, the 2 s interval, the measured check's 2%% and back-off), tuned by earlier rounds " +
		"on hour 1 of the Azure trace with round-robin assignment and on Torpor's trace at 560 functions; the " +
		"faas-gpu queue's order by the misses a function can spare (queueing.Config.SpareLast: a quarter of the " +
		"miss budget; most needy first above 0.75 of the GPUs) was tuned on hour 1 alone, models drawn with seeds " +
		"1-5 and 8 (policy-predictions.md, round 2); the point from which a function counts as lost for now (its " +
		"misses so far beyond its budget that it would need more requests on time in a row than it has had, after " +
		"at least 1/(1-p) requests: queueing's lost) was tuned on hour 1 with seeds 1-5 and 8 and on Torpor's " +
		"trace at 560 functions with seed 3 (policy-predictions.md, round 3); the " +
		"admission rule has no constant (it uses the controller's predictions) and no baseline was tuned (torpor " +
		"runs its paper's alpha re-tuning and node_simu.py's fixed 0.01). The report split is hours 2-8 with " +
		"models drawn per seed, Torpor's trace at 560 functions with every seed but 3, and every other sweep\n")
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
	productChanges(&b, rep)
	gains(&b, rep)
	for _, sw := range rep.Sweeps {
		w("## %s\n\n%s.\n\n", sw.Name, sw.What)
		w("| x | policy | functions within SLO | functions with >= %d requests within SLO | requests within SLO | "+
			"refused (by the admission rule) | p98 of admitted / deadline | GPU busy | not below %s's... |\n",
			simulate.BusyRequests, refName)
		w("|---|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, pt := range sw.Points {
			fg, hasRef := reference(pt)
			if len(pt.Bound) > 0 {
				w("| %s | *offline bound* (no policy can do better) | %s | | | | | | |\n", pt.Label,
					over(pt.Bound, fnShare).share())
			}
			for _, c := range pt.Cells {
				beat := ""
				if c.Policy != fg.Policy && hasRef {
					ok, of := notBelow(fg, c)
					beat = fmt.Sprintf("%s not below it on both figures on %d/%d seeds", fg.Policy, ok, of)
				}
				busy := over(c.Runs, func(o outcome) float64 { return o.Busy }).fraction()
				adm := over(c.Runs, func(o outcome) float64 { return float64(o.Admission) })
				ref := over(c.Runs, refused).count()
				if adm.hi > 0 {
					ref += " (" + adm.count() + ")"
				}
				w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", pt.Label, c.Policy, over(c.Runs, fnShare).share(),
					over(c.Runs, busyShare).share(), over(c.Runs, reqShare).share(), ref,
					over(c.Runs, func(o outcome) float64 { return o.P98 }).ratio(), busy, beat)
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
	w("- The Azure hours are the trace's own 500 functions with Torpor's 8 models drawn per seed; one function " +
		"(287) carries 61-65%% of every hour's requests, so the model it draws moves every policy's figures: " +
		"azure-hours-without-287 shows the rest alone. The offline bound (simulate.OfflineBound) ignores memory, " +
		"queueing, swaps after the first and contention: it says where no policy can meet a target, not that one " +
		"can where it allows it.\n")
	w("- The node sweeps run the product's concurrency (one request per instance, up's autoscaler, the data " +
		"plane's evictions: the section above); torpor (1 in flight) is Torpor's router's limit, one instance. The " +
		"cluster runs do not: in a cluster the OpenFaaS or Knative autoscaler scales instances across nodes, which " +
		"the simulator does not run, so there a function's requests share its copies on every GPU of a node. A new " +
		"instance's initialisation (its process loading its model through the GPU) is in its start delay, not on " +
		"a GPU.\n")
	return b.String()
}

// labels lists the points' labels: "2-8" for a run of consecutive numbers, else "1, 4".
func labels(pts []point) string {
	var ls []string
	for _, pt := range pts {
		ls = append(ls, pt.Label)
	}
	if len(ls) > 2 {
		return ls[0] + "-" + ls[len(ls)-1]
	}
	return strings.Join(ls, ", ")
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
	// beats checks the reference against every other policy of the points on both figures, every seed.
	beats := func(pts []point) (bool, string) {
		var below []string
		for _, pt := range pts {
			fg, _ := reference(pt)
			for _, c := range pt.Cells {
				if c.Policy == fg.Policy {
					continue
				}
				if ok, of := notBelow(fg, c); ok < of {
					below = append(below, fmt.Sprintf("%s at %s on %d/%d seeds", c.Policy, pt.Label, of-ok, of))
				}
			}
		}
		if len(below) == 0 {
			return true, ""
		}
		if len(below) > 6 {
			below = append(below[:6], fmt.Sprintf("%d more", len(below)-6))
		}
		return false, " (below " + strings.Join(below, "; ") + ")"
	}
	refRuns := func(pts []point) []outcome {
		var out []outcome
		for _, pt := range pts {
			fg, _ := reference(pt)
			out = append(out, fg.Runs...)
		}
		return out
	}
	p98 := func(runs []outcome) string {
		return over(runs, func(o outcome) float64 { return o.P98 }).ratio()
	}
	if tn, ok := bySweep["torpor-node"]; ok {
		for _, pt := range tn.Points {
			fg, _ := reference(pt)
			ok, why := beats([]point{pt})
			w("- Torpor's node and trace, %s functions (models drawn per seed): %s keeps %s of functions, %s of "+
				"functions with >= %d requests and %s of requests within SLO, refuses %s, p98 of admitted %s x the "+
				"deadline; not below any other policy on both figures on every seed: %s%s\n", pt.Label, fg.Policy,
				over(fg.Runs, fnShare).share(), over(fg.Runs, busyShare).share(), simulate.BusyRequests,
				over(fg.Runs, reqShare).share(), over(fg.Runs, refused).count(), p98(fg.Runs), verdict(ok), why)
		}
	}
	for _, name := range []string{"azure-hours", "azure-hours-without-287"} {
		hs, ok := bySweep[name]
		if !ok || len(hs.Points) == 0 {
			continue
		}
		var tune, held []point
		for _, pt := range hs.Points {
			if pt.Label == "1" {
				tune = append(tune, pt)
			} else {
				held = append(held, pt)
			}
		}
		for _, split := range []struct {
			what string
			pts  []point
		}{{"tuning split, hour 1 (the overload control's constants were tuned on it with round-robin " +
			"assignment, the queue's order with models drawn with seeds 1-5 and 8)", tune}, {"report split, hours " + labels(held) + " (never used to tune a constant)", held}} {
			if len(split.pts) == 0 {
				continue
			}
			runs := refRuns(split.pts)
			bs, rs := over(runs, busyShare), over(runs, reqShare)
			ok, why := beats(split.pts)
			var bound []outcome
			for _, pt := range split.pts {
				bound = append(bound, pt.Bound...)
			}
			if len(bound) > 0 {
				why += fmt.Sprintf("; the offline bound allows %s of all functions", over(bound, fnShare).share())
			}
			w("- %s, %s: %s keeps %s of functions with >= %d requests (target >= 0.95 mean: %s), %s of all "+
				"functions, %s of requests (target >= 0.97 mean: %s), refuses %s requests per hour, p98 of admitted "+
				"%s x the deadline; not below any other policy on both figures on every hour and seed: %s%s\n",
				name, split.what, refName, bs.share(), simulate.BusyRequests, verdict(bs.mean >= 0.95),
				over(runs, fnShare).share(), rs.share(), verdict(rs.mean >= 0.97), over(runs, refused).count(),
				p98(runs), verdict(ok), why)
		}
	}
	if gm, ok := bySweep["bursty-arrivals"]; ok && len(gm.Points) > 0 {
		ok, why := beats(gm.Points)
		runs := refRuns(gm.Points)
		w("- Bursty arrivals (Gamma, CV %s): %s keeps %s of functions and %s of requests, p98 of admitted %s x the "+
			"deadline; not below any other policy on both figures at every CV and seed: %s%s\n", labels(gm.Points),
			refName, over(runs, fnShare).share(), over(runs, reqShare).share(), p98(runs), verdict(ok), why)
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
	staticName := ""
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
			if strings.HasPrefix(s.Policy, "static") && (static == nil || g.mean < static.mean) {
				static, staticName = &g, s.Policy
			}
			if g.mean < best.mean {
				bestName, best = s.Policy, g
			}
		}
	}
	if static != nil {
		w("- Cluster, %s at %.0f%% of functions, against the best fair baseline a user without late "+
			"binding would run, static packing on shared GPUs (its best variant, %s): faas-gpu needs %s GPUs, "+
			"static packing %s, a ratio of %.2f\n", strings.TrimPrefix(traceSpan(rep.ClusterMinutes), "the "),
			100*rep.ClusterTarget, staticName, ours.count(), static.count(), ours.mean/static.mean)
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
