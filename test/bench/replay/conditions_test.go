package main

import (
	"errors"
	"strings"
	"testing"
)

// The bench refuses a machine loaded above -max-load with a message naming the load and the way out, runs labelled
// when forced, and runs unlabelled below the limit or with the check off.
func TestCheckLoadRefusesALoadedMachine(t *testing.T) {
	loaded := machineLoad{Load1: 10.59, Runnable: 13, Line: "10.59 13.53 9.58 13/215"}
	_, err := checkLoad(loaded, 2, false)
	if !errors.Is(err, errTooLoaded) || !strings.Contains(err.Error(), "10.59") ||
		!strings.Contains(err.Error(), "-force") {
		t.Fatalf("load 10.59 against -max-load 2: %v", err)
	}
	label, err := checkLoad(loaded, 2, true)
	if err != nil || !strings.Contains(label, "Loaded run") || !strings.Contains(label, "13/215") {
		t.Fatalf("forced: label %q, %v", label, err)
	}
	for _, max := range []float64{11, 0} {
		if label, err := checkLoad(loaded, max, false); err != nil || label != "" {
			t.Fatalf("-max-load %g: label %q, %v", max, label, err)
		}
	}
}

// readLoad parses this machine's /proc/loadavg.
func TestReadLoad(t *testing.T) {
	l, err := readLoad()
	if err != nil {
		t.Fatal(err)
	}
	if l.Load1 < 0 || l.Runnable < 1 || len(strings.Fields(l.Line)) != 4 {
		t.Fatalf("%+v", l)
	}
}

// The report states the spread another accepted run falls within, and says when this run's own repeats spread
// wider than that (figures not reproducible to it).
func TestSpreadNoteStatesTheSpreadAndFlagsAWiderRun(t *testing.T) {
	quiet := []result{{Model: "resnet152", Batch: 1, RatioMin: 0.690, RatioMax: 0.697},
		{Model: "bert-base", Batch: 8, RatioMin: 0.998, RatioMax: 1.001}}
	n := spreadNote(3, quiet)
	if !strings.Contains(n, "±0.02") || !strings.Contains(n, "0.007 (resnet152 b1)") || strings.Contains(n, "wider") {
		t.Fatalf("quiet run: %q", n)
	}
	wide := append(quiet, result{Model: "bert-base", Batch: 1, RatioMin: 0.90, RatioMax: 0.97})
	if n := spreadNote(3, wide); !strings.Contains(n, "0.070 (bert-base b1)") || !strings.Contains(n, "not reproducible") {
		t.Fatalf("wide run: %q", n)
	}
	if n := spreadNote(1, quiet); !strings.Contains(n, "no range of its own") {
		t.Fatalf("one repeat: %q", n)
	}
}
