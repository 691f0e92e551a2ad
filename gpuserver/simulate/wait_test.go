package simulate

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
)

// TestWaitForUncontendedSwap: 2 GPUs behind one 1 GB/s switch uplink. a (100 MB, exec 50 ms, SLO 170 ms) arrives
// at 0 and loads into GPU 0 from host alone: 100 ms, latency 150 ms. b (100 MB, exec 30 ms) arrives at 50.
// Swapping it into GPU 1 now shares the uplink two-sided: a's last 50 MB and b's first 50 MB move at half speed
// until 150, b's last 50 MB alone until 200: a's latency becomes 200 ms (late), b's 180 ms. Waiting for a's
// transfer to end at 100 and loading b alone gives b the same 180 ms and leaves a on time. faas-gpu predicts
// both (the link model as a fluid, learned swap times) and waits; torpor swaps at once. With b's SLO 300 ms b
// meets it either way; with 150 ms it misses it either way, and faas-gpu still waits rather than make a late too.
func TestWaitForUncontendedSwap(t *testing.T) {
	models := func(slo time.Duration) []Model {
		return []Model{
			{Name: "a", WeightsBytes: 100e6, Native: msd(50), Remote: msd(50), SLO: msd(170), Percentile: 98},
			{Name: "b", WeightsBytes: 100e6, Native: msd(30), Remote: msd(30), SLO: slo, Percentile: 98},
		}
	}
	arr := []Arrival{{0, 0}, {msd(50), 1}}
	for _, tc := range []struct {
		policy           controller.Policy
		slo              int
		aLat             time.Duration
		bWait, bLat      time.Duration
		aOnTime, bOnTime bool
	}{
		{controller.PolicyFaaSGPU, 300, msd(150), msd(50), msd(180), true, true},
		{controller.PolicyTorpor, 300, msd(200), 0, msd(180), false, true},
		{controller.PolicyFaaSGPU, 150, msd(150), msd(50), msd(180), true, false},
		{controller.PolicyTorpor, 150, msd(200), 0, msd(180), false, false},
	} {
		res, err := Run(Config{Models: models(msd(tc.slo)), Functions: 2, Node: twoGPUNode(t), Policy: tc.policy,
			MemoryFactor: 2.0972, Arrivals: arr}, true)
		if err != nil {
			t.Fatal(err)
		}
		a, b := res.PerRequest[0], res.PerRequest[1]
		if a.GPU != 0 || a.Swap != "pcie" || a.Latency != tc.aLat || a.OnTime != tc.aOnTime {
			t.Errorf("%s slo %d: a = %+v, want GPU 0 pcie latency %v on time %v", tc.policy, tc.slo, a, tc.aLat,
				tc.aOnTime)
		}
		if b.GPU != 1 || b.Swap != "pcie" || b.Wait != tc.bWait || b.Latency != tc.bLat || b.OnTime != tc.bOnTime {
			t.Errorf("%s slo %d: b = %+v, want GPU 1 pcie after %v latency %v on time %v", tc.policy, tc.slo, b,
				tc.bWait, tc.bLat, tc.bOnTime)
		}
	}
}

// TestWaitForLoadingCopy: a (100 MB, exec 50 ms, SLO 200 ms) arrives at 0 and 10. The first loads into GPU 0
// from host. torpor swaps the second into GPU 1 from host at 10 over the shared uplink: both transfers move at
// half speed until the first ends at 190 (its request late at 240 ms), the second's last 10 MB alone end at 200,
// latency 240 ms. faas-gpu predicts that the second misses its deadline and spoils the first, waits for the copy
// on GPU 0 to finish loading alone (100) and copies it over NVLink (100 MB at 4 GB/s, 25 ms): latencies 150 ms
// and 100 - 10 + 25 + 50 = 165 ms.
func TestWaitForLoadingCopy(t *testing.T) {
	models := []Model{{Name: "a", WeightsBytes: 100e6, Native: msd(50), Remote: msd(50), SLO: msd(200),
		Percentile: 98}}
	arr := []Arrival{{0, 0}, {msd(10), 0}}
	for _, tc := range []struct {
		policy  controller.Policy
		first   time.Duration
		swap    string
		latency time.Duration
	}{
		{controller.PolicyFaaSGPU, msd(150), "nvlink", msd(165)},
		{controller.PolicyTorpor, msd(240), "pcie", msd(240)},
	} {
		res, err := Run(Config{Models: models, Functions: 1, Node: twoGPUNode(t), Policy: tc.policy,
			MemoryFactor: 2.0972, Arrivals: arr}, true)
		if err != nil {
			t.Fatal(err)
		}
		o := res.PerRequest[1]
		if res.PerRequest[0].Latency != tc.first || o.GPU != 1 || o.Swap != tc.swap || o.Latency != tc.latency {
			t.Errorf("%s: %s; want second on GPU 1 %s latency %v", tc.policy, describe(res.PerRequest), tc.swap,
				tc.latency)
		}
	}
}
