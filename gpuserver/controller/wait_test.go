package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// sharedSwitchNode: 2 GPUs of 300 MiB behind one 1 GB/s switch uplink, NVLink 4 GB/s.
func sharedSwitchNode(t *testing.T) topology.Node {
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

// TestContendedSwapPrediction: a and b (100 MB each, no SLO) swap in from host at the same time, so they share
// the uplink two-sided: each moves at half speed and both end at 200 ms. faas-gpu predicts b's swap as the seeded
// time alone (100 ms) plus the 100 ms the fluid link model stretches its transfer by and, when b reports 200 ms
// at 200 ms, takes the stretch off and learns 100 ms (the time alone); torpor predicts 100 ms and learns 200 ms.
func TestContendedSwapPrediction(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		policy           Policy
		predicted, learn time.Duration
	}{
		{PolicyFaaSGPU, 200 * time.Millisecond, 100 * time.Millisecond},
		{PolicyTorpor, 100 * time.Millisecond, 200 * time.Millisecond},
	} {
		c, err := New(Config{Policy: tc.policy, Node: sharedSwitchNode(t)})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"a", "b"} {
			if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 200 << 20},
				ModelBytes: 100e6, ExecSeed: 30 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		for id, name := range []string{"a", "b"} {
			if err := c.Submit(t0, uint64(id+1), name); err != nil {
				t.Fatal(err)
			}
		}
		ds := c.Dispatch(t0)
		if len(ds) != 2 || ds[0].Swap != SwapPCIe || ds[1].Swap != SwapPCIe || ds[1].GPU == ds[0].GPU {
			t.Fatalf("%s: decisions %+v", tc.policy, ds)
		}
		if ds[0].PredictedSwap != 100*time.Millisecond || ds[1].PredictedSwap != tc.predicted {
			t.Errorf("%s: predicted swaps %v, %v; want 100ms, %v", tc.policy, ds[0].PredictedSwap,
				ds[1].PredictedSwap, tc.predicted)
		}
		if err := c.SwapDone(t0.Add(200*time.Millisecond), 2, 200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if got := c.fns["b"].swap[SwapPCIe].Mean(); got != tc.learn {
			t.Errorf("%s: learned %v, want %v", tc.policy, got, tc.learn)
		}
	}
}

// TestTiesGoToTheLeastUsedGPU: four equal GPUs with the function resident on each (prewarmed), and requests that
// each find every GPU idle. Ties used to go to the lowest index (every request on GPU 0); they go to the GPU
// bound for the least time so far, so the requests rotate over the GPUs and each is busy a quarter of the time.
func TestTiesGoToTheLeastUsedGPU(t *testing.T) {
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for _, p := range []Policy{PolicyFaaSGPU, PolicyTorpor, PolicyGShareDQLS} {
		c, err := New(Config{Policy: p, Node: node, Prewarm: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 30,
			SLO: time.Second}}); err != nil {
			t.Fatal(err)
		}
		var gpus []int
		now := t0
		for id := uint64(1); id <= 8; id++ {
			if err := c.Submit(now, id, "f"); err != nil {
				t.Fatal(err)
			}
			ds := c.Dispatch(now)
			if len(ds) != 1 || ds[0].Swap != SwapNone {
				t.Fatalf("%s: decisions %+v", p, ds)
			}
			gpus = append(gpus, ds[0].GPU)
			now = now.Add(10 * time.Millisecond)
			if _, err := c.Complete(now, id, 10*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			now = now.Add(10 * time.Millisecond)
		}
		if got := fmt.Sprint(gpus); got != "[0 1 2 3 0 1 2 3]" {
			t.Errorf("%s: GPUs %s, want [0 1 2 3 0 1 2 3]", p, got)
		}
		for i, b := range c.BusyTime(now) {
			if b != 20*time.Millisecond {
				t.Errorf("%s: GPU %d busy %v, want 20ms", p, i, b)
			}
		}
	}
}
