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
// latency against values worked out by hand (see the comments).
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
		// t=0 a: both GPUs idle, no neighbour loading: GPU 0, host copy 100 MB at 1 GB/s = 100 ms; done at 150.
		{0, "pcie", msd(150), "[]"},
		// t=10 b: GPU 1, its neighbour loads: the uplink is shared, 200 ms; done at 10+200+30 = 240.
		{1, "pcie", msd(230), "[]"},
		// t=20 a: resident on GPU 0 (still loading), no idle GPU: waits; at 150 runs on GPU 0 without a swap: 200.
		{0, "none", msd(180), "[]"},
		// t=250 c: both idle; GPU 0 first, evicting a; 100 ms alone; done at 370.
		{0, "pcie", msd(120), "[{fn-0000-a 0}]"},
		// t=300 a: GPU 1 evicting b; GPU 0 still loading c until 350: shared uplink, 200 ms; done at 550.
		{1, "pcie", msd(250), "[{fn-0001-b 1}]"},
		// t=320 b: waits; at 370 GPU 0, evicting c, while GPU 1 loads a until 500: 200 ms; done at 600.
		{0, "pcie", msd(280), "[{fn-0002-c 0}]"},
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
	if res.RequestsOnTime != 6 || res.FunctionsSLOMet != 3 || res.Evictions != 3 || res.Swaps.PCIe != 5 {
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
