package controller

import (
	"fmt"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestDeregisterWhileASiblingReadsTheCopy: an instance that ended (its last request done: the gpuserver forgets
// its copies) while a sibling instance's swap was reading its copy over NVLink left that copy resident under a
// name the controller no longer knew; once the swap was done, the next placement that weighed evicting it
// dereferenced a nil function (the simulator's autoscaler stopping instances of a `model: shared` function hit
// it). Deregister now drops every copy of the function, the one being read included (the reader's SwapDone finds
// no copy to unpin), and the GPU's memory with it.
func TestDeregisterWhileASiblingReadsTheCopy(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	if node, err = node.WithGPUMemory(3 << 30); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Node: node, MaxInFlight: 1, SiblingSources: true})
	if err != nil {
		t.Fatal(err)
	}
	reg := func(name, model string) {
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 1 << 30,
			SLO: 10 * time.Second, Model: model}, ExecSeed: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	reg("f@1", pool.ModelShared)
	reg("f@2", pool.ModelShared)
	at := t0
	run := func(id uint64, name string) Decision {
		t.Helper()
		if err := c.Submit(at, id, name); err != nil {
			t.Fatal(err)
		}
		ds := c.Dispatch(at)
		if len(ds) != 1 {
			t.Fatalf("request %d of %s: %d decisions, want 1", id, name, len(ds))
		}
		return ds[0]
	}
	first := run(1, "f@1")
	at = at.Add(time.Second)
	if err := c.SwapDone(at, 1, time.Second); err != nil {
		t.Fatal(err)
	}
	second := run(2, "f@2") // f@1 is still bound: f@2 goes to another GPU, copying f@1's over NVLink
	if second.Swap != SwapNVLink || second.SourceFunction != "f@1" || second.Source != first.GPU {
		t.Fatalf("f@2's decision %+v, want an NVLink copy of f@1's on gpu %d", second, first.GPU)
	}
	if _, err := c.Complete(at, 1, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Deregister("f@1"); err != nil { // f@1's process ended while f@2 reads its copy
		t.Fatal(err)
	}
	if st := c.Status(); st.GPUs[first.GPU].UsedBytes != 0 || len(st.GPUs[first.GPU].Resident) != 0 {
		t.Errorf("gpu %d after f@1 left: %d bytes used, resident %v; want nothing", first.GPU,
			st.GPUs[first.GPU].UsedBytes, st.GPUs[first.GPU].Resident)
	}
	at = at.Add(time.Second)
	if err := c.SwapDone(at, 2, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Complete(at, 2, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Fill every GPU (two copies of 1 GiB fit on each) with functions that must evict to fit: placement weighs
	// every copy on every GPU.
	for i := range 16 {
		name := fmt.Sprintf("g%d", i)
		reg(name, "")
		at = at.Add(time.Second)
		id := uint64(10 + i)
		run(id, name)
		at = at.Add(time.Second)
		if err := c.SwapDone(at, id, time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Complete(at, id, 10*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if ev := c.Counters().Evictions; ev == 0 {
		t.Errorf("no eviction: the placements never weighed the copies")
	}
}
