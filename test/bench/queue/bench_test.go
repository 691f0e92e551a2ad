package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// The benchmark's pieces run end to end at a small size, so that `make bench-queue` cannot rot.
func TestThroughputSmall(t *testing.T) {
	r, err := Throughput(context.Background(), worker.OrderSLOAware, 300, 4, 5, 16)
	if err != nil {
		t.Fatal(err)
	}
	if r.Messages != 300 || r.DrainRate <= 0 || r.EndToEndRate <= 0 || r.IdleP50 <= 0 || r.OrderingPerMessage <= 0 {
		t.Fatalf("result %+v", r)
	}
}

func TestOverloadSmall(t *testing.T) {
	models := []Model{
		{Name: "cv", Exec: 5 * time.Millisecond, SLO: 80 * time.Millisecond, Percentile: 98},
		{Name: "nlp", Exec: 10 * time.Millisecond, SLO: 200 * time.Millisecond, Percentile: 98},
	}
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	arrivals, rate := Arrivals(models, len(node.GPUs), 2, 200*time.Millisecond, 7)
	again, _ := Arrivals(models, len(node.GPUs), 2, 200*time.Millisecond, 7)
	if len(arrivals) == 0 || len(arrivals) != len(again) || rate <= 0 {
		t.Fatalf("arrivals %d (again %d), rate %v: not repeatable", len(arrivals), len(again), rate)
	}
	r, err := Overload(context.Background(), Strategies()[0], node, models, arrivals)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range r.Classes {
		n += c.Requests
	}
	if r.Requests != len(arrivals) || n != len(arrivals) || len(r.Classes) != 2 {
		t.Fatalf("result %+v for %d arrivals", r, len(arrivals))
	}
}

func TestLoadModels(t *testing.T) {
	models, err := LoadModels("../../../../shared/workloads/models-torpor-v100.csv")
	if err != nil {
		t.Skipf("workload data not present: %v", err)
	}
	if len(models) != 8 {
		t.Fatalf("%d models, want 8", len(models))
	}
	for _, m := range models {
		if m.Exec <= 0 || (m.SLO != 80*time.Millisecond && m.SLO != 200*time.Millisecond) {
			t.Fatalf("model %+v", m)
		}
	}
	if _, err := LoadModels("testdata/nope.csv"); err == nil || !strings.Contains(err.Error(), "nope.csv") {
		t.Fatalf("missing file: %v", err)
	}
}
