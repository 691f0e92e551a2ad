package simulate

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestDataPlaneNeverEvictsWhatTheControllerPlanned: the data plane holds a copy in whole chunks (2 MiB), the
// controller planned it by its quota (whole MiB): four functions of 101 MiB quotas, used in turn, on a GPU whose
// chunks hold 406 MiB, stayed resident in the controller's plan (404 MiB) while the data plane, which holds three
// (408 MiB), evicted one on its own at almost every request after the fourth (37 of 40, counted as pressure). The
// controller now plans each copy in whole chunks (controller.Config.ChunkBytes, set as the gpuserver sets it): the
// same swaps, every eviction its own, none under pressure.
func TestDataPlaneNeverEvictsWhatTheControllerPlanned(t *testing.T) {
	// 452 MiB without a gpuserver context: the chunks are 0.9 of it, 406 MiB in whole chunks.
	node, err := preset(t, "h200x1").WithGPUMemory(452 << 20)
	if err != nil {
		t.Fatal(err)
	}
	// 80.78 MiB of weights: a quota of 1.25 x that, 101 MiB in whole MiB, 102 MiB in chunks.
	models := []Model{{Name: "m", WeightsBytes: 80<<20 + 800<<10, Native: msd(10), Remote: msd(10), SLO: msd(10000),
		Percentile: 98}}
	var arr []Arrival
	for i := range 40 { // functions 0, 1, 2, 3, 0, 1, ... one at a time
		arr = append(arr, Arrival{At: time.Duration(i) * time.Second, Function: i % 4})
	}
	res, err := Run(Config{Models: models, Functions: 4, Node: node, Policy: controller.PolicyFaaSGPU,
		Arrivals: arr, MaxInFlight: DefaultMaxInFlight, DataPlane: true, DataPlaneContextBytes: NoDataPlaneContext},
		false)
	if err != nil {
		t.Fatal(err)
	}
	pressure := res.DataPlaneEvictions[executor.EvictPressure]
	t.Logf("swaps %+v, evictions controller %d, data plane %v", res.Swaps, res.Evictions, res.DataPlaneEvictions)
	if pressure != 0 || res.Evictions != 37 || res.Swaps.PCIe != 40 || res.RequestsOnTime != 40 {
		t.Errorf("%d pressure evictions, %d by the controller, %d swaps, %d of 40 on time; want 0, 37, 40, 40",
			pressure, res.Evictions, res.Swaps.PCIe, res.RequestsOnTime)
	}
}
