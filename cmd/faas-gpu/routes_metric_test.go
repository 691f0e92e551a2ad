package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/provider/kubernetes"
)

// TestRoutesCollector: the kubernetes backend's replica picks are exported as faas_gpu_provider_routes_total, one
// counter per reason, read when scraped.
func TestRoutesCollector(t *testing.T) {
	counts := kubernetes.RouteCounts{Resident: 7, LeastQueued: 2, RoundRobin: 1}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newRoutesCollector(func() kubernetes.RouteCounts { return counts }))
	read := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "faas_gpu_provider_routes_total" {
				t.Fatalf("unexpected metric %s", mf.GetName())
			}
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
		return out
	}
	want := map[string]float64{"resident": 7, "least_queued": 2, "shedding": 0, "round_robin": 1}
	if got := read(); len(got) != len(want) || got["resident"] != 7 || got["least_queued"] != 2 ||
		got["shedding"] != 0 || got["round_robin"] != 1 {
		t.Fatalf("scraped %v, want %v", got, want)
	}
	counts.Resident = 9
	if got := read(); got["resident"] != 9 {
		t.Fatalf("after two more picks: resident %v, want 9", got["resident"])
	}
}
