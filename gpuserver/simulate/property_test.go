package simulate

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func torporInputs(t testing.TB) (*Trace, []Model) {
	t.Helper()
	tr, err := LoadTrace("../../../shared/workloads/torpor-203fn-31min.csv")
	if err != nil {
		t.Skipf("shared workloads not available: %v", err)
	}
	ms, err := LoadModels("../../../shared/workloads/models-torpor-v100.csv")
	if err != nil {
		t.Fatal(err)
	}
	return tr, ms
}

// TestUnlimitedMemoryPlacementEquivalence: with memory for every model on every GPU and a warm node, no placement
// or eviction choice matters, so every placement policy sharing a queue order yields the same latencies.
func TestUnlimitedMemoryPlacementEquivalence(t *testing.T) {
	tr, ms := torporInputs(t)
	node, _ := topology.Preset("v100x4")
	node, _ = node.WithGPUMemory(1 << 40)
	var base []Outcome
	for _, p := range []controller.Policy{controller.PolicyTorpor, controller.PolicyRandomPlacement,
		controller.PolicyLRUEviction} {
		r, err := Run(Config{Trace: tr, Models: ms, Functions: 200, Node: node, Minutes: 3, Policy: p, Seed: 7,
			Prewarm: true}, true)
		if err != nil {
			t.Fatal(err)
		}
		if r.Evictions != 0 || r.Swaps.PCIe != 0 || r.Swaps.NVLink != 0 {
			t.Fatalf("%s: swapped or evicted with unlimited memory: %+v", p, r.Swaps)
		}
		if base == nil {
			base = r.PerRequest
			continue
		}
		for i := range base {
			if base[i].Latency != r.PerRequest[i].Latency {
				t.Fatalf("%s: request %d latency %v, torpor %v", p, i, r.PerRequest[i].Latency, base[i].Latency)
			}
		}
	}
}

// TestProperties runs random workloads through every policy on a small node, checking after every step that no
// GPU is over capacity and every resident footprint within its quota (the controller's own accounting is
// cross-checked against the node), and that every request is served exactly once.
func TestProperties(t *testing.T) {
	node := twoGPUNode(t)
	rng := rand.New(rand.NewPCG(11, 12))
	models := threeModels()
	models = append(models, Model{Name: "d", WeightsBytes: 40e6, Native: msd(5), Remote: msd(4), SLO: msd(60),
		Percentile: 98})
	for trial := range 4 {
		var arr []Arrival
		at := time.Duration(0)
		for range 300 {
			at += time.Duration(rng.Int64N(int64(40 * time.Millisecond)))
			arr = append(arr, Arrival{At: at, Function: rng.IntN(6)})
		}
		for _, p := range controller.Policies() {
			r, err := Run(Config{Models: models, Functions: 6, Node: node, Policy: p, Arrivals: arr, Seed: uint64(trial),
				MemoryFactor: 1.25}, true)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if len(r.PerRequest) != len(arr) || r.Requests != int64(len(arr)) {
				t.Fatalf("%s: %d outcomes for %d arrivals", p, len(r.PerRequest), len(arr))
			}
			ids := map[uint64]bool{}
			for _, o := range r.PerRequest {
				if ids[o.ID] {
					t.Fatalf("%s: request %d twice", p, o.ID)
				}
				ids[o.ID] = true
				if !o.Rejected && (o.GPU < 0 || o.Latency <= 0) {
					t.Fatalf("%s: request %d never served: %+v", p, o.ID, o)
				}
			}
			if got := r.RequestsOnTime + r.Rejected; got > r.Requests {
				t.Fatalf("%s: on time + rejected %d > requests %d", p, got, r.Requests)
			}
		}
	}
}

