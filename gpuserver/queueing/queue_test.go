package queueing

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func newQ(t testing.TB, o Order, fns ...string) *Queue {
	t.Helper()
	q, err := New(Config{Order: o})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fns {
		if err := q.SetFunction(f, ms(100), 98); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

func popIDs(q *Queue, now time.Time) []uint64 {
	var ids []uint64
	for {
		r, ok := q.Pop(now, nil)
		if !ok {
			return ids
		}
		ids = append(ids, r.ID)
	}
}

func push(t testing.TB, q *Queue, id uint64, fn string, arrival time.Duration, cost time.Duration) {
	t.Helper()
	if err := q.Push(Request{ID: id, Function: fn, Arrival: t0.Add(arrival), Cost: cost}); err != nil {
		t.Fatal(err)
	}
}

func TestFIFO(t *testing.T) {
	q := newQ(t, OrderFIFO, "a", "b")
	push(t, q, 1, "a", ms(0), ms(90))
	push(t, q, 2, "b", ms(1), ms(1))
	push(t, q, 3, "a", ms(2), ms(1))
	if got := fmt.Sprint(popIDs(q, t0.Add(ms(5)))); got != "[1 2 3]" {
		t.Fatalf("order = %s", got)
	}
}

func TestDQLSLeastSlackFirst(t *testing.T) {
	q := newQ(t, OrderDQLS, "a", "b")
	// a: deadline 100, cost 50 -> key 100-70 = 30; b: arrives later (10), cost 10 -> key 110-14 = 96.
	push(t, q, 1, "b", ms(10), ms(10))
	push(t, q, 2, "a", ms(0), ms(50))
	// a second b with a big cost: deadline 115 - 1.4*80 = 3: most urgent.
	push(t, q, 3, "b", ms(15), ms(80))
	if got := fmt.Sprint(popIDs(q, t0.Add(ms(20)))); got != "[3 2 1]" {
		t.Fatalf("order = %s", got)
	}
}

func TestRRCAndStats(t *testing.T) {
	q := newQ(t, OrderSLOAware, "a")
	for i := range 100 {
		q.Observe("a", i >= 5, ms(50)) // 95 of 100 on time
	}
	s, _ := q.Stats("a")
	// RRC = (0.98*100 - 95)/(1-0.98) = 3/0.02 = 150
	if math.Abs(s.RRC-150) > 1e-6 || s.Served != 100 || s.OnTime != 95 || s.MeanLat != ms(50) {
		t.Fatalf("stats = %+v", s)
	}
}

func TestRegroupAndAlpha(t *testing.T) {
	q := newQ(t, OrderTorpor, "ok", "cheap", "dear")
	for range 10 {
		q.Observe("ok", true, ms(10))
	}
	// cheap: 10 served, 8 on time, mean 10 ms: RRC = (9.8-8)/0.02 = 90, cost 0.9
	// dear: 10 served, 5 on time, mean 100 ms: RRC = 240, cost 24
	for i := range 10 {
		q.Observe("cheap", i < 8, ms(10))
		q.Observe("dear", i < 5, ms(100))
	}
	q.alpha = 0.5
	q.Regroup(t0)
	for name, want := range map[string]bool{"ok": true, "cheap": true, "dear": false} {
		if s, _ := q.Stats(name); s.High != want {
			t.Errorf("%s high = %v, want %v", name, s.High, want)
		}
	}
	// Within the high group the neediest first; the low group after it.
	push(t, q, 1, "dear", 0, ms(1))
	push(t, q, 2, "ok", ms(1), ms(1))
	push(t, q, 3, "cheap", ms(2), ms(1))
	if got := fmt.Sprint(popIDs(q, t0.Add(ms(1)))); got != "[3 2 1]" {
		t.Fatalf("order = %s", got)
	}
	// alpha re-tuning: after AlphaWindow regroupings with a falling SLO ratio, alpha halves.
	q.alpha, q.oldRatio, q.hasOld, q.groupRuns = 1, 0.9, true, 0
	for range DefaultAlphaWindow {
		q.Regroup(t0) // ratio = 1/3 < 0.9
	}
	if q.Alpha() != 0.5 {
		t.Fatalf("alpha = %v, want 0.5", q.Alpha())
	}
}

// TestAlphaUnderTotalOverload pins the trend from a previous share of 0: while no function meets its SLO, alpha
// grows by 1% per window (flat) instead of doubling back to 1 (which would lock the order into neediest-first
// exactly under overload); a rise from 0 doubles it; the first measurement only sets the reference.
func TestAlphaUnderTotalOverload(t *testing.T) {
	q := newQ(t, OrderTorpor, "a", "b")
	for range 10 {
		q.Observe("a", false, ms(200))
		q.Observe("b", false, ms(300))
	}
	window := func() {
		for range DefaultAlphaWindow {
			q.Regroup(t0)
		}
	}
	window() // first measurement: share 0 becomes the reference, alpha grows 1% (capped at 1)
	if q.Alpha() != 1 || !q.hasOld || q.oldRatio != 0 {
		t.Fatalf("first window: alpha %v, reference %v (%v)", q.Alpha(), q.oldRatio, q.hasOld)
	}
	q.alpha = 0.25
	window() // share still 0: flat
	if math.Abs(q.Alpha()-0.25*1.01) > 1e-12 {
		t.Fatalf("share 0 after 0: alpha = %v, want %v", q.Alpha(), 0.25*1.01)
	}
	for range 1000 {
		q.Observe("a", true, ms(10)) // a now meets its SLO (1000 of 1010): share 1/2
	}
	window()
	if math.Abs(q.Alpha()-0.25*1.01*2) > 1e-12 || q.oldRatio != 0.5 {
		t.Fatalf("share 1/2 after 0: alpha = %v, want %v; reference %v", q.Alpha(), 0.25*1.01*2, q.oldRatio)
	}
}

func TestSLOAwareLateRequestsLast(t *testing.T) {
	q := newQ(t, OrderSLOAware, "a", "b")
	if err := q.SetFunction("none", 0, 0); err != nil {
		t.Fatal(err)
	}
	push(t, q, 1, "a", 0, ms(10))       // key 100-14 = 86: late at now=90
	push(t, q, 2, "b", ms(50), ms(30))  // key 150-42 = 108: feasible
	push(t, q, 3, "none", 0, ms(1))     // no deadline: last
	push(t, q, 4, "b", ms(60), ms(100)) // key 160-140 = 20: late
	if got := fmt.Sprint(popIDs(q, t0.Add(ms(90)))); got != "[2 1 4 3]" {
		t.Fatalf("order = %s", got)
	}
}

func TestEligibleRemoveAndErrors(t *testing.T) {
	q := newQ(t, OrderFIFO, "a", "b")
	push(t, q, 1, "a", 0, 0)
	push(t, q, 2, "b", ms(1), 0)
	push(t, q, 3, "a", ms(2), 0)
	r, ok := q.Pop(t0, func(f string) bool { return f == "b" })
	if !ok || r.ID != 2 {
		t.Fatalf("eligible pop = %v %v", r, ok)
	}
	if _, ok := q.Pop(t0, func(string) bool { return false }); ok {
		t.Fatal("pop with nothing eligible returned a request")
	}
	if !q.Remove(1) || q.Remove(1) || q.Len() != 1 || q.Waiting("a") != 1 {
		t.Fatalf("remove: len %d", q.Len())
	}
	if p, ok := q.Peek(t0, nil); !ok || p.ID != 3 || q.Len() != 1 {
		t.Fatalf("peek = %v", p)
	}
	if err := q.Push(Request{ID: 3, Function: "a"}); !errors.Is(err, ErrDuplicate) {
		t.Errorf("duplicate push err = %v", err)
	}
	if err := q.Push(Request{ID: 9, Function: "zz"}); !errors.Is(err, ErrUnknownFunction) {
		t.Errorf("unknown push err = %v", err)
	}
	if got := q.RemoveFunction("a"); len(got) != 1 || got[0].ID != 3 || q.Len() != 0 {
		t.Errorf("RemoveFunction = %v", got)
	}
	if _, err := New(Config{Order: "lifo"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad order err = %v", err)
	}
	if err := q.SetFunction("x", 0, 100); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad percentile err = %v", err)
	}
}

// TestEveryRequestOnce pushes, removes and pops at random: every pushed request comes out exactly once.
func TestEveryRequestOnce(t *testing.T) {
	for _, o := range []Order{OrderFIFO, OrderDQLS, OrderTorpor, OrderSLOAware} {
		q := newQ(t, o)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 20 {
			_ = q.SetFunction(fmt.Sprint("f", i), ms(50+i*10), 98)
		}
		seen := map[uint64]int{}
		var id uint64
		now := t0
		for range 5000 {
			now = now.Add(time.Duration(rng.IntN(5)) * time.Millisecond)
			switch rng.IntN(4) {
			case 0, 1:
				id++
				fn := fmt.Sprint("f", rng.IntN(20))
				if err := q.Push(Request{ID: id, Function: fn, Arrival: now, Cost: ms(rng.IntN(100))}); err != nil {
					t.Fatal(err)
				}
			case 2:
				if r, ok := q.Pop(now, nil); ok {
					seen[r.ID]++
					q.Observe(r.Function, rng.IntN(10) > 0, ms(20))
				}
			case 3:
				if victim := uint64(rng.IntN(int(id) + 1)); q.Remove(victim) {
					seen[victim]++
				}
			}
		}
		for {
			r, ok := q.Pop(now, nil)
			if !ok {
				break
			}
			seen[r.ID]++
		}
		for i := uint64(1); i <= id; i++ {
			if seen[i] != 1 {
				t.Fatalf("%s: request %d came out %d times", o, i, seen[i])
			}
		}
	}
}

// BenchmarkPushPop measures one push plus one pop with about 3000 requests of 1000 functions waiting.
func BenchmarkPushPop(b *testing.B) {
	for _, o := range []Order{OrderFIFO, OrderDQLS, OrderTorpor, OrderSLOAware} {
		b.Run(string(o), func(b *testing.B) {
			q := newQ(b, o)
			rng := rand.New(rand.NewPCG(3, 4))
			const fns = 1000
			for i := range fns {
				_ = q.SetFunction(fmt.Sprint("f", i), ms(80), 98)
				for range 5 {
					q.Observe(fmt.Sprint("f", i), rng.IntN(20) > 0, ms(30))
				}
			}
			var id uint64
			now := t0
			for range 3000 {
				id++
				_ = q.Push(Request{ID: id, Function: fmt.Sprint("f", rng.IntN(fns)), Arrival: now, Cost: ms(20)})
			}
			names := make([]string, fns)
			for i := range names {
				names[i] = fmt.Sprint("f", i)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				now = now.Add(time.Millisecond)
				id++
				_ = q.Push(Request{ID: id, Function: names[i%fns], Arrival: now, Cost: ms(20)})
				if _, ok := q.Pop(now, nil); !ok {
					b.Fatal("empty")
				}
			}
		})
	}
}

// TestSLOAwareRescueShare: a request whose margined cost exceeds its SLO (150 ms cost, 200 ms SLO, slack
// 200-210 = -10) is late at once by default, but with RescueShare on a healthy node it competes (least slack
// first) until deadline - cost = 50 ms has passed; once fewer functions than RescueShare meet their SLO (here 1
// of 2 < 0.8 at the regrouping) the margined slack demotes it again.
func TestSLOAwareRescueShare(t *testing.T) {
	for _, tc := range []struct {
		share    float64
		now      int
		overload bool
		want     string
	}{
		{0, 1, false, "[2 1]"},    // default: 1 is late at once, 2 (slack 1000-14 = 986) first
		{0.8, 1, false, "[1 2]"},  // 1 can still make it (due 50): slack -10 < 986
		{0.8, 49, false, "[1 2]"}, // still before its due time
		{0.8, 51, false, "[2 1]"}, // 150 ms of cost no longer fits before 200: late
		{0, 51, false, "[2 1]"},   // default: late as well
		{0.8, 1, true, "[2 1]"},   // overloaded node: the margined slack decides
		{0.5, 1, true, "[1 2]"},   // 1 of 2 meets its SLO: still at least half
	} {
		q, err := New(Config{Order: OrderSLOAware, RescueShare: tc.share})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			name string
			slo  time.Duration
		}{{"heavy", ms(200)}, {"light", time.Second}, {"x", ms(100)}, {"y", ms(100)}} {
			if err := q.SetFunction(f.name, f.slo, 98); err != nil {
				t.Fatal(err)
			}
		}
		if tc.overload {
			q.Observe("x", true, ms(10))
			q.Observe("y", false, ms(500))
		}
		q.Regroup(t0)
		push(t, q, 1, "heavy", 0, ms(150))
		push(t, q, 2, "light", 0, ms(10))
		if got := fmt.Sprint(popIDs(q, t0.Add(ms(tc.now)))); got != tc.want {
			t.Errorf("share %v at %d ms overload %v: order = %s, want %s", tc.share, tc.now, tc.overload, got,
				tc.want)
		}
	}
	if _, err := New(Config{RescueShare: 1.5}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("rescue share 1.5: %v", err)
	}
}

// TestDemotedGoLastAndExpire: a demoted function's requests go after every other function's, even those that are
// late; Expire takes out its requests that can no longer meet their deadline, oldest first; Cost follows pushes,
// pops and expiries.
func TestDemotedGoLastAndExpire(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	q, err := New(Config{Order: OrderSLOAware})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a", "h"} {
		if err := q.SetFunction(f, 100*time.Millisecond, 98); err != nil {
			t.Fatal(err)
		}
	}
	push := func(id uint64, f string, at time.Time) {
		t.Helper()
		if err := q.Push(Request{ID: id, Function: f, Arrival: at, Cost: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	push(1, "h", t0)
	push(2, "h", t0.Add(50*time.Millisecond))
	push(3, "a", t0)
	if q.Cost() != 60*time.Millisecond {
		t.Fatalf("cost %v", q.Cost())
	}
	q.SetDemoted("h", true)
	now := t0.Add(90 * time.Millisecond) // 3 is late (due at 80 ms), 1 too, 2 is not
	if r, _ := q.Peek(now, nil); r.ID != 3 {
		t.Fatalf("first %d, want the admitted late request 3", r.ID)
	}
	got := q.Expire(now, "h")
	if len(got) != 1 || got[0].ID != 1 || q.Len() != 2 || q.Cost() != 40*time.Millisecond {
		t.Fatalf("expired %+v, len %d, cost %v", got, q.Len(), q.Cost())
	}
	if r, _ := q.Pop(now, nil); r.ID != 3 {
		t.Fatalf("popped %d, want 3", r.ID)
	}
	q.SetDemoted("h", false)
	if got := q.Expire(now.Add(time.Second), "h"); len(got) != 1 || got[0].ID != 2 || q.Len() != 0 || q.Cost() != 0 {
		t.Fatalf("expired %+v, len %d, cost %v", got, q.Len(), q.Cost())
	}
}

// TestFixedAlpha: Config.Alpha fixes alpha (Torpor's node simulator runs 0.01): no window of falling or rising
// shares re-tunes it, and the grouping admits only that share of the expected cost to the high group.
func TestFixedAlpha(t *testing.T) {
	q, err := New(Config{Order: OrderTorpor, Alpha: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cheap", "dear"} {
		if err := q.SetFunction(f, ms(100), 98); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		q.Observe("cheap", i < 8, ms(10))
		q.Observe("dear", i < 5, ms(100))
	}
	for range 3 * DefaultAlphaWindow {
		q.Regroup(t0)
	}
	if q.Alpha() != 0.01 {
		t.Fatalf("alpha = %v, want fixed 0.01", q.Alpha())
	}
	// cheap's cost (0.9) is over 1% of the total (24.9): no function stays in the high group.
	for _, f := range []string{"cheap", "dear"} {
		if s, _ := q.Stats(f); s.High {
			t.Errorf("%s in the high group at alpha 0.01", f)
		}
	}
	for _, bad := range []float64{-0.1, 1.5, math.NaN()} {
		if _, err := New(Config{Order: OrderTorpor, Alpha: bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("alpha %v: err = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestExpireAll drops, across functions, exactly the waiting requests whose deadline minus cost has passed.
func TestExpireAll(t *testing.T) {
	for _, o := range []Order{OrderFIFO, OrderDQLS, OrderTorpor, OrderSLOAware} {
		q := newQ(t, o, "a", "b")
		push(t, q, 1, "a", 0, ms(30))      // due at 70 ms
		push(t, q, 2, "b", ms(10), ms(95)) // due at 15 ms
		push(t, q, 3, "b", ms(20), ms(10)) // due at 110 ms
		push(t, q, 4, "a", ms(5), ms(90))  // due at 15 ms
		got := q.ExpireAll(t0.Add(ms(20)), nil)
		ids := map[uint64]bool{}
		for _, r := range got {
			ids[r.ID] = true
		}
		if len(got) != 2 || !ids[2] || !ids[4] {
			t.Fatalf("%s: expired %v, want requests 2 and 4", o, got)
		}
		if q.Len() != 2 || q.Cost() != ms(40) {
			t.Fatalf("%s: left %d requests of cost %v, want 2 of 40ms", o, q.Len(), q.Cost())
		}
		if got := q.ExpireAll(t0.Add(ms(20)), nil); len(got) != 0 {
			t.Fatalf("%s: expired again %v", o, got)
		}
		// Costs now: a's model is resident (1 ms), b's is not (95 ms): request 3 (due at 110 - 95 = 15 ms) goes,
		// request 1 (pushed at a cost of 30 ms, due at 99 ms now) stays until then.
		now := func(f string) time.Duration { return map[string]time.Duration{"a": ms(1), "b": ms(95)}[f] }
		if got := q.ExpireAll(t0.Add(ms(80)), now); len(got) != 1 || got[0].ID != 3 {
			t.Fatalf("%s: with costs now, expired %v at 80 ms, want request 3", o, got)
		}
		if got := q.ExpireAll(t0.Add(ms(100)), now); len(got) != 1 || got[0].ID != 1 || q.Len() != 0 {
			t.Fatalf("%s: with costs now, expired %v at 100 ms, want request 1", o, got)
		}
	}
}
