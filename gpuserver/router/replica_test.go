package router

import (
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestPickReplica: three replicas on three nodes. The one whose node holds the model on a GPU wins over an
// emptier node without it; among nodes without it the shortest queue per GPU wins; a node that sheds the
// function comes last; reports older than maxAge are ignored, and with none fresh the pick is round robin.
func TestPickReplica(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	reps := []Replica{{"10.0.0.1:8080", "a"}, {"10.0.1.1:8080", "b"}, {"10.0.2.1:8080", "c"}}
	st := func(queued int, resident, shed bool) pool.Status {
		s := pool.Status{Queued: queued, GPUs: []pool.GPUStatus{{Healthy: true}, {Healthy: true}}}
		f := pool.FunctionStatus{FunctionSpec: pool.FunctionSpec{Name: "resnet.fn"}, Shed: shed}
		if resident {
			f.Resident = []int{1}
		}
		s.Functions = append(s.Functions, f)
		return s
	}
	reports := map[string]NodeReport{
		"a": ReportOf(st(0, false, false), now),
		"b": ReportOf(st(6, true, false), now),
		"c": ReportOf(st(2, false, false), now),
	}
	if i, ok := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 1 || !ok {
		t.Fatalf("picked %d (%v), want 1: the model is resident on node b", i, ok)
	}
	reports["b"] = ReportOf(st(6, true, true), now) // b sheds it
	if i, _ := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 0 {
		t.Fatalf("picked %d, want 0: the shortest queue without the model", i)
	}
	reports["a"] = ReportOf(st(0, false, false), now.Add(-2*time.Second)) // stale
	if i, _ := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 2 {
		t.Fatalf("picked %d, want 2: a's report is stale, b sheds", i)
	}
	for k := range uint64(3) {
		if i, ok := PickReplica(now, "resnet.fn", reps, nil, time.Second, k); i != int(k) || ok {
			t.Fatalf("without reports pick %d = %d (%v), want round robin", k, i, ok)
		}
	}
	if i, _ := PickReplica(now, "resnet.fn", nil, reports, time.Second, 0); i != -1 {
		t.Fatalf("no replicas: %d", i)
	}
}
