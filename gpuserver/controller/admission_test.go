package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func TestParseAdmission(t *testing.T) {
	for in, want := range map[string]Admission{"": AdmissionNone, "none": AdmissionNone, "deadline": AdmissionDeadline} {
		if got, err := ParseAdmission(in); err != nil || got != want {
			t.Errorf("ParseAdmission(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseAdmission("drop"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("ParseAdmission(drop): %v, want ErrInvalidConfig", err)
	}
	if _, err := New(Config{Node: smallNode(t), Admission: "drop"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New with admission drop: %v, want ErrInvalidConfig", err)
	}
}

// TestAdmissionDeadline runs the admission rule under every policy that shares a GPU: on one GPU a function of
// 30 ms and a 100 ms deadline gets three requests at once (one bound, two queued: the third finishes at 90 ms);
// a fourth, predicted at 120 ms, is refused with a Retry-After of 20 ms, and a retry then is admitted (and would
// finish at 100 ms). Without the rule the fourth is queued. When the bound request then ends late (at 80 ms), the
// two queued behind it can no longer make their deadline: the rule drops them from the queue (TakeRefused); the
// retry, which still can, is bound.
func TestAdmissionDeadline(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, p := range []Policy{PolicyTorpor, PolicyFIFO, PolicyGShareDQLS, PolicyFaaSGPU, PolicyStatic,
		PolicyStaticDeadline, PolicyNative} {
		for _, adm := range []Admission{AdmissionNone, AdmissionDeadline} {
			c, err := New(Config{Policy: p, Node: smallNode(t), Prewarm: true, Admission: adm, ContextBytes: 20 << 20,
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
					t.Fatalf("%s/%s: request %d: %v", p, adm, id, err)
				}
			}
			if ds := c.Dispatch(t0); len(ds) != 1 || ds[0].Request != 1 || ds[0].Swap != SwapNone {
				t.Fatalf("%s/%s: dispatch %+v, want request 1 bound without a swap", p, adm, ds)
			}
			err = c.Submit(t0, 4, "f")
			if adm == AdmissionNone {
				if err != nil {
					t.Fatalf("%s without the rule: request 4: %v", p, err)
				}
				continue
			}
			var oe *pool.OverloadedError
			if !errors.As(err, &oe) || !errors.Is(err, pool.ErrOverloaded) || oe.RetryAfter != ms(20) {
				t.Fatalf("%s: request 4 predicted at 120 ms: %v, want refused with Retry-After 20ms", p, err)
			}
			if err := c.Submit(t0.Add(ms(19)), 5, "f"); !errors.Is(err, pool.ErrOverloaded) {
				t.Fatalf("%s: a retry before Retry-After: %v, want refused", p, err)
			}
			if err := c.Submit(t0.Add(oe.RetryAfter), 6, "f"); err != nil {
				t.Fatalf("%s: the retry at Retry-After: %v, want admitted", p, err)
			}
			if c.Counters().Refused != 2 {
				t.Fatalf("%s: refused %d, want 2", p, c.Counters().Refused)
			}
			// Request 1 ends late, at 80 ms (its GPU was slow to start it); its execution took the predicted 30 ms.
			if _, err := c.Complete(t0.Add(ms(80)), 1, ms(30)); err != nil {
				t.Fatal(err)
			}
			ds := c.Dispatch(t0.Add(ms(80)))
			var dropped []uint64
			for _, r := range c.TakeRefused() {
				if !errors.As(r.Err, &oe) || oe.RetryAfter <= 0 {
					t.Fatalf("%s: dropped %d with %v, want an *OverloadedError with a Retry-After", p, r.ID, r.Err)
				}
				dropped = append(dropped, r.ID)
			}
			if len(dropped) != 2 || dropped[0]+dropped[1] != 5 || len(ds) != 1 || ds[0].Request != 6 {
				t.Fatalf("%s: dropped %v and bound %+v, want 2 and 3 dropped, the retry 6 bound", p, dropped, ds)
			}
			if c.Waiting() != 0 || c.Counters().Refused != 4 {
				t.Fatalf("%s: %d waiting, %d refused; want 0 and 4", p, c.Waiting(), c.Counters().Refused)
			}
		}
	}
}

// TestAdmissionMaxInFlight: with one request in flight per function (Torpor's router), the work ahead of a
// request is its own function's queue even on a node of idle GPUs.
func TestAdmissionMaxInFlight(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Policy: PolicyTorpor, Node: node, Prewarm: true, Admission: AdmissionDeadline,
		MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: "f", MemoryBytes: 100 << 20,
		SLO: ms(100)}, ModelBytes: 100e6, ExecSeed: ms(30)}); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		if err := c.Submit(t0, id, "f"); err != nil {
			t.Fatalf("request %d: %v", id, err)
		}
	}
	if err := c.Submit(t0, 4, "f"); !errors.Is(err, pool.ErrOverloaded) {
		t.Fatalf("request 4 behind 3 of its own, one at a time: %v, want refused", err)
	}
}

