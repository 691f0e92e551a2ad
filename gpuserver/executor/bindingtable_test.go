package executor_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

type orphan bool

func (o orphan) Orphaned() bool { return bool(o) }

// TestBindingTable: a request's binding is its function's current GPU until it is taken or expired; an implicit
// one never is; an orphaned one is skipped; an expired one stays held (Take returns it, Expired set).
func TestBindingTable(t *testing.T) {
	tb := executor.NewBindingTable[orphan]()
	if _, ok := tb.CurrentGPU("f"); ok {
		t.Fatal("an empty table reports a GPU")
	}
	tb.Add("implicit", "f", 1, false, false)
	if _, ok := tb.CurrentGPU("f"); ok || tb.Requests("f") != 0 {
		t.Fatal("an implicit binding is reported")
	}
	tb.Add("dead", "f", 2, true, true)
	if _, ok := tb.CurrentGPU("f"); ok || tb.Requests("f") != 1 {
		t.Fatal("an orphaned binding is reported")
	}
	tb.Add("r", "f", 3, true, false)
	if gpu, ok := tb.CurrentGPU("f"); !ok || gpu != 3 || tb.Requests("f") != 2 {
		t.Fatalf("current gpu %d %v, %d requests", gpu, ok, tb.Requests("f"))
	}
	if e, ok := tb.Expire("r"); !ok || e.Expired || e.GPU != 3 {
		t.Fatalf("expire: %+v %v", e, ok)
	}
	if _, ok := tb.CurrentGPU("f"); ok || tb.Requests("f") != 1 {
		t.Fatal("an expired binding is reported")
	}
	if e, ok := tb.Expire("r"); !ok || !e.Expired {
		t.Fatalf("expire again: %+v %v", e, ok)
	}
	if e, ok := tb.Take("r"); !ok || !e.Expired || !e.Request || e.Function != "f" {
		t.Fatalf("take an expired binding: %+v %v", e, ok)
	}
	if _, ok := tb.Take("r"); ok {
		t.Fatal("a binding taken twice")
	}
	if _, ok := tb.Expire("r"); ok {
		t.Fatal("a released binding expired")
	}
	if e, ok := tb.Take("implicit"); !ok || e.Request || e.GPU != 1 {
		t.Fatalf("take an implicit binding: %+v %v", e, ok)
	}
	// A table of interfaces may hold none (no data plane): such a binding is reported.
	ti := executor.NewBindingTable[executor.Held]()
	ti.Add("x", "g", 0, true, nil)
	if gpu, ok := ti.CurrentGPU("g"); !ok || gpu != 0 {
		t.Fatal("a binding without a data plane's hold is not reported")
	}
}
