package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestOverloadShedsTheCostliest: one GPU holding every model (prewarmed); light functions a, b, c (seeded at
// about 12 ms of GPU time a request: 10 ms execution and a 2 ms swap) and heavy h (52 ms). In the first 2 s
// interval h gets 120 requests and each light one 10. At the decision the rates are 0.3 x 120 / 2 s = 18/s for h
// (0.94 GPU-s/s) and 1.5/s for the light ones (0.018 each): admitted cheapest first within 0.85 of the GPU, h is
// shed. A request of h is then refused with 429's error (pool.ErrOverloaded, Retry-After 2 s) while requests
// wait, served when the node idles with its model on a free GPU, and once its rate has fallen (0.7 x 18 + 0.3 x
// 2 / 2 s = 12.9/s, 0.67 GPU-s/s) h is admitted again. torpor sheds nothing.
func TestOverloadShedsTheCostliest(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, p := range []Policy{PolicyFaaSGPU, PolicyTorpor} {
		c, err := New(Config{Policy: p, Node: smallNode(t), Prewarm: true})
		if err != nil {
			t.Fatal(err)
		}
		for name, exec := range map[string]time.Duration{"a": 10, "b": 10, "c": 10, "h": 50} {
			if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: 100 << 20,
				SLO: time.Second}, ModelBytes: 100e6, ExecSeed: exec * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		var id uint64
		submit := func(at time.Time, name string) error {
			id++
			return c.Submit(at, id, name)
		}
		for i := range 120 {
			at := t0.Add(time.Duration(i) * 15 * time.Millisecond)
			if err := submit(at, "h"); err != nil {
				t.Fatal(err)
			}
			if i%12 == 0 {
				for _, name := range []string{"a", "b", "c"} {
					if err := submit(at, name); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		decide := t0.Add(2 * time.Second)
		err = submit(decide, "h")
		var oe *pool.OverloadedError
		if p == PolicyTorpor {
			if err != nil || c.Shed("h") || c.Overload().Decisions != 0 {
				t.Fatalf("torpor: submit %v, shed %v, %+v", err, c.Shed("h"), c.Overload())
			}
			continue
		}
		if !errors.Is(err, pool.ErrOverloaded) || !errors.As(err, &oe) || oe.RetryAfter != 2*time.Second ||
			oe.Function != "h" {
			t.Fatalf("h while requests wait: %v, want an OverloadedError retrying after 2s", err)
		}
		if !c.Shed("h") || c.Shed("a") || c.Overload().Shed != 1 || c.Counters().Shed != 1 {
			t.Fatalf("shed h %v a %v, status %+v, counters %+v", c.Shed("h"), c.Shed("a"), c.Overload(),
				c.Counters())
		}
		if err := submit(decide, "a"); err != nil {
			t.Fatalf("admitted a refused: %v", err)
		}
		for w := range id { // the node idles: nothing waits, the GPU is free
			c.Cancel(w + 1)
		}
		if err := submit(decide, "h"); err != nil {
			t.Fatalf("h on an idle node: %v", err)
		}
		if ds := c.Dispatch(decide); len(ds) != 1 || ds[0].Function != "h" {
			t.Fatalf("dispatch on the idle node: %+v", ds)
		}
		c.Dispatch(decide.Add(2 * time.Second)) // next interval: h's weighted rate has fallen
		if c.Shed("h") || c.Overload().Shed != 0 || c.Overload().Decisions != 2 {
			t.Fatalf("after load fell: shed h %v, %+v", c.Shed("h"), c.Overload())
		}
	}
}

// TestOverloadTargetFeedback: while a function is shed, an interval in which an admitted function was late lowers
// the target by 5% (to 0.8075 from 0.85, never below 0.5); 15 calm intervals in a row raise it by 1%; without
// shedding, lateness leaves it alone (it is not overload).
func TestOverloadTargetFeedback(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	c, err := New(Config{Policy: PolicyFaaSGPU, Node: smallNode(t)})
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
	interval := func(shed bool, lateA bool) {
		c.fns["h"].shed = shed
		if shed {
			c.ov.shed = 1
		} else {
			c.ov.shed = 0
		}
		if lateA {
			c.observeShed(c.fns["a"], false)
			c.observeShed(c.fns["a"], false) // once per function and interval
		}
		now = now.Add(c.cfg.ShedEvery)
		c.maybeDecideShed(now)
	}
	c.maybeDecideShed(now) // starts the first interval
	interval(true, true)
	if got := c.Overload().Target; got != 0.85*0.95 {
		t.Fatalf("late while shedding: target %v, want %v", got, 0.85*0.95)
	}
	for range 14 {
		interval(true, false)
	}
	if got := c.Overload().Target; got != 0.85*0.95 {
		t.Fatalf("14 calm intervals: target %v", got)
	}
	interval(true, false)
	if got := c.Overload().Target; got != 0.85*0.95*1.01 {
		t.Fatalf("15 calm intervals: target %v, want %v", got, 0.85*0.95*1.01)
	}
	before := c.Overload().Target
	interval(false, true)
	if got := c.Overload().Target; got != before {
		t.Fatalf("late without shedding: target %v, want %v", got, before)
	}
	for range 40 {
		interval(true, true)
	}
	if got := c.Overload().Target; got != minShedTarget {
		t.Fatalf("late for long: target %v, want the floor %v", got, minShedTarget)
	}
}
