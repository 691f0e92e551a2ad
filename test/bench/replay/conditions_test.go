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
