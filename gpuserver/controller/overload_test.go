package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

func TestParseOverload(t *testing.T) {
	for in, want := range map[string]Overload{"": {Mode: OverloadAuto}, "auto": {Mode: OverloadAuto},
		"off": {Mode: OverloadOff}, "0.85": {Mode: OverloadTarget, Target: 0.85}, "1": {Mode: OverloadTarget, Target: 1}} {
		got, err := ParseOverload(in)
		if err != nil || got != want {
			t.Errorf("ParseOverload(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if back, err := ParseOverload(got.String()); err != nil || back != got {
			t.Errorf("round trip of %+v: %+v, %v", got, back, err)
		}
	}
	for _, bad := range []string{"on", "0", "-0.5", "1.5", "NaN", "target"} {
		if _, err := ParseOverload(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseOverload(%q): %v, want ErrInvalidConfig", bad, err)
		}
	}
	if _, err := New(Config{Node: smallNode(t), Overload: Overload{Mode: OverloadTarget, Target: 2}}); !errors.Is(err,
		ErrInvalidConfig) {
		t.Fatalf("target 2 accepted: %v", err)
	}
}

// overloadNode registers, on one GPU holding every model, light functions a and b (10 ms, SLO 1 s) and heavy h
// (50 ms, SLO 300 ms), and drives n intervals of 2 s in which a and b get 5 requests per second each and h 20:
// demand 0.1 + 1.0 = 1.1 GPUs, beyond the one GPU's 0.9 target. Requests are served one after the other on the
// GPU as the controller binds them. It returns the controller's refusals (at Submit and from the queue).
func overloadNode(t *testing.T, ov Overload, intervals int) (*Controller, int) {
	t.Helper()
	t0 := time.Unix(1_700_000_000, 0)
	c, err := New(Config{Node: smallNode(t), Prewarm: true, Overload: ov})
	if err != nil {
		t.Fatal(err)
	}
	exec := map[string]time.Duration{"a": 10 * time.Millisecond, "b": 10 * time.Millisecond, "h": 50 * time.Millisecond}
	for name, d := range exec {
		slo := time.Second
		if name == "h" {
			slo = 300 * time.Millisecond
		}
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 100 << 20,
			SLO: slo}, ModelBytes: 100e6, ExecSeed: d}); err != nil {
			t.Fatal(err)
		}
	}
	var id uint64
	refused := 0
	arrived := map[uint64]time.Time{}
	names := map[uint64]string{}
	settled := t0.Add(time.Duration(intervals) * time.Second) // the second half of the run
	type running struct {
		id  uint64
		end time.Time
		d   time.Duration
	}
	var run *running
	step := func(now time.Time) {
		if run != nil && !run.end.After(now) {
			onTime, err := c.Complete(run.end, run.id, run.d)
			if err != nil {
				t.Fatal(err)
			}
			if n := names[run.id]; n != "h" && !onTime && arrived[run.id].After(settled) {
				t.Errorf("%s: admitted %s late at %v", ov, n, run.end.Sub(t0))
			}
			run = nil
		}
		ds := c.Dispatch(now)
		for _, r := range c.TakeRefused() {
			var oe *pool.OverloadedError
			if !errors.As(r.Err, &oe) || oe.RetryAfter != DefaultShedEvery || oe.Episode == 0 {
				t.Fatalf("refusal %d: %v", r.ID, r.Err)
			}
			refused++
		}
		for _, d := range ds {
			run = &running{id: d.Request, end: now.Add(exec[d.Function]), d: exec[d.Function]}
		}
	}
	// 10 ms ticks: h arrives on 2 of every 10, a and b on one each of every 20.
	for k := range intervals * 200 {
		now := t0.Add(time.Duration(k) * 10 * time.Millisecond)
		var fns []string
		if k%10 == 0 || k%10 == 5 {
			fns = append(fns, "h")
		}
		switch k % 20 {
		case 1:
			fns = append(fns, "a")
		case 11:
			fns = append(fns, "b")
		}
		for _, name := range fns {
			id++
			arrived[id], names[id] = now, name
			if err := c.Submit(now, id, name); err != nil {
				if !errors.Is(err, pool.ErrOverloaded) || name != "h" {
					t.Fatalf("submit %s: %v", name, err)
				}
				refused++
			}
		}
		step(now)
		if run != nil && run.end.Before(now.Add(10*time.Millisecond)) {
			step(run.end)
		}
	}
	return c, refused
}

