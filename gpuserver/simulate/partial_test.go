package simulate

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestPartialResidency, by hand: one GPU of 150 MiB at 1 GB/s; a and b of 100 MB each (quota 96 MiB = 100663296
// bytes, no workspace), exec 10 ms, no swap profile (a swap adds its whole transfer). a at 0, b at 200 ms, a at
// 400 ms. Without partial residency each request swaps 100 MB in (100 ms): latencies 110 ms, 300 MB moved. With
// it, b's load trims a only by the 44040192 bytes it lacks, so 56623104 bytes of a stay; a's second load trims b
// the same way and copies only the 43376896 bytes it is missing: 43.376896 ms + 10 ms.
func TestPartialResidency(t *testing.T) {
	node, err := topology.Parse([]byte(`name: one
gpus:
- {name: g0, memory_bytes: 157286400, pcie_switch: 0, copy_engines: 1, h2d_bytes_per_sec: 1e9}
switch_uplink_bytes_per_sec: [1e9]
`))
	if err != nil {
		t.Fatal(err)
	}
	models := []Model{
		{Name: "a", WeightsBytes: 100e6, Native: msd(10), Remote: msd(10), SLO: time.Second, Percentile: 98},
		{Name: "b", WeightsBytes: 100e6, Native: msd(10), Remote: msd(10), SLO: time.Second, Percentile: 98},
	}
	arr := []Arrival{{0, 0}, {msd(200), 1}, {msd(400), 0}}
	for _, tc := range []struct {
		partial bool
		last    time.Duration
		bytes   uint64
	}{
		{false, msd(110), 300e6},
		{true, 53376896 * time.Nanosecond, 243376896},
	} {
		res, err := Run(Config{Models: models, Functions: 2, Node: node, Policy: controller.PolicyFaaSGPU,
			MemoryFactor: 1, Arrivals: arr, PartialResidency: tc.partial}, true)
		if err != nil {
			t.Fatal(err)
		}
		o := res.PerRequest
		if o[0].Latency != msd(110) || o[1].Latency != msd(110) || o[2].Latency != tc.last ||
			res.SwappedBytes != tc.bytes || res.Evictions != 2 {
			t.Errorf("partial %v: %s swapped %d bytes, %d evictions; want last latency %v, %d bytes",
				tc.partial, describe(o), res.SwappedBytes, res.Evictions, tc.last, tc.bytes)
		}
	}
}
