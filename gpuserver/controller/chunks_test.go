package controller

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestCopiesPlannedInWholeChunks: the data plane holds a copy in whole chunks (2 MiB), so a quota of 101 MiB takes
// 102 MiB there; the controller planned copies by their quota to the byte, so on a GPU of 406 MiB of chunks it kept
// four copies resident (404 MiB) where the data plane holds three (408 MiB do not fit), and the data plane evicted
// on its own, by least recent use, what the controller thought resident (faas_gpu_evictions_total{by="pressure"}).
// With Config.ChunkBytes the controller plans each copy in whole chunks: three copies fit, and placing a fourth
// evicts one of them, the controller's choice.
func TestCopiesPlannedInWholeChunks(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	if node, err = node.WithGPUMemory(406 << 20); err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []uint64{0, 2 << 20} {
		c, err := New(Config{Node: node, MaxInFlight: 1, ChunkBytes: chunk})
		if err != nil {
			t.Fatal(err)
		}
		names := []string{"a", "b", "c", "d"}
		for _, name := range names {
			if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 101 << 20,
				SLO: 10 * time.Second}, ExecSeed: time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		now := t0
		var evicted []string
		for i, name := range names { // one at a time: each swaps in, runs and ends before the next
			if err := c.Submit(now, uint64(i+1), name); err != nil {
				t.Fatal(err)
			}
			ds := c.Dispatch(now)
			if len(ds) != 1 || ds[0].Swap != SwapPCIe {
				t.Fatalf("chunk %d: %s: decisions %+v, want one swap from host", chunk, name, ds)
			}
			for _, e := range ds[0].Evict {
				evicted = append(evicted, e.Function)
			}
			now = now.Add(time.Second)
			if _, err := c.Complete(now, ds[0].Request, time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		resident := c.Status().GPUs[0].Resident
		t.Logf("chunk %d: resident %v, evicted %v", chunk, resident, evicted)
		switch {
		case chunk == 0 && (len(resident) != 4 || len(evicted) != 0):
			t.Errorf("by quota: resident %v, evicted %v; want all four, none evicted", resident, evicted)
		case chunk > 0 && (len(resident) != 3 || len(evicted) != 1 || evicted[0] != "a"):
			t.Errorf("in whole chunks: resident %v, evicted %v; want three resident (408 MiB of chunks do not fit "+
				"in 406), the least recently used (a) evicted by the controller", resident, evicted)
		}
	}
}
