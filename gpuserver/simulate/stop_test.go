package simulate

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestStopBelowEndsAHopelessRunEarly: an hour of the Torpor trace at 700 functions on one node misses a 98%
// target by far; with StopBelow the run ends long before its hour, says so, and has not yet counted every
// request. A run that reaches its floor is not stopped and has exactly the figures of a run without one.
func TestStopBelowEndsAHopelessRunEarly(t *testing.T) {
	tr, ms := torporInputs(t)
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Trace: tr, Models: ms, Functions: 700, Node: node, Minutes: 10, Policy: controller.PolicyTorpor,
		Seed: 3}
	full, err := Run(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	if full.Stopped || full.FunctionsSLOMetShare >= 0.9 {
		t.Fatalf("without a floor: %+v, want a complete run below 0.9 of functions", full)
	}
	cfg.StopBelow = 0.98
	stopped, err := Run(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	if !stopped.Stopped || stopped.SimulatedSeconds >= full.SimulatedSeconds/2 ||
		stopped.RequestsOnTime >= full.RequestsOnTime {
		t.Fatalf("with a floor of 0.98: stopped %v at %.0f s (full run %.0f s), %d on time (full %d)",
			stopped.Stopped, stopped.SimulatedSeconds, full.SimulatedSeconds, stopped.RequestsOnTime,
			full.RequestsOnTime)
	}
	cc := ClusterConfig{Config: cfg, Nodes: 1}
	cr, err := RunCluster(cc)
	if err != nil {
		t.Fatal(err)
	}
	if !cr.Stopped || cr.SimulatedSeconds >= full.SimulatedSeconds/2 {
		t.Fatalf("cluster of one node with a floor of 0.98: stopped %v at %.0f s", cr.Stopped, cr.SimulatedSeconds)
	}

	// A floor the run reaches changes nothing.
	cfg.Functions, cfg.StopBelow = 160, 0
	easy, err := Run(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	cfg.StopBelow = easy.FunctionsSLOMetShare
	floored, err := Run(cfg, false)
	if err != nil {
		t.Fatal(err)
	}
	if floored.Stopped || floored.FunctionsSLOMet != easy.FunctionsSLOMet ||
		floored.RequestsOnTime != easy.RequestsOnTime || floored.Requests != easy.Requests {
		t.Fatalf("floor at the run's own share %.3f: %+v, want the figures of the run without one %+v",
			easy.FunctionsSLOMetShare, floored, easy)
	}
}

// TestTraceArrivalsReplayTheRun: the arrivals TraceArrivals gives, passed back as Config.Arrivals, replay the
// same run request for request.
func TestTraceArrivalsReplayTheRun(t *testing.T) {
	tr, ms := torporInputs(t)
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Trace: tr, Models: ms, Functions: 300, Node: node, Minutes: 2, StartMinute: 5,
		Policy: controller.PolicyFaaSGPU, Seed: 9}
	a, err := Run(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Arrivals, err = TraceArrivals(cfg); err != nil {
		t.Fatal(err)
	}
	b, err := Run(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.PerRequest) != len(b.PerRequest) || a.RequestsOnTime != b.RequestsOnTime ||
		a.FunctionsSLOMet != b.FunctionsSLOMet {
		t.Fatalf("from the trace: %d requests, %d on time; replayed: %d, %d", len(a.PerRequest), a.RequestsOnTime,
			len(b.PerRequest), b.RequestsOnTime)
	}
	for i := range a.PerRequest {
		x, y := a.PerRequest[i], b.PerRequest[i]
		if x.Latency != y.Latency || x.Arrival != y.Arrival || x.GPU != y.GPU || x.Swap != y.Swap ||
			x.Function != y.Function {
			t.Fatalf("request %d: %+v from the trace, %+v replayed", i, a.PerRequest[i], b.PerRequest[i])
		}
	}
}
