package autoscale

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider"
)

func TestParseDefaultsAndSources(t *testing.T) {
	p, err := Parse(nil, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := Policy{Min: 1, Max: 10, Target: 1, Proportion: 1, ZeroDuration: 15 * time.Minute}
	if p != want {
		t.Fatalf("defaults %+v, want %+v", p, want)
	}
	if p, _ := Parse(map[string]string{LabelMin: "3"}, nil, 10); p.Autoscaled || p.Min != 3 {
		t.Fatalf("min alone: %+v, want a fixed count of 3", p)
	}
	// An annotation counts where no label says otherwise; a label wins over an annotation.
	p, err = Parse(map[string]string{LabelMax: "8"},
		map[string]string{LabelMax: "2", LabelMin: "2", LabelZero: "true", LabelZeroDuration: "30s",
			LabelTarget: "5", LabelTargetProportion: "1", LabelType: "capacity"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	want = Policy{Autoscaled: true, Min: 2, Max: 8, Target: 5, Proportion: 1, Zero: true, ZeroDuration: 30 * time.Second}
	if p != want {
		t.Fatalf("got %+v, want %+v", p, want)
	}
	if p.Wake() != 2 {
		t.Fatalf("wake %d, want 2", p.Wake())
	}
	if p, _ := Parse(map[string]string{LabelMin: "0", LabelZero: "false"}, nil, 10); !p.Autoscaled || p.Wake() != 1 {
		t.Fatalf("min 0: %+v wakes with %d, want autoscaled, 1", p, p.Wake())
	}
}

// TestParseRefusesBadValuesNamingTheLabel: every bad value is ErrInvalid (400) and its message names the label.
func TestParseRefusesBadValuesNamingTheLabel(t *testing.T) {
	for _, c := range []struct {
		labels map[string]string
		label  string
	}{
		{map[string]string{LabelMin: "eleven"}, LabelMin},
		{map[string]string{LabelMin: "11"}, LabelMin},
		{map[string]string{LabelMax: "0"}, LabelMax},
		{map[string]string{LabelMax: "11"}, LabelMax},
		{map[string]string{LabelMin: "4", LabelMax: "3"}, LabelMax},
		{map[string]string{LabelTarget: "0"}, LabelTarget},
		{map[string]string{LabelTarget: "-5"}, LabelTarget},
		{map[string]string{LabelTarget: "NaN"}, LabelTarget},
		{map[string]string{LabelTargetProportion: "0"}, LabelTargetProportion},
		{map[string]string{LabelTargetProportion: "lots"}, LabelTargetProportion},
		{map[string]string{LabelType: "rps"}, LabelType},
		{map[string]string{LabelType: "cpu"}, LabelType},
		{map[string]string{LabelZero: "sometimes"}, LabelZero},
		{map[string]string{LabelZeroDuration: "15"}, LabelZeroDuration},
		{map[string]string{LabelZeroDuration: "-1m"}, LabelZeroDuration},
	} {
		// As a label, and as an annotation.
		for _, args := range [][2]map[string]string{{c.labels, nil}, {nil, c.labels}} {
			_, err := Parse(args[0], args[1], 10)
			if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), c.label) {
				t.Errorf("%v: err %v, want ErrInvalid naming %s", c.labels, err, c.label)
			}
		}
	}
}
