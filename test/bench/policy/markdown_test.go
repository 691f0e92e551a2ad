package main

import (
	"strings"
	"testing"
)

// TestMarkdownStatesEachTarget: a report renders both figures with their ranges, the busy functions, the p98 of
// admitted requests and the admission rule's refusals, the tuning and report splits, the admission rule's and
// the overload control's gains, and says per target whether it was met (here faas-gpu + admission is below torpor
// on requests on one seed at 560 functions, so that target is missed).
func TestMarkdownStatesEachTarget(t *testing.T) {
	run := func(seed uint64, met int, onTime int64, refused int64) outcome {
		return outcome{Seed: seed, Functions: 100, Met: met, Requests: 1000, OnTime: onTime, Refused: refused,
			Admission: refused, BusyFunctions: 20, BusyMet: 19, P98: 0.9, GPUs: 8}
	}
	pt := func(label string, fg, other []outcome) point {
		plain := make([]outcome, len(fg))
		for i, o := range fg {
			o.Met, o.OnTime, o.Refused, o.Admission, o.P98 = o.Met-10, o.OnTime-20, 0, 0, 40
			plain[i] = o
		}
		return point{Label: label, Cells: []cell{{Policy: "faas-gpu + admission", Runs: fg},
			{Policy: "faas-gpu", Runs: plain}, {Policy: "torpor", Runs: other}},
			Bound: []outcome{{Functions: 100, Met: 100}, {Functions: 100, Met: 99}}}
	}
	rep := report{Seeds: []uint64{1, 2}, ClusterTarget: 0.98, ClusterMinutes: 480, RouterNodes: 2,
		Sweeps: []sweep{
			{Name: "torpor-node", Points: []point{
				pt("160", []outcome{run(1, 100, 1000, 0), run(2, 100, 1000, 0)},
					[]outcome{run(1, 100, 999, 0), run(2, 100, 1000, 0)}),
				pt("560", []outcome{run(1, 97, 990, 0), run(2, 96, 980, 0)},
					[]outcome{run(1, 80, 985, 0), run(2, 70, 985, 0)})}},
			{Name: "azure-hours", Points: []point{
				pt("1", []outcome{run(1, 99, 990, 5), run(2, 98, 991, 7)}, []outcome{run(1, 30, 900, 0), run(2, 20, 910, 0)}),
				pt("2", []outcome{run(1, 95, 995, 0), run(2, 94, 996, 0)}, []outcome{run(1, 90, 990, 0), run(2, 90, 990, 0)})}},
		},
		Sizing: []sizing{{Policy: "faas-gpu", Runs: []outcome{run(1, 99, 990, 0), run(2, 99, 990, 0)},
			Reached: []bool{true, true}, Missed: [][]miss{{{Nodes: 1, StoppedAtMinutes: 30.2}},
				{{Nodes: 1, StoppedAtMinutes: 41}}}},
			{Policy: "torpor", Runs: []outcome{{GPUs: 8, Functions: 100, Met: 99}, {GPUs: 12, Functions: 100,
				Met: 99}}, Reached: []bool{true, true}},
			{Policy: "static", Runs: []outcome{{GPUs: 16, Functions: 100, Met: 99},
				{GPUs: 20, Functions: 100, Met: 99}}, Reached: []bool{true, true}},
			{Policy: "static (remoted times)", Runs: []outcome{{GPUs: 12, Functions: 100, Met: 99},
				{GPUs: 12, Functions: 100, Met: 99}}, Reached: []bool{true, true}}},
	}
	md := markdown(rep)
	for _, want := range []string{
		"160 functions (models drawn per seed): faas-gpu + admission keeps 1.000 [1.000-1.000] of functions",
		"560 functions (models drawn per seed): faas-gpu + admission keeps 0.965 [0.960-0.970]",
		"(below torpor at 560 on 1/2 seeds)",
		"tuning split, hour 1", "report split, hours 2 (never used to tune a constant): faas-gpu + admission keeps " +
			"0.950 [0.950-0.950] of functions with >= 50 requests (target >= 0.95 mean: met)",
		"0.996 [0.995-0.996] of requests (target >= 0.97 mean: met)",
		"| 1 | faas-gpu + admission | 0.985 [0.980-0.990] | 0.950 [0.950-0.950] | 0.990 [0.990-0.991] | 6 [5-7] (6 [5-7]) | 0.90 |",
		"| 1 | faas-gpu | 0.885 [0.880-0.890] | 0.950 [0.950-0.950] | 0.970 [0.970-0.971] | 0 | 40 |",
		"| azure-hours | 1 | admission rule on faas-gpu | +0.100 | +0.020 |",
		"| 2 | *offline bound* (no policy can do better) | 0.995 [0.990-1.000] |",
		"the offline bound allows 0.995 [0.990-1.000] of all functions",
		"static packing on shared GPUs (its best variant, static (remoted times)): faas-gpu needs 8 GPUs, static " +
			"packing 12, a ratio of 0.67",
		"against every baseline that reaches the target: the fewest GPUs, 10 [8-12], for torpor: a ratio of 0.80",
		"| 2/2 seeds | 1 node on 2 seeds (after 30-41 simulated min) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
