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
	if i, why := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 1 || why != PickResident {
		t.Fatalf("picked %d (%s), want 1 (resident): the model is resident on node b", i, why)
	}
	reports["b"] = ReportOf(st(6, true, true), now) // b sheds it
	if i, why := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 0 || why != PickLeastQueued {
		t.Fatalf("picked %d (%s), want 0 (least_queued): the shortest queue without the model", i, why)
	}
	reports["a"] = ReportOf(st(0, false, false), now.Add(-2*time.Second)) // stale
	if i, why := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 2 || why != PickLeastQueued {
		t.Fatalf("picked %d (%s), want 2 (least_queued): a's report is stale, b sheds", i, why)
	}
	reports["c"] = ReportOf(st(1, false, true), now) // c sheds it too
	if i, why := PickReplica(now, "resnet.fn", reps, reports, time.Second, 0); i != 2 || why != PickShedding {
		t.Fatalf("picked %d (%s), want 2 (shedding): both fresh nodes shed, c's queue is shorter", i, why)
	}
	for k := range uint64(3) {
		if i, why := PickReplica(now, "resnet.fn", reps, nil, time.Second, k); i != int(k) || why != PickRoundRobin {
			t.Fatalf("without reports pick %d = %d (%s), want round robin", k, i, why)
		}
	}
	if i, _ := PickReplica(now, "resnet.fn", nil, reports, time.Second, 0); i != -1 {
		t.Fatalf("no replicas: %d", i)
	}
}
