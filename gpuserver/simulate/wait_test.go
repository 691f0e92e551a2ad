package simulate

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
)

// TestWaitForUncontendedSwap: 2 GPUs behind one 1 GB/s switch uplink. a (100 MB, exec 50 ms) arrives at 0 and
// loads into GPU 0 from host alone: 100 ms. b (100 MB, exec 30 ms) arrives at 50. Swapping it into GPU 1 now
// shares the uplink with a's load: 200 ms, latency 230 ms. faas-gpu predicts that (swap time alone x the link
// model's slowdown of 2), and, when b's SLO is 200 ms, that waiting for a's transfer to end at 100 and then
// loading alone meets it: 50 + 100 + 30 = 180 ms. With a 150 ms SLO waiting cannot help either (180 > 150), so it
// swaps at once like torpor.
func TestWaitForUncontendedSwap(t *testing.T) {
	models := func(slo time.Duration) []Model {
		return []Model{
			{Name: "a", WeightsBytes: 100e6, Native: msd(50), Remote: msd(50), SLO: time.Second, Percentile: 98},
			{Name: "b", WeightsBytes: 100e6, Native: msd(30), Remote: msd(30), SLO: slo, Percentile: 98},
		}
	}
	arr := []Arrival{{0, 0}, {msd(50), 1}}
	for _, tc := range []struct {
		policy  controller.Policy
		slo     int
		latency time.Duration
		onTime  bool
	}{
		{controller.PolicyFaaSGPU, 200, msd(180), true},
		{controller.PolicyTorpor, 200, msd(230), false},
		{controller.PolicyFaaSGPU, 150, msd(230), false},
	} {
		res, err := Run(Config{Models: models(msd(tc.slo)), Functions: 2, Node: twoGPUNode(t), Policy: tc.policy,
			MemoryFactor: 2.0972, Arrivals: arr}, true)
		if err != nil {
			t.Fatal(err)
		}
		a, b := res.PerRequest[0], res.PerRequest[1]
		if a.GPU != 0 || a.Swap != "pcie" || a.Latency != msd(150) {
			t.Errorf("%s slo %d: a = %+v, want GPU 0 pcie 150ms", tc.policy, tc.slo, a)
		}
		if b.GPU != 1 || b.Swap != "pcie" || b.Latency != tc.latency || b.OnTime != tc.onTime {
			t.Errorf("%s slo %d: b = %+v, want GPU 1 pcie latency %v on time %v", tc.policy, tc.slo, b, tc.latency,
				tc.onTime)
		}
	}
}

// TestWaitForLoadingCopy: a (100 MB, exec 50 ms, SLO 200 ms) arrives at 0 and 10. The first loads into GPU 0
// alone (100 ms). torpor swaps the second into GPU 1 from host over the shared uplink: 200 ms, latency 250 ms.
// faas-gpu waits for the copy on GPU 0 to finish loading (100) and copies it over NVLink (100 MB at 4 GB/s,
// 25 ms): latency 100 - 10 + 25 + 50 = 165 ms.
func TestWaitForLoadingCopy(t *testing.T) {
	models := []Model{{Name: "a", WeightsBytes: 100e6, Native: msd(50), Remote: msd(50), SLO: msd(200),
		Percentile: 98}}
	arr := []Arrival{{0, 0}, {msd(10), 0}}
	for _, tc := range []struct {
		policy  controller.Policy
		swap    string
		latency time.Duration
	}{
		{controller.PolicyFaaSGPU, "nvlink", msd(165)},
		{controller.PolicyTorpor, "pcie", msd(250)},
	} {
		res, err := Run(Config{Models: models, Functions: 1, Node: twoGPUNode(t), Policy: tc.policy,
			MemoryFactor: 2.0972, Arrivals: arr}, true)
		if err != nil {
			t.Fatal(err)
		}
		o := res.PerRequest[1]
		if res.PerRequest[0].Latency != msd(150) || o.GPU != 1 || o.Swap != tc.swap || o.Latency != tc.latency {
			t.Errorf("%s: %s; want second on GPU 1 %s latency %v", tc.policy, describe(res.PerRequest), tc.swap,
				tc.latency)
		}
	}
}
