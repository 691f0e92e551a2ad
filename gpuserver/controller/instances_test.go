package controller

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestSiblingCopyIsAnNVLinkSource: a second copy of a hot model came from the host over PCIe even while another
// instance of the same function held one on a GPU joined by NVLink: each instance (pool.InstanceKey) is placed on
// its own and saw its own copies only. With SiblingSources, an instance of a function that never writes its model
// after initialisation (com.openfaas.gpu.model: shared, what the executors need to read a sibling's copy) swaps in
// over NVLink from its sibling's copy, which stays pinned until that swap is done; other functions still come from
// the host.
func TestSiblingCopyIsAnNVLinkSource(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model, swap, from string
	}{{pool.ModelShared, SwapNVLink, "f@1"}, {"", SwapPCIe, ""}} {
		c, err := New(Config{Node: node, MaxInFlight: 1, SiblingSources: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"f@1", "f@2"} {
			if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 1 << 30,
				SLO: 10 * time.Second, Model: tc.model}, ExecSeed: 10 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Submit(t0, 1, "f@1"); err != nil {
			t.Fatal(err)
		}
		first := c.Dispatch(t0)
		if len(first) != 1 || first[0].Swap != SwapPCIe {
			t.Fatalf("model %q: the first instance's decision %+v, want one from host", tc.model, first)
		}
		if err := c.SwapDone(t0.Add(time.Second), 1, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := c.Submit(t0.Add(time.Second), 2, "f@2"); err != nil { // f@1 is still bound
			t.Fatal(err)
		}
		second := c.Dispatch(t0.Add(time.Second))
		if len(second) != 1 || second[0].Swap != tc.swap || second[0].SourceFunction != tc.from ||
			tc.from != "" && second[0].Source != first[0].GPU {
			t.Fatalf("model %q: the second instance's decision %+v, want %s from %q on gpu %d", tc.model, second,
				tc.swap, tc.from, first[0].GPU)
		}
		if tc.from != "" {
			if p := c.gpus[first[0].GPU].resident["f@1"].pinned; p != 1 {
				t.Errorf("the sibling's copy is pinned %d times during the swap, want 1", p)
			}
			if err := c.SwapDone(t0.Add(2*time.Second), 2, time.Second); err != nil {
				t.Fatal(err)
			}
			if p := c.gpus[first[0].GPU].resident["f@1"].pinned; p != 0 {
				t.Errorf("the sibling's copy is pinned %d times after the swap, want 0", p)
			}
		}
		for _, id := range []uint64{1, 2} {
			if _, err := c.Complete(t0.Add(3*time.Second), id, 10*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if st := c.Status(); len(st.Functions) != 1 || st.Functions[0].Name != "f" || st.Functions[0].Instances != 2 {
			t.Errorf("status functions %+v, want f with 2 instances", st.Functions)
		}
	}
}