// TestCapacityAndQuotaInvariant drives the controller directly with random submits and completions and checks
// its status after every step: used memory never exceeds a GPU's capacity, equals the sum of resident quotas, and
// no function is resident twice on one GPU.
func TestCapacityAndQuotaInvariant(t *testing.T) {
	node := twoGPUNode(t)
	for _, p := range controller.Policies() {
		ctl, err := controller.New(controller.Config{Policy: p, Node: node, Seed: 3, ContextBytes: 20 << 20})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(5, uint64(len(p))))
		now := epoch
		quotas := map[string]uint64{}
		for i, q := range []uint64{60 << 20, 100 << 20, 150 << 20, 200 << 20, 90 << 20} {
			name := string(rune('a' + i))
			quotas[name] = q
			f := controller.Function{ModelBytes: q / 2}
			f.Name, f.MemoryBytes, f.SLO = name, q, 100*time.Millisecond
			if err := ctl.Register(now, f); err != nil {
				t.Fatal(err)
			}
		}
		bound := map[uint64]controller.Decision{}
		var id uint64
		for step := range 2000 {
			now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
			if rng.IntN(2) == 0 {
				id++
				_ = ctl.Submit(now, id, string(rune('a'+rng.IntN(5))))
			} else if len(bound) > 0 {
				keys := make([]uint64, 0, len(bound))
				for k := range bound {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				k := keys[rng.IntN(len(keys))]
				if _, err := ctl.Complete(now, k, time.Millisecond); err != nil {
					t.Fatal(err)
				}
				delete(bound, k)
			}
			for _, d := range ctl.Dispatch(now) {
				if _, dup := bound[d.Request]; dup {
					t.Fatalf("%s: request %d bound twice", p, d.Request)
				}
				bound[d.Request] = d
			}
			st := ctl.Status()
			for _, g := range st.GPUs {
				var sum uint64
				for _, f := range g.Resident {
					sum += quotas[f]
				}
				if p == controller.PolicyNative || p == controller.PolicyKeepAlive {
					sum += uint64(len(g.Resident)) * 20 << 20
				}
				if g.UsedBytes > g.MemoryBytes || g.UsedBytes != sum {
					t.Fatalf("%s step %d: GPU %d used %d, capacity %d, resident quotas %d", p, step, g.Index,
						g.UsedBytes, g.MemoryBytes, sum)
				}
			}
		}
	}
}

// BenchmarkSimulate reports simulated events per second for 1000 functions of the Azure trace over 60 simulated
// minutes under the faas-gpu policy (the speed target: at most 60 s on one core).
func BenchmarkSimulate(b *testing.B) {
	wall := benchAzureHour(b, "models-clockwork-v100.csv", func(cfg Config) (int64, float64, error) {
		r, err := Run(cfg, false)
		return r.Events, r.WallSeconds, err
	})
	b.ReportMetric(wall/float64(b.N), "s/run")
}

// BenchmarkClusterHour reports simulated events per second for 1000 functions of the Azure trace with Torpor's
// models on a 16-node cluster for one hour under the faas-gpu policy (the speed target, `make bench-policy`: a
// whole day of it in under 2 minutes on one core).
func BenchmarkClusterHour(b *testing.B) {
	benchAzureHour(b, "models-torpor-v100.csv", func(cfg Config) (int64, float64, error) {
		r, err := RunCluster(ClusterConfig{Config: cfg, Nodes: 16})
		return r.Events, r.WallSeconds, err
	})
}

// benchAzureHour runs run on 1000 functions of the Azure trace with the shared workloads' models file over 60
// simulated minutes under the faas-gpu policy, reports the simulated events per second and returns the wall
// seconds of all runs.
func benchAzureHour(b *testing.B, models string, run func(Config) (events int64, wall float64, err error)) float64 {
	b.Helper()
	tr, err := LoadTrace("../../../shared/workloads/azure2019-500fn-8h.csv")
	if err != nil {
		b.Skipf("shared workloads not available: %v", err)
	}
	ms, err := LoadModels("../../../shared/workloads/" + models)
	if err != nil {
		b.Fatal(err)
	}
	node, _ := topology.Preset("v100x4")
	var events int64
	var wall float64
	for b.Loop() {
		ev, w, err := run(Config{Trace: tr, Models: ms, Functions: 1000, Node: node, Minutes: 60,
			Policy: controller.PolicyFaaSGPU, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		events += ev
		wall += w
	}
	b.ReportMetric(float64(events)/wall, "events/s")
	return wall
}