// TestAdmissionKeepsRequestsCostlierThanTheirDeadline: a request whose predicted cost alone exceeds its deadline
// (a cold swap of a large model under a short deadline: 90 ms of PCIe and 10 ms of execution against 80 ms) is
// neither refused at Submit nor dropped from the queue: no retry could do better, so it is served late. (The
// gpuserver dropped such a function's first request at its first Dispatch.)
func TestAdmissionKeepsRequestsCostlierThanTheirDeadline(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Policy: PolicyFaaSGPU, Node: node, Admission: AdmissionDeadline})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: "big", MemoryBytes: 1 << 30,
		SLO: ms(80)}, ExecSeed: ms(10)}); err != nil {
		t.Fatal(err)
	}
	if cost := c.predictCost(c.fns["big"]); cost <= ms(80) {
		t.Fatalf("predicted cold cost %v: the test needs one above the 80 ms deadline", cost)
	}
	if err := c.Submit(t0, 1, "big"); err != nil {
		t.Fatalf("submit: %v", err)
	}
	ds := c.Dispatch(t0.Add(ms(1)))
	if refused := c.TakeRefused(); len(refused) != 0 || len(ds) != 1 || ds[0].Request != 1 {
		t.Fatalf("dispatch: bound %+v, refused %+v; want request 1 bound", ds, refused)
	}
}

// TestAdmissionNeverRefusesAnInitialisation: a function's initialisation (its calls outside any request) was
// submitted as a request, so the deadline rule refused it when the work ahead made it late ("predicted to finish in
// 251ms, after its deadline of 250ms"), and the function's process, refused its model's upload, never started. An
// initialisation is neither refused at Submit nor dropped from the queue; a request in its place still is.
func TestAdmissionNeverRefusesAnInitialisation(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	c, err := New(Config{Policy: PolicyFaaSGPU, Node: smallNode(t), Prewarm: true, Admission: AdmissionDeadline,
		ContextBytes: 20 << 20, Overload: Overload{Mode: OverloadOff}})
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
	if ds := c.Dispatch(t0); len(ds) != 1 {
		t.Fatalf("dispatch %+v, want one bound", ds)
	}
	if err := c.Submit(t0, 4, "f"); !errors.Is(err, pool.ErrOverloaded) {
		t.Fatalf("a request predicted at 120 ms: %v, want refused", err)
	}
	if err := c.SubmitInitialisation(t0, 5, "f"); err != nil {
		t.Fatalf("an initialisation predicted at 120 ms: %v, want queued", err)
	}
	// The bound request ends late: the queued requests can no longer make their deadline and are dropped; the
	// initialisation stays queued and is bound in its turn.
	if _, err := c.Complete(t0.Add(ms(80)), 1, ms(30)); err != nil {
		t.Fatal(err)
	}
	bound := map[uint64]bool{}
	for _, d := range c.Dispatch(t0.Add(ms(80))) {
		bound[d.Request] = true
	}
	for _, r := range c.TakeRefused() {
		if r.ID == 5 {
			t.Fatalf("the initialisation was dropped: %v", r.Err)
		}
	}
	if !bound[5] && c.Waiting() != 1 {
		t.Fatalf("the initialisation is neither bound nor waiting (bound %v, %d waiting)", bound, c.Waiting())
	}
}
