package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestRefusalsAreMissesOfFaaSGPU: under the faas-gpu policy the admission rule's refusals, at Submit and from
// the queue, are misses in the queue's SLO record (its order by the misses a function can spare needs them); the
// baselines' record counts only what they served, as their papers count. The scenario is TestAdmissionDeadline's:
// a fourth request refused at Submit, two queued requests dropped once they can no longer make their deadline.
func TestRefusalsAreMissesOfFaaSGPU(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for p, want := range map[Policy]int64{PolicyFaaSGPU: 3, PolicyTorpor: 0, PolicyGShareDQLS: 0} {
		c, err := New(Config{Policy: p, Node: smallNode(t), Prewarm: true, Admission: AdmissionDeadline,
			Overload: Overload{Mode: OverloadOff}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: "f", MemoryBytes: 100 << 20,
			SLO: ms(100)}, ModelBytes: 100e6, ExecSeed: ms(30)}); err != nil {
			t.Fatal(err)
		}
		for id := uint64(1); id <= 3; id++ {
			if err := c.Submit(t0, id, "f"); err != nil {
				t.Fatal(err)
			}
		}
		c.Dispatch(t0)
		if err := c.Submit(t0, 4, "f"); !errors.Is(err, pool.ErrOverloaded) {
			t.Fatalf("%s: request 4: %v, want refused", p, err)
		}
		if _, err := c.Complete(t0.Add(ms(80)), 1, ms(30)); err != nil {
			t.Fatal(err)
		}
		c.Dispatch(t0.Add(ms(80)))
		if n := len(c.TakeRefused()); n != 2 {
			t.Fatalf("%s: %d dropped, want 2", p, n)
		}
		if s, _ := c.q.Stats("f"); s.Missed != want || s.Served != 1 {
			t.Errorf("%s: the queue's record %+v, want %d missed and 1 served", p, s, want)
		}
	}
}

// TestInstancesKeepOneRecord: the instances of a function (pool.InstanceKey) keep one SLO record in the queue,
// the function's, and the pool's status counts it once: a request served by one instance is in the record of an
// instance registered after it.
func TestInstancesKeepOneRecord(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c, err := New(Config{Policy: PolicyFaaSGPU, Node: smallNode(t)})
	if err != nil {
		t.Fatal(err)
	}
	reg := func(name string) {
		t.Helper()
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 100 << 20,
			SLO: time.Second}, ModelBytes: 100e6}); err != nil {
			t.Fatal(err)
		}
	}
	reg(pool.InstanceKey("f", "1"))
	if err := c.Submit(t0, 1, pool.InstanceKey("f", "1")); err != nil {
		t.Fatal(err)
	}
	if ds := c.Dispatch(t0); len(ds) != 1 {
		t.Fatalf("dispatch %+v, want request 1 bound", ds)
	}
	if _, err := c.Complete(t0.Add(100*time.Millisecond), 1, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	reg(pool.InstanceKey("f", "2"))
	if s, _ := c.q.Stats(pool.InstanceKey("f", "2")); s.Served != 1 || s.OnTime != 1 {
		t.Errorf("the second instance's record %+v, want its function's 1 of 1", s)
	}
	st := c.Status()
	if len(st.Functions) != 1 || st.Functions[0].Served != 1 || st.Functions[0].Instances != 2 {
		t.Errorf("status %+v, want one function of 2 instances, 1 served", st.Functions)
	}
}
