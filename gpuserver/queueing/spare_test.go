package queueing

import (
	"slices"
	"testing"
)

// TestSpareLast: with SpareLast, a request of a function that can spare a miss (rich: 1000 of 1000 on time) goes
// after one of a function that cannot (poor: 10 of 10 on time, one miss would put it below 98%), although the rich
// one has less slack; without SpareLast least slack goes first. While the node is pressed (SetPressed), the rich
// functions are ordered most needy first, so the richest (most misses to spare) goes last whatever its slack.
func TestSpareLast(t *testing.T) {
	build := func(spareLast bool) *Queue {
		q, err := New(Config{Order: OrderSLOAware, SpareLast: spareLast})
		if err != nil {
			t.Fatal(err)
		}
		for f, served := range map[string]int{"poor": 10, "rich": 100, "richest": 1000} {
			if err := q.SetFunction(f, ms(100), 98); err != nil {
				t.Fatal(err)
			}
			for range served {
				q.Observe(f, true, ms(20))
			}
		}
		q.Regroup(t0)
		// Deadlines: richest first (least slack), then rich, then poor.
		for i, f := range []string{"richest", "rich", "poor"} {
			if err := q.Push(Request{ID: uint64(i + 1), Function: f, Arrival: t0.Add(ms(10 * i)), Cost: ms(10)}); err != nil {
				t.Fatal(err)
			}
		}
		return q
	}
	for _, tc := range []struct {
		name      string
		spareLast bool
		pressed   bool
		want      []uint64
	}{
		{"least slack", false, false, []uint64{1, 2, 3}},
		{"spare last", true, false, []uint64{3, 1, 2}},
		{"spare last, pressed", true, true, []uint64{3, 2, 1}},
		{"pressed without spare last", false, true, []uint64{1, 2, 3}},
	} {
		q := build(tc.spareLast)
		q.SetPressed(tc.pressed)
		if got := popIDs(q, t0.Add(ms(1))); !slices.Equal(got, tc.want) {
			t.Errorf("%s: popped %v, want %v", tc.name, got, tc.want)
		}
	}
	// A request that can no longer make its deadline (the richest's, at 95 ms) still goes after every one that
	// can, spare or not.
	q := build(true)
	if got := popIDs(q, t0.Add(ms(95))); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Errorf("late: popped %v, want [3 2 1]", got)
	}
}
