package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

var coT0 = time.Unix(1_700_000_000, 0)

// coController is a one-GPU node (1 GiB) with sharing as given, and functions of 100 MiB each, resident.
func coController(t *testing.T, sharing Sharing, fns ...pool.FunctionSpec) *Controller {
	t.Helper()
	c, err := New(Config{Node: smallNode(t), Prewarm: true, Sharing: sharing, Overload: Overload{Mode: OverloadOff}})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fns {
		f.MemoryBytes = 100 << 20
		if err := c.Register(coT0, Function{FunctionSpec: f, ExecSeed: 10 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func coSubmit(t *testing.T, c *Controller, id uint64, f string) {
	t.Helper()
	if err := c.Submit(coT0, id, f); err != nil {
		t.Fatalf("submit %d of %s: %v", id, f, err)
	}
}

func bound(ds []Decision) map[uint64]Decision {
	out := map[uint64]Decision{}
	for _, d := range ds {
		out[d.Request] = d
	}
	return out
}

func shared(name string, request, limit float64) pool.FunctionSpec {
	return pool.FunctionSpec{Name: name, ComputeRequest: request, ComputeLimit: limit}
}

// Two functions at request 0.5 (limit 0.75) co-run on one GPU; the co-runner's execution time is predicted over its
// share (10 ms at 0.5: 20 ms) until it has run beside another.
func TestCoRunnersShareAGPU(t *testing.T) {
	c := coController(t, Sharing{On: true}, shared("a", 0.5, 0.75), shared("b", 0.5, 0.75))
	coSubmit(t, c, 1, "a")
	coSubmit(t, c, 2, "b")
	ds := bound(c.Dispatch(coT0))
	if len(ds) != 2 || ds[1].GPU != 0 || ds[2].GPU != 0 || ds[2].Swap != SwapNone {
		t.Fatalf("dispatch %+v, want both bound on gpu 0 without a swap", ds)
	}
	if ds[2].PredictedExec != 20*time.Millisecond {
		t.Errorf("co-runner predicted %v, want 10ms over its request 0.5 = 20ms", ds[2].PredictedExec)
	}
	if got := c.CoRunners()[0]; len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Errorf("CoRunners = %+v, want a then b on gpu 0", got)
	}
	if cr := c.Status().GPUs[0].CoRunners; len(cr) != 2 || cr[0] != (pool.CoRunner{Function: "a", Request: 0.5, Limit: 0.75}) ||
		cr[1].Function != "b" {
		t.Errorf("status co-runners = %+v, want a then b at 0.5/0.75", cr)
	}
	// the first binding ends first: the co-runner holds the GPU on its own, which stays busy for the exclusive path
	if _, err := c.Complete(coT0.Add(5*time.Millisecond), 1, 5*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); !st.GPUs[0].Busy {
		t.Fatal("gpu 0 idle while b still runs on it")
	}
	if _, err := c.Complete(coT0.Add(15*time.Millisecond), 2, 15*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(); st.GPUs[0].Busy {
		t.Fatal("gpu 0 busy after both bindings ended")
	}
	if got := c.coRunExec(c.fns["b"]); got != 15*time.Millisecond {
		t.Errorf("b's co-run prediction after one co-run of 15ms: %v", got)
	}
	if got := c.fns["b"].exec.Mean(); got != 10*time.Millisecond {
		t.Errorf("b's exclusive prediction moved to %v by a co-run", got)
	}
	if n := c.CoRunCounts().Bound; n != 1 {
		t.Errorf("CoRunCounts.Bound = %d, want 1", n)
	}
}

// A function that did not ask for a share (the default: exclusive) never shares: nothing joins it, and it waits
// for a GPU its shared neighbours hold until they all leave. Without Sharing nothing co-runs at all.
func TestExclusiveFunctionsNeverShare(t *testing.T) {
	c := coController(t, Sharing{On: true}, pool.FunctionSpec{Name: "x"}, shared("a", 0.3, 0.5))
	coSubmit(t, c, 1, "x")
	coSubmit(t, c, 2, "a")
	if ds := bound(c.Dispatch(coT0)); len(ds) != 1 || ds[1].GPU != 0 {
		t.Fatalf("dispatch %+v, want only the exclusive x bound", ds)
	}
	if _, err := c.Complete(coT0.Add(time.Millisecond), 1, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if ds := bound(c.Dispatch(coT0.Add(time.Millisecond))); len(ds) != 1 || ds[2].GPU != 0 {
		t.Fatalf("dispatch %+v, want a bound once x left", ds)
	}
	coSubmit(t, c, 3, "x")
	if ds := c.Dispatch(coT0.Add(time.Millisecond)); len(ds) != 0 {
		t.Fatalf("dispatch %+v: the exclusive x joined the shared a", ds)
	}

	off := coController(t, Sharing{}, shared("a", 0.5, 0.5), shared("b", 0.5, 0.5))
	coSubmit(t, off, 1, "a")
	coSubmit(t, off, 2, "b")
	if ds := off.Dispatch(coT0); len(ds) != 1 {
		t.Fatalf("sharing off: dispatch %+v, want one binding", ds)
	}
}

// Co-runners are refused at the caps: the requests of a GPU's bindings sum to at most 1 (0.4 + 0.4 + 0.4 does
// not fit), their limits to at most 1.5 (0.3/1 + 0.3/1 does not fit), or the caps set.
func TestCoRunnersRefusedAtTheCaps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sharing Sharing
		fns     []pool.FunctionSpec
		want    int // bound at once
	}{
		{"requests", Sharing{On: true}, []pool.FunctionSpec{shared("a", 0.4, 0.4), shared("b", 0.4, 0.4), shared("c", 0.4, 0.4)}, 2},
		{"limits", Sharing{On: true}, []pool.FunctionSpec{shared("a", 0.3, 1), shared("b", 0.3, 1)}, 1},
		{"limits fit", Sharing{On: true}, []pool.FunctionSpec{shared("a", 0.3, 0.75), shared("b", 0.3, 0.75)}, 2},
		{"requests set", Sharing{On: true, MaxRequests: 0.6, MaxLimits: 2}, []pool.FunctionSpec{shared("a", 0.3, 1), shared("b", 0.3, 1), shared("c", 0.3, 1)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := coController(t, tc.sharing, tc.fns...)
			for i, f := range tc.fns {
				coSubmit(t, c, uint64(i+1), f.Name)
			}
			if ds := c.Dispatch(coT0); len(ds) != tc.want {
				t.Fatalf("dispatch %+v, want %d bound", ds, tc.want)
			}
			if c.Waiting() != len(tc.fns)-tc.want || c.CoRunCounts().Refused == 0 && tc.want < len(tc.fns) {
				t.Fatalf("waiting %d, refused %d", c.Waiting(), c.CoRunCounts().Refused)
			}
		})
	}
	if _, err := New(Config{Node: smallNode(t), Sharing: Sharing{On: true, MaxRequests: 1.2}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("max requests 1.2: %v, want ErrInvalidConfig", err)
	}
}

// A co-runner's GPU failing breaks it like the first binding: its work is lost, never reported as served.
func TestCoRunnerOnAFailedGPUIsBroken(t *testing.T) {
	c := coController(t, Sharing{On: true}, shared("a", 0.5, 0.5), shared("b", 0.5, 0.5))
	coSubmit(t, c, 1, "a")
	coSubmit(t, c, 2, "b")
	if ds := c.Dispatch(coT0); len(ds) != 2 {
		t.Fatalf("dispatch %+v", ds)
	}
	if _, err := c.SetHealthy(coT0, 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Complete(coT0.Add(time.Millisecond), 2, time.Millisecond); !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.Fatalf("co-runner on the failed GPU completed with %v, want ErrGPUUnhealthy", err)
	}
}
