package main

import (
	"strings"
	"testing"
)

// TestMarkdownStatesEachTarget: a report renders both figures with their ranges and says, per target, whether it
// was met (here faas-gpu is below torpor on requests on one seed at 560 functions, so that target is missed).
func TestMarkdownStatesEachTarget(t *testing.T) {
	run := func(seed uint64, met int, onTime int64, refused int64) outcome {
		return outcome{Seed: seed, Functions: 100, Met: met, Requests: 1000, OnTime: onTime, Refused: refused, GPUs: 8}
	}
	pt := func(label string, fg, other []outcome) point {
		return point{Label: label, Cells: []cell{{Policy: "faas-gpu", Runs: fg}, {Policy: "torpor", Runs: other}}}
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
				{GPUs: 20, Functions: 100, Met: 99}}, Reached: []bool{true, true}}},
	}
	md := markdown(rep)
	for _, want := range []string{
		"160 functions: faas-gpu keeps 1.000 [1.000-1.000] of functions within SLO (target >= 0.99 mean: met)",
		"560 functions: faas-gpu keeps 0.965 [0.960-0.970]", "(below torpor on 1 of 2 seeds)",
		"Azure hours 2-8 only", "0.945 [0.940-0.950]",
		"static packing on shared GPUs: faas-gpu needs 8 GPUs, static packing 18 [16-20], a ratio of 0.44",
		"against every baseline that reaches the target: the fewest GPUs, 10 [8-12], for torpor: a ratio of 0.80",
		"| 2/2 seeds | 1 node on 2 seeds (after 30-41 simulated min) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
