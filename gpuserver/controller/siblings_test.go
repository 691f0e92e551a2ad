package controller

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestSiblingCopyIsNeverEvictedForASibling: placing an instance's copy evicted the least recently used copy on
// the GPU even when it was a sibling instance's (the same model), which only moved the model from one instance to
// the other (Azure hour 1, seed 3: 188,661 NVLink swaps an hour). Now another function's copy goes instead.
func TestSiblingCopyIsNeverEvictedForASibling(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	if node, err = node.WithGPUMemory(2 << 30); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Node: node, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f@1", "f@2", "g"} {
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 1 << 30,
			SLO: 10 * time.Second}, ExecSeed: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	now := t0
	var last Decision
	for i, name := range []string{"f@2", "g", "f@1"} { // f@2 is the least recently used when f@1 comes
		if err := c.Submit(now, uint64(i+1), name); err != nil {
			t.Fatal(err)
		}
		ds := c.Dispatch(now)
		if len(ds) != 1 {
			t.Fatalf("%s: decisions %+v", name, ds)
		}
		last = ds[0]
		now = now.Add(time.Second)
		if _, err := c.Complete(now, last.Request, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if len(last.Evict) != 1 || last.Evict[0].Function != "g" {
		t.Errorf("f@1 placed evicting %+v, want g (not its sibling f@2)", last.Evict)
	}
}
