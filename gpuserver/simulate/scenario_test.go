package simulate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func msd(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// twoGPUNode: 2 GPUs of 300 MiB behind one switch, 1 GB/s from host (shared uplink 1 GB/s), NVLink 4 GB/s.
func twoGPUNode(t *testing.T) topology.Node {
	t.Helper()
	n, err := topology.Parse([]byte(`name: two
gpus:
- {name: g0, memory_bytes: 314572800, pcie_switch: 0, copy_engines: 1, h2d_bytes_per_sec: 1e9}
- {name: g1, memory_bytes: 314572800, pcie_switch: 0, copy_engines: 1, h2d_bytes_per_sec: 1e9}
switch_uplink_bytes_per_sec: [1e9]
nvlink_bytes_per_sec: [[0, 4e9], [4e9, 0]]
`))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// threeModels: 100 MB each (quota 200 MiB with factor 2, one per GPU), SLO 1 s, exec 50/30/20 ms; no measured swap
// profile, so a swap adds the full transfer time.
func threeModels() []Model {
	mk := func(name string, exec int) Model {
		return Model{Name: name, WeightsBytes: 100e6, Native: msd(exec), Remote: msd(exec), SLO: time.Second,
			Percentile: 98}
	}
	return []Model{mk("a", 50), mk("b", 30), mk("c", 20)}
}

func describe(rs []Outcome) string {
	var b strings.Builder
	for _, o := range rs {
		fmt.Fprintf(&b, "%d@%v gpu%d %s lat %v ev%v;", o.Function, o.Arrival, o.GPU, o.Swap, o.Latency, o.Evicted)
	}
	return b.String()
}

// TestHandComputedScenario replays 2 GPUs and 3 functions under the torpor policy and checks every decision and
// latency against values worked out by hand (see the comments). The models have no measured swap profile, so a
// swap adds its whole transfer time; transfers share the 1 GB/s uplink two-sided (rates recomputed whenever one
// starts or ends) and run until their last byte has moved.
func TestHandComputedScenario(t *testing.T) {
	arr := []Arrival{{0, 0}, {msd(10), 1}, {msd(20), 0}, {msd(250), 2}, {msd(300), 0}, {msd(320), 1}}
	res, err := Run(Config{Models: threeModels(), Functions: 3, Node: twoGPUNode(t), Policy: controller.PolicyTorpor,
		MemoryFactor: 2.0972, Arrivals: arr}, true)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		gpu     int
		swap    string
		latency time.Duration
		evicted string
	}
	wants := []want{
		// t=0 a: both GPUs idle, no neighbour loading: GPU 0, host copy 100 MB at 1 GB/s. At 10 b's copy starts
		// behind the same switch: both move at 0.5 GB/s, so a's last 90 MB take 180 ms: transfer ends at 190,
		// request at 190+50 = 240.
		{0, "pcie", msd(240), "[]"},
		// t=10 b: GPU 1; 90 MB at half speed until 190, its last 10 MB alone: transfer ends at 200, done at 230.
		{1, "pcie", msd(220), "[]"},
		// t=20 a: resident on GPU 0 (loading until 190, then running until 240), no idle GPU: waits. At 230 GPU 1
		// frees: a is resident only on busy GPU 0, so it is copied over NVLink (100 MB at 4 GB/s, 25 ms), evicting
		// b: done at 230+25+50 = 305.
		{1, "nvlink", msd(285), "[{fn-0001-b 1 0}]"},
		// t=250 c: GPU 0 is idle since 240 but a's copy there is pinned as the source of the NVLink copy until 255:
		// c waits; at 255 GPU 0 evicts a and loads c alone: done at 255+100+20 = 375.
		{0, "pcie", msd(125), "[{fn-0000-a 0 0}]"},
		// t=300 a: resident on GPU 1, bound until 305: runs there at 305 without a swap, done at 355.
		{1, "none", msd(55), "[]"},
		// t=320 b: both GPUs bound; at 355 GPU 1 evicts a and loads b alone (c's copy ended at 355): 100 ms, done at
		// 355+100+30 = 485.
		{1, "pcie", msd(165), "[{fn-0000-a 1 0}]"},
	}
	if len(res.PerRequest) != len(wants) {
		t.Fatalf("outcomes = %d", len(res.PerRequest))
	}
	for i, w := range wants {
		o := res.PerRequest[i]
		if o.GPU != w.gpu || o.Swap != w.swap || o.Latency != w.latency || fmt.Sprint(o.Evicted) != w.evicted {
			t.Errorf("request %d: gpu %d swap %s latency %v evicted %v; want gpu %d swap %s latency %v evicted %s",
				i, o.GPU, o.Swap, o.Latency, o.Evicted, w.gpu, w.swap, w.latency, w.evicted)
		}
	}
	if res.RequestsOnTime != 6 || res.FunctionsSLOMet != 3 || res.Evictions != 3 || res.Swaps.PCIe != 4 ||
		res.Swaps.NVLink != 1 || res.Swaps.None != 1 {
		t.Errorf("totals: %+v", res)
	}
	if t.Failed() {
		t.Log(describe(res.PerRequest))
	}

	// NVLink: a resident on busy GPU 0 (swap finished at 100), GPU 1 idle: copy over NVLink, 100 MB at 4 GB/s.
	res, err = Run(Config{Models: threeModels(), Functions: 3, Node: twoGPUNode(t), Policy: controller.PolicyTorpor,
		MemoryFactor: 2.0972, Arrivals: []Arrival{{0, 0}, {msd(110), 0}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if o := res.PerRequest[1]; o.GPU != 1 || o.Swap != "nvlink" || o.Latency != msd(75) {
		t.Errorf("nvlink request: %+v, want GPU 1 nvlink latency 75ms", o)
	}
}

// TestSwapPenalty: a model whose swap alone adds 0.24 of its 25 ms transfer (6 ms) adds 6 ms alone, and every
// millisecond contention stretches the transfer beyond 25 ms in full (41 ms: 6 + 16 = 22 ms); a faster path than
// the profiled one scales (12.5 ms: 3 ms).
func TestSwapPenalty(t *testing.T) {
	for _, tc := range []struct{ took, alone, want time.Duration }{
		{msd(25), msd(25), msd(6)},
		{msd(41), msd(25), msd(22)},
		{time.Duration(12.5 * float64(time.Millisecond)), msd(25), msd(3)},
	} {
		if got := swapPenalty(0.24, tc.took, tc.alone); got != tc.want {
			t.Errorf("swapPenalty(0.24, %v, %v) = %v, want %v", tc.took, tc.alone, got, tc.want)
		}
	}
	if got := swapPenalty(1.5, msd(30), msd(20)); got != msd(45) { // beta > 1 scales beyond the extension
		t.Errorf("swapPenalty(1.5, 30ms, 20ms) = %v, want 45ms", got)
	}
}
