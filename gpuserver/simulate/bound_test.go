package simulate

import (
	"math"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
)

// TestOfflineBound, by hand: 2 GPUs, models of 100 MB (a swap alone adds the whole 100 ms transfer), SLO 300 ms,
// the last arrival at 200 ms: capacity 2 x (200 + 300) ms = 1 s. f0 (exec 50 ms, 10 requests) needs at least
// 10 x 50 + 100 = 600 ms, f1 (30 ms, 20 requests) 20 x 30 + 100 = 700 ms, f2 (20 ms, 1 request) 120 ms, f3
// (400 ms) can never meet 300 ms. Cheapest first: 120 + 600 fit, 700 more do not: 2 of the 4 with traffic.
func TestOfflineBound(t *testing.T) {
	mk := func(name string, exec int) Model {
		return Model{Name: name, WeightsBytes: 100e6, Native: msd(exec), Remote: msd(exec), SLO: msd(300),
			Percentile: 98}
	}
	models := []Model{mk("a", 50), mk("b", 30), mk("c", 20), mk("e", 400)}
	var arr []Arrival
	for i := range 20 {
		if i < 10 {
			arr = append(arr, Arrival{At: msd(i * 10), Function: 0})
		}
		arr = append(arr, Arrival{At: msd(i * 10), Function: 1})
	}
	arr = append(arr, Arrival{At: msd(100), Function: 2}, Arrival{At: msd(200), Function: 3})
	sortArrivals(arr)
	b, err := OfflineBound(Config{Models: models, Functions: 5, Node: twoGPUNode(t), Policy: controller.PolicyFaaSGPU,
		MemoryFactor: 1.25, Arrivals: arr})
	if err != nil {
		t.Fatal(err)
	}
	if b.Functions != 2 || b.FunctionsWithTraffic != 4 || b.Share != 0.5 ||
		math.Abs(b.CapacityGPUSeconds-1) > 1e-9 || math.Abs(b.DemandGPUSeconds-1.42) > 1e-9 {
		t.Fatalf("bound %+v, want 2 of 4, capacity 1 s, least demand 1.42 s", b)
	}
}
