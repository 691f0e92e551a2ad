package simulate

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/router"
)

// TestKeepAlive, by hand: one function (100 MB, native exec 50 ms, SLO 1 s) at 0, 1 s and 20 min. Lazily: the
// first cold starts an instance (3 s + 0.1 s to load, then 50 ms: 3.15 s, late); at 1 s that instance is busy,
// so a second cold starts; both stay warm 10 min after their last request and are gone at 20 min, when a third
// cold starts. GPU time 603.15 + 603.15 + 3.15 s over 1203.15 s; peak 2; no request on time. Prewarmed: one
// instance from the start serves all three in 50 ms, one GPU throughout.
func TestKeepAlive(t *testing.T) {
	models := []Model{{Name: "a", WeightsBytes: 100e6, Native: msd(50), Remote: msd(40), SLO: time.Second,
		Percentile: 98}}
	arr := []Arrival{{0, 0}, {time.Second, 0}, {20 * time.Minute, 0}}
	cfg := Config{Models: models, Functions: 1, Node: twoGPUNode(t), Arrivals: arr}
	r, err := RunKeepAlive(KeepAliveConfig{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if want := (603.15 + 603.15 + 3.15) / 1203.15; math.Abs(r.GPUsMean-want) > 1e-9 || r.GPUsPeak != 2 ||
		r.RequestsOnTime != 0 || r.FunctionsSLOMet != 0 || r.FunctionsWithTraffic != 1 {
		t.Fatalf("lazy: %+v, want GPUs mean %v, peak 2, nothing on time", r, want)
	}
	r, err = RunKeepAlive(KeepAliveConfig{Config: cfg, Prewarmed: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.GPUsMean != 1 || r.GPUsPeak != 1 || r.RequestsOnTime != 3 || r.FunctionsSLOMet != 1 {
		t.Fatalf("prewarmed: %+v, want one GPU, all on time", r)
	}
}

// TestClusterProperties runs random workloads on clusters of the two-GPU node - fixed, autoscaled and native -
// and checks the accounting: every request is served or refused once, a fixed cluster provisions its GPUs
// throughout, an autoscaled one between its start and its peak, and its timeline never goes past the peak.
func TestClusterProperties(t *testing.T) {
	models := append(threeModels(), Model{Name: "d", WeightsBytes: 40e6, Native: msd(5), Remote: msd(4),
		SLO: msd(60), Percentile: 98})
	rng := rand.New(rand.NewPCG(21, 22))
	var arr []Arrival
	at := time.Duration(0)
	for range 3000 { // about 50 requests a second for a minute, then a quiet tail
		at += time.Duration(rng.Int64N(int64(40 * time.Millisecond)))
		arr = append(arr, Arrival{At: at, Function: rng.IntN(6)})
	}
	arr = append(arr, Arrival{At: at + 5*time.Minute, Function: 0})
	for _, tc := range []struct {
		policy    controller.Policy
		nodes     int
		autoscale bool
	}{
		{controller.PolicyFaaSGPU, 2, false},
		{controller.PolicyTorpor, 3, false},
		{controller.PolicyFaaSGPU, 1, true},
		{controller.PolicyNative, 2, false},
	} {
		r, err := RunCluster(ClusterConfig{Config: Config{Models: models, Functions: 6, Node: twoGPUNode(t),
			Policy: tc.policy, Arrivals: arr, MemoryFactor: 1.25, Seed: 5}, Nodes: tc.nodes, Autoscale: tc.autoscale,
			AutoscaleConfig: router.AutoscaleConfig{Every: 10 * time.Second, Cooldown: 30 * time.Second},
			ProvisionDelay:  20 * time.Second})
		if err != nil {
			t.Fatalf("%s: %v", tc.policy, err)
		}
		if r.Requests != int64(len(arr)) || r.RequestsOnTime > r.Requests-r.Rejected || r.FunctionsWithTraffic != 6 {
			t.Fatalf("%s %d nodes: %+v", tc.policy, tc.nodes, r)
		}
		gpus := 2 * float64(tc.nodes)
		if !tc.autoscale && (math.Abs(r.GPUsMean-gpus) > 1e-9 || r.NodesPeak != tc.nodes) {
			t.Errorf("%s fixed %d nodes: GPUs mean %v, peak nodes %d", tc.policy, tc.nodes, r.GPUsMean, r.NodesPeak)
		}
		if tc.autoscale {
			if r.NodesAdded == 0 || r.GPUsMean < gpus || r.GPUsMean > float64(r.GPUsPeak) {
				t.Errorf("autoscaled: added %d, GPUs mean %v, peak %d", r.NodesAdded, r.GPUsMean, r.GPUsPeak)
			}
			for _, s := range r.Timeline {
				if s.Nodes < 1 || s.Nodes > r.NodesPeak {
					t.Fatalf("timeline %+v outside 1..%d", s, r.NodesPeak)
				}
			}
		}
		if tc.policy == controller.PolicyNative && r.ImageLoads != 0 {
			t.Errorf("native loaded %d images", r.ImageLoads)
		}
	}
}

// TestStaticPackingAndRoundRobin: static packing puts the hot function's model on both GPUs of its node and every
// function somewhere (no swap, no refusal) on two nodes; placeStatic balances demand over the nodes. Round robin
// alternates nodes whatever they hold, so requests wait for images and swaps the router avoids: fewer on time.
func TestStaticPackingAndRoundRobin(t *testing.T) {
	models := []Model{{Name: "a", WeightsBytes: 100e6, Native: msd(10), Remote: msd(10), SLO: time.Second,
		Percentile: 98}}
	var arr []Arrival
	for i := range 400 {
		fn := 0 // the hot function
		if i%4 == 3 {
			fn = 1 + i%3
		}
		arr = append(arr, Arrival{At: time.Duration(i) * 5 * time.Millisecond, Function: fn})
	}
	cfg := ClusterConfig{Config: Config{Models: models, Functions: 4, Node: twoGPUNode(t), Arrivals: arr,
		Policy: controller.PolicyStatic}, Nodes: 2}
	home, gpus := placeStatic(&cfg, []fnModel{{model: models[0]}, {model: models[0]}, {model: models[0]},
		{model: models[0]}}, arr, 2)
	if len(gpus[0]) != 2 || home[1] == home[0] && home[2] == home[0] && home[3] == home[0] {
		t.Fatalf("static packing: homes %v, GPUs %v; want the hot function on both GPUs of its node, the others "+
			"not all beside it", home, gpus)
	}
	r, err := RunCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.FunctionsSLOMet != 4 || r.RequestsOnTime != 400 || r.Rejected != 0 || r.ImageLoads != 0 {
		t.Fatalf("static: %+v", r)
	}
	cfg.Policy = controller.PolicyFaaSGPU
	routed, err := RunCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RoundRobin = true
	rr, err := RunCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rr.RequestsOnTime >= routed.RequestsOnTime {
		t.Fatalf("round robin %d image loads, %d on time; router %d, %d", rr.ImageLoads, rr.RequestsOnTime,
			routed.ImageLoads, routed.RequestsOnTime)
	}
}
