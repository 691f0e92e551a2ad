package main

import (
	"fmt"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
)

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func markdown(rep report, speed speedRun, prev *report) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Policy benchmark: SLO-compliant functions per policy\n\n")
	w("Written by `make bench-policy` (gpuserver/simulate/benchpolicy). Every policy runs side by side in one run on " +
		"the same arrivals: the simulator drives gpuserver/controller, the code the gpuserver ships, on a virtual " +
		"clock with gpuserver/topology's link model. Every share of SLO-compliant functions stands beside an offline " +
		"upper bound computed from the same arrivals (`simulate.OfflineBound`: the most functions whose least GPU " +
		"time - 98%% of their requests at their execution time plus one swap-in alone - fits the node's GPU time; it " +
		"ignores memory, queueing, contention and burstiness, so no policy can exceed it and it is loose under bursty " +
		"load). The cross-check of the simulator against Torpor's own node simulator is in " +
		"[policy-crosscheck.md](policy-crosscheck.md).\n\n")

	w("## Conditions\n\n")
	w("- machine: %d CPUs (`nproc`), %s; %s; commit %s; started %s; whole run %.0f s wall\n", rep.CPUs, rep.CPUModel,
		rep.GoVersion, rep.Commit, rep.Started, rep.WallSeconds)
	w("- seed %d for every figure below; the headline conclusions are re-checked on seeds %v (last section). "+
		"Arrivals: each minute's count spread as a Poisson process within the minute; with more functions than "+
		"trace rows, rows are sampled with replacement and shifted by a random whole number of minutes; models "+
		"assigned round-robin\n", rep.Seed, rep.Seeds)
	w("- a function meets its SLO when at least its percentile (98%%) of its requests finish within the deadline " +
		"(Torpor models: 80 ms CV, 200 ms bert_qa; Clockwork models: 100 ms); functions without a request in the " +
		"window are not counted; requests refused (native without a GPU, 429 from the overload control, no node) " +
		"count as missed\n")
	w("- GPU memory quota per function: weights x 1.25; native and keep-alive add a 1450 MiB CUDA context per " +
		"function (calibrated so that native runs 72 of 160 functions, Torpor Fig. 10); keep-alive cold start 3 s " +
		"+ weights at 1 GB/s. Link model: transfers advance as a fluid (rates recomputed whenever one starts or " +
		"ends, each runs until its last byte); a swap alone adds the model's measured pipelined penalty (Torpor " +
		"Table 4), and whatever contention stretches its transfer beyond its time alone adds in full\n")
	w("- inputs: `../shared/workloads/` (Torpor trace and Table 4 models: Yu et al., Torpor; Azure Functions trace " +
		"2019, Shahrad et al., CC-BY-4.0, sampled by vhive-serverless/invitro; Clockwork model table, Gujarati et " +
		"al., OSDI 2020)\n")
	w("- faas-gpu (our default) = torpor's groups, Algorithm 1 placement and heaviness-aware eviction, plus: least "+
		"slack first within a group; among equally good GPUs the one evicting fewer heavy models, then the least "+
		"used; swap times learned alone and predicted with the fluid link model; a request waits rather than start "+
		"a host swap that would make a request in progress miss its deadline, or when a later start (a contending "+
		"transfer ending, a busy GPU freeing, a loading copy to copy over NVLink) meets its own deadline and the swap "+
		"now does not; while at least %.0f%% of the functions meet their SLO a request competes until its unmargined "+
		"cost no longer fits; and the **overload control**: every %v the functions are admitted cheapest first (arrival "+
		"rate x observed GPU hold time) within a share of the GPU time that feedback tunes (start %.2f); the requests "+
		"of the others are refused at once with 429 and Retry-After unless the node idles\n\n",
		controller.DefaultRescueShare*100, controller.DefaultShedEvery, controller.DefaultShedTarget)

	// Headline.
	w("## Headline\n\n")
	if ov := findExp(rep, "azure2019-overload"); ov != nil {
		n := ov.Counts[len(ov.Counts)-1]
		for _, c := range ov.Counts {
			if c == 1000 {
				n = c
			}
		}
		i := indexOf(ov.Counts, n)
		bd := ov.Bounds[i]
		w("**Overload** (%s, %s, node %s, %d functions, %d minutes: the overloaded hour). Offline bound %d of %d "+
			"active functions.\n\n| policy | SLO met | share of active | share of the bound | gap to the bound |\n"+
			"|---|---:|---:|---:|---:|\n", ov.Trace, ov.Models, ov.Node, n, ov.Minutes, bd.Functions,
			bd.FunctionsWithTraffic)
		for _, p := range rep.Policies {
			r := ov.Results[p][i]
			w("| %s | %d/%d | %.1f%% | %.1f%% | %d |\n", p, r.FunctionsSLOMet, r.FunctionsWithTraffic,
				pct(r.FunctionsSLOMet, r.FunctionsWithTraffic), pct(r.FunctionsSLOMet, bd.Functions),
				bd.Functions-r.FunctionsSLOMet)
		}
		w("\n")
	}
	cl := rep.Cluster
	w("**Cluster** (%s, %s, %d functions, %d h, nodes of %s): GPUs needed to keep at least %.0f%% of the functions "+
		"within their SLO (fixed clusters: nodes x GPUs; autoscaled: the mean provisioned):\n\n", cl.Trace, cl.Models,
		cl.Funcs, cl.Minutes/60, cl.Node, 100*cl.Target)
	w("![GPUs needed per policy](policy-cluster.png)\n\n| policy | GPUs needed | x keep-alive (prewarmed) |\n|---|---:|---:|\n")
	ka := cl.Needed["keepalive-prewarmed"]
	for _, name := range sortedNeeded(cl) {
		ratio := "-"
		if ka > 0 {
			ratio = fmt.Sprintf("%.3f", cl.Needed[name]/ka)
		}
		w("| %s | %.1f | %s |\n", name, cl.Needed[name], ratio)
	}
	for _, m := range missed(cl) {
		w("| %s | not reached: best %d/%d (%.1f%%) with %.1f GPUs | - |\n", m.Name, m.FunctionsSLOMet,
			m.FunctionsWithTraffic, 100*m.FunctionsSLOMetShare, m.GPUsMean)
	}
	w("\n")
	w("**Speed**: %d functions on a %d-node cluster for %d simulated minutes (%.1f h) under faas-gpu, GOMAXPROCS=%d: "+
		"%d requests, %d events in %.1f s wall, **%.0f events/s** (%s functions within SLO).\n\n", speed.Functions,
		speed.Nodes, speed.Minutes, float64(speed.Minutes)/60, speed.GOMAXPROCS, speed.Requests, speed.Events,
		speed.Wall, speed.PerSecond, speed.SLOMet)
	if len(rep.Partial) > 0 {
		last := rep.Partial[len(rep.Partial)-1]
		w("**Partial residency** (Torpor node, %d functions, faas-gpu): %.1f GB swapped without, %.1f GB with "+
			"(%.0f%% less); p99 latency %.2f vs %.2f of the deadline; %d vs %d functions within SLO.\n\n",
			last.Functions, gb(last.Without.SwappedBytes), gb(last.With.SwappedBytes),
			100*(1-float64(last.With.SwappedBytes)/max(1, float64(last.Without.SwappedBytes))), last.Without.P99,
			last.With.P99, last.Without.FunctionsSLOMet, last.With.FunctionsSLOMet)
	}

	w("![share of SLO-compliant functions against function count](policy.png)\n\n")
	w("policy.png: share of SLO-compliant functions (y, 0 to 1, gridlines every 0.1) against function count (x), " +
		"left the Torpor node experiment, middle the Azure trace with Clockwork's models, right the Azure trace with " +
		"Torpor's models (overload); the dashed line is the offline bound. Colours: ")
	colours := []string{"crimson", "blue", "green", "orange", "violet", "teal", "grey", "brown"}
	for i, p := range rep.Policies {
		w("%s %s, ", colours[i%len(colours)], p)
	}
	w("dashed brown the bound.\n\n")

	for _, e := range rep.Experiments {
		w("## %s: %s, %s, node %s, %d simulated minutes\n\n", e.Name, e.Trace, e.Models, e.Node, e.Minutes)
		var pe *experiment
		if prev != nil {
			pe = findExp(*prev, e.Name)
		}
		w("SLO-compliant functions (met / with requests)")
		if pe != nil {
			w(", with the previous run's figure (commit %s) before the arrow", prev.Commit)
		}
		w(":\n\n| functions | bound |")
		for _, p := range rep.Policies {
			w(" %s |", p)
		}
		w("\n|---:|---:|")
		for range rep.Policies {
			w("---:|")
		}
		w("\n")
		for i, n := range e.Counts {
			w("| %d | %d |", n, e.Bounds[i].Functions)
			for _, p := range rep.Policies {
				r := e.Results[p][i]
				if pe != nil {
					if pr, err := find(*pe, p, n); err == nil {
						w(" %d -> ", pr.FunctionsSLOMet)
					} else {
						w(" ")
					}
				} else {
					w(" ")
				}
				w("%d/%d (%.1f%%) |", r.FunctionsSLOMet, r.FunctionsWithTraffic, 100*r.FunctionsSLOMetShare)
			}
			w("\n")
		}
		w("\n")
	}

	w("## Partial residency (Torpor node, faas-gpu)\n\nAn evicted model's first blocks stay on the GPU while the " +
		"memory is not needed and a swap-in copies only the missing ones; eviction trims the last victim only to what " +
		"the placement needs and drops the blocks cheapest to bring back first (see controller.Config." +
		"PartialResidency). Partial copies are the first blocks dropped when memory is needed, so they help only where " +
		"a model's turn comes again before its blocks are wanted by another.\n\n| functions | SLO met without / with | bytes swapped without / with | p99/deadline " +
		"without / with | swaps (none/NVLink/PCIe) without / with |\n|---:|---:|---:|---:|---|\n")
	for _, r := range rep.Partial {
		w("| %d | %d / %d | %.1f GB / %.1f GB | %.2f / %.2f | %d/%d/%d / %d/%d/%d |\n", r.Functions,
			r.Without.FunctionsSLOMet, r.With.FunctionsSLOMet, gb(r.Without.SwappedBytes), gb(r.With.SwappedBytes),
			r.Without.P99, r.With.P99, r.Without.Swaps.None, r.Without.Swaps.NVLink, r.Without.Swaps.PCIe,
			r.With.Swaps.None, r.With.Swaps.NVLink, r.With.Swaps.PCIe)
	}
	w("\n")

	w("## Cluster: %s, %s, %d functions, %d simulated minutes\n\n", cl.Trace, cl.Models, cl.Funcs, cl.Minutes)
	w("Nodes of %s behind gpuserver/router (a node holding the model on a GPU, then its host image, then the least "+
		"loaded, within one outstanding request per GPU of the least loaded; a 429 skips the node until Retry-After; "+
		"a request on a node without the function's host image waits %v + weights at %.0f GB/s for it to load). "+
		"Autoscaled runs start with one node and add one (serving %v later) when fewer than 99%% of an interval's "+
		"requests meet their deadline or the GPUs are over 70%% busy, and drain the least loaded when the load would "+
		"fit under 45%% of one node fewer. Native binding pins each function with its own context on the first node "+
		"with room, for the whole run. Keep-alive holds a GPU per warm instance (Torpor's cold start, %v keep-alive; "+
		"prewarmed: from the start as many instances per function as it ever runs requests at once, never released).\n\n",
		cl.Node, simulate.DefaultImageLoadLatency, simulate.DefaultImageLoadRate/1e9, simulate.DefaultProvisionDelay,
		simulate.DefaultKeepAlive)
	w("| policy | nodes | SLO met | requests on time | refused | GPUs mean | GPUs peak | image loads | routed to a resident model | events/s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range cl.Runs {
		nodes := fmt.Sprintf("%d", r.NodesStart)
		if r.Autoscale {
			nodes = fmt.Sprintf("autoscaled, peak %d", r.NodesPeak)
		}
		if r.Node == "one GPU per instance" {
			nodes = "-"
		}
		w("| %s | %s | %d/%d (%.1f%%) | %d/%d | %d | %.1f | %d | %d | %d | %.0f |\n", r.Name, nodes, r.FunctionsSLOMet,
			r.FunctionsWithTraffic, 100*r.FunctionsSLOMetShare, r.RequestsOnTime, r.Requests, r.Rejected, r.GPUsMean,
			r.GPUsPeak, r.ImageLoads, r.RoutedResident, r.EventsPerSecond)
	}
	w("\n")

	w("## Conclusions on seeds %v\n\n", rep.Seeds)
	w("| seed | overload: faas-gpu | best other policy | active | bound | faas-gpu / bound | cluster: faas-gpu autoscaled GPUs (share) | keep-alive prewarmed GPUs (share) | ratio | partial: bytes without / with | p99 without / with |\n|---:|---:|---|---:|---:|---:|---|---|---:|---|---|\n")
	for _, c := range rep.Checks {
		w("| %d | %d | %s %d | %d | %d | %.1f%% | %.1f (%.1f%%) | %.1f (%.1f%%) | %.3f | %.1f / %.1f GB | %.2f / %.2f |\n",
			c.Seed, c.OverloadFaaS, c.OverloadBestBy, c.OverloadBest, c.OverloadActive, c.OverloadBound,
			pct(c.OverloadFaaS, c.OverloadBound), c.ClusterFaaS, 100*c.ClusterShare, c.ClusterKA, 100*c.ClusterKAShare,
			c.ClusterFaaS/max(1e-9, c.ClusterKA), gb(c.PartialBytes[0]), gb(c.PartialBytes[1]), c.PartialP99[0],
			c.PartialP99[1])
	}
	w("\n(overload: %d functions of the Azure trace with Torpor's models, the first hour, every policy but native "+
		"and keep-alive; partial residency: Torpor node, 720 functions.)\n\n", 1000)

	for _, e := range rep.Experiments {
		w("## Details: %s\n\nRequests on time, latency over deadline (p50/p98/p99), swaps (none/NVLink/PCIe), "+
			"evictions, cold starts, refused requests (of which shed with 429), mean GPU busy fraction, simulated events per "+
			"second:\n\n| functions | policy | on time | p50 | p98 | p99 | swaps | evictions | cold | refused (shed) | busy | events/s |\n"+
			"|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n", e.Name)
		for i, n := range e.Counts {
			for _, p := range rep.Policies {
				r := e.Results[p][i]
				busy := 0.0
				for _, x := range r.GPUBusy {
					busy += x / float64(len(r.GPUBusy))
				}
				w("| %d | %s | %d/%d | %.2f | %.2f | %.2f | %d/%d/%d | %d | %d | %d (%d) | %.2f | %.0f |\n", n, p,
					r.RequestsOnTime, r.Requests, r.P50, r.P98, r.P99, r.Swaps.None, r.Swaps.NVLink, r.Swaps.PCIe,
					r.Evictions, r.ColdStarts, r.Rejected, r.Shed, busy, r.EventsPerSecond)
			}
		}
		w("\n")
	}
	return b.String()
}

func gb(b uint64) float64 { return float64(b) / 1e9 }

func findExp(rep report, name string) *experiment {
	for i := range rep.Experiments {
		if rep.Experiments[i].Name == name {
			return &rep.Experiments[i]
		}
	}
	return nil
}

func indexOf(xs []int, x int) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

func sortedNeeded(cl clusterReport) []string {
	var names []string
	for k := range cl.Needed {
		names = append(names, k)
	}
	for i := 1; i < len(names); i++ { // by GPUs, then name
		for j := i; j > 0; j-- {
			a, b := names[j-1], names[j]
			if cl.Needed[a] > cl.Needed[b] || cl.Needed[a] == cl.Needed[b] && a > b {
				names[j-1], names[j] = b, a
			}
		}
	}
	return names
}