// TestOverloadShedsTheCostliest: once the demand has exceeded the target for long enough, the heavy function is
// shed (demoted, its requests refused only when they cannot make their deadline), the light ones are admitted and
// meet their SLO; off sheds nothing; an explicit target sheds too.
func TestOverloadShedsTheCostliest(t *testing.T) {
	for _, ov := range []Overload{{Mode: OverloadAuto}, {Mode: OverloadTarget, Target: 0.9}} {
		c, refused := overloadNode(t, ov, 40)
		st := c.Overload()
		if len(st.Shedding) != 1 || st.Shedding[0] != "h" || !c.Shed("h") || c.Shed("a") {
			t.Fatalf("%s: shedding %+v", ov, st)
		}
		if st.Demand < 0.9 || st.Capacity != 1 || refused == 0 || c.Counters().Shed != int64(refused) {
			t.Fatalf("%s: status %+v, refused %d, counters %+v", ov, st, refused, c.Counters())
		}
		if hs, _ := c.q.Stats("h"); hs.Served == 0 {
			t.Errorf("%s: the shed function got no capacity at all: %+v", ov, hs)
		}
		status := c.Status()
		for _, f := range status.Functions {
			if f.Shed != (f.Name == "h") || f.Name == "h" && f.Refused != int64(refused) {
				t.Errorf("%s: status of %s: shed %v refused %d", ov, f.Name, f.Shed, f.Refused)
			}
		}
		if status.Overload == nil || len(status.Overload.Shedding) != 1 || status.Overload.Refused != int64(refused) {
			t.Errorf("%s: pool status overload %+v", ov, status.Overload)
		}
	}
	c, refused := overloadNode(t, Overload{Mode: OverloadOff}, 40)
	if refused != 0 || c.Shed("h") || len(c.Overload().Shedding) != 0 || c.Overload().Setting != OverloadOff {
		t.Fatalf("off: refused %d, status %+v", refused, c.Overload())
	}
}

// TestOverloadBacksOff: automatic mode stops shedding when the admitted functions stay late while it sheds (their
// lateness is not the shed functions' GPU time) and waits 1, 2, 4 ... decisions before it tries again.
func TestOverloadBacksOff(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c, err := New(Config{Node: smallNode(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "h"} {
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 100 << 20,
			SLO: time.Second}}); err != nil {
			t.Fatal(err)
		}
	}
	now := t0
	c.maybeDecideShed(now)
	c.arrived(c.fns["a"])
	c.arrived(c.fns["h"])
	c.ov.shedding = []*fnState{c.fns["h"]}
	c.setShed(c.fns["h"], true)
	for range minAdmitted {
		c.observeShed(c.fns["a"], false, now)
	}
	now = now.Add(c.cfg.ShedEvery)
	c.maybeDecideShed(now)
	if c.ov.backoff != 1 || c.ov.holdUntil != c.ov.decisions+1 || c.Shed("h") {
		t.Fatalf("late admitted while shedding: backoff %d hold until %d (decision %d), shed h %v", c.ov.backoff,
			c.ov.holdUntil, c.ov.decisions, c.Shed("h"))
	}
	c.ov.shedding = []*fnState{c.fns["h"]}
	for range minAdmitted {
		c.observeShed(c.fns["a"], false, now)
	}
	c.maybeDecideShed(now.Add(2 * c.cfg.ShedEvery))
	if c.ov.backoff != 2 {
		t.Fatalf("second failure: backoff %d, want 2", c.ov.backoff)
	}
	c.ov.shedding = []*fnState{c.fns["h"]}
	for range minAdmitted {
		c.observeShed(c.fns["a"], true, now)
	}
	c.maybeDecideShed(now.Add(3 * c.cfg.ShedEvery))
	if c.ov.backoff != 0 {
		t.Fatalf("on time while shedding: backoff %d, want 0", c.ov.backoff)
	}
}
