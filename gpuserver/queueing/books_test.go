package queueing

import (
	"slices"
	"testing"
)

// TestFamilyKeepsOneRecord: the instances of one function (SetFamily) keep one SLO record, so an instance started
// later begins from its function's record: a new instance of a function with 100 requests on time can spare a
// miss and goes after a function that cannot (poor: 10 of 10 on time), although its request has less slack. Its
// own record, without the family, would be empty: a function without requests observed cannot spare one. Once
// every instance is removed the record goes with them.
func TestFamilyKeepsOneRecord(t *testing.T) {
	q, err := New(Config{Order: OrderSLOAware, SpareLast: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"f@1", "f@2", "poor"} {
		if err := q.SetFunction(f, ms(100), 98); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"f@1", "f@2"} {
		if err := q.SetFamily(f, "f"); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		q.Observe("f@1", true, ms(20))
	}
	for range 10 {
		q.Observe("poor", true, ms(20))
	}
	if s, _ := q.Stats("f@2"); s.Served != 100 || s.OnTime != 100 {
		t.Fatalf("f@2's record: %+v, want its family's 100 of 100", s)
	}
	q.Regroup(t0)
	if err := q.Push(Request{ID: 1, Function: "f@2", Arrival: t0, Cost: ms(10)}); err != nil {
		t.Fatal(err)
	}
	if err := q.Push(Request{ID: 2, Function: "poor", Arrival: t0.Add(ms(10)), Cost: ms(10)}); err != nil {
		t.Fatal(err)
	}
	if got := popIDs(q, t0.Add(ms(1))); !slices.Equal(got, []uint64{2, 1}) {
		t.Errorf("popped %v, want [2 1]: the new instance of a function that can spare a miss goes last", got)
	}
	if err := q.SetFamily("g", "f"); err == nil {
		t.Error("SetFamily of an unknown function: want an error")
	}
	q.RemoveFunction("f@1")
	if s, _ := q.Stats("f@2"); s.Served != 100 {
		t.Errorf("after f@1 left, f@2's record: %+v, want 100 served", s)
	}
	q.RemoveFunction("f@2")
	if err := q.SetFunction("f@3", ms(100), 98); err != nil {
		t.Fatal(err)
	}
	if err := q.SetFamily("f@3", "f"); err != nil {
		t.Fatal(err)
	}
	if s, _ := q.Stats("f@3"); s.Served != 0 {
		t.Errorf("a new instance once every other left: %+v, want an empty record", s)
	}
}

// TestObserveMissed: a refused or dropped request (ObserveMissed) is a miss in the record: a function of 100
// requests on time can spare a miss, two refused later it cannot, and its request goes before a richer function's.
// A function that would need more requests on time in a row than it has had to meet its SLO again (lost: 100
// served on time, 300 refused) goes with the functions that can spare a miss, and after them while the node is
// pressed, not before every one as a function below its SLO would.
func TestObserveMissed(t *testing.T) {
	q, err := New(Config{Order: OrderSLOAware, SpareLast: true})
	if err != nil {
		t.Fatal(err)
	}
	for f, served := range map[string]int{"edge": 100, "rich": 1000, "lost": 100} {
		if err := q.SetFunction(f, ms(100), 98); err != nil {
			t.Fatal(err)
		}
		for range served {
			q.Observe(f, true, ms(20))
		}
	}
	for range 300 {
		q.ObserveMissed("lost")
	}
	q.ObserveMissed("edge")
	q.ObserveMissed("edge")
	if s, _ := q.Stats("edge"); s.Served != 100 || s.Missed != 2 || s.OnTime != 100 {
		t.Fatalf("edge's record: %+v, want 100 served, 2 missed, 100 on time", s)
	}
	q.Regroup(t0)
	q.SetPressed(true)
	// Least slack: lost, then rich, then edge.
	for i, f := range []string{"lost", "rich", "edge"} {
		if err := q.Push(Request{ID: uint64(i + 1), Function: f, Arrival: t0.Add(ms(10 * i)), Cost: ms(10)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := popIDs(q, t0.Add(ms(1))); !slices.Equal(got, []uint64{3, 2, 1}) {
		t.Errorf("popped %v, want [3 2 1]: edge (two misses refused) first, the lost function last", got)
	}
}
