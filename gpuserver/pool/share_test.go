package pool

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestSpecSharesDefaultToExclusive(t *testing.T) {
	s := FunctionSpec{Name: "f", MemoryBytes: 1}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if r, l := s.Shares(); r != 1 || l != 1 || !s.Exclusive() {
		t.Fatalf("default shares = %v, %v exclusive %v; want 1, 1, exclusive", r, l, s.Exclusive())
	}
	s.ComputeRequest, s.ComputeLimit = 0.3, 0.7
	if err := s.Validate(); err != nil || s.Exclusive() {
		t.Fatalf("0.3/0.7: err %v, exclusive %v", err, s.Exclusive())
	}
}

func TestSpecSharesRefusedNameTheField(t *testing.T) {
	for _, tt := range []struct {
		r, l  float64
		field string
	}{
		{1.5, 0, "compute_request"},
		{-0.1, 0, "compute_request"},
		{math.NaN(), 0, "compute_request"},
		{0, 1.2, "compute_limit"},
		{0.3, math.NaN(), "compute_limit"},
		{0.8, 0.5, "compute_request"},
	} {
		s := FunctionSpec{Name: "f", MemoryBytes: 1, ComputeRequest: tt.r, ComputeLimit: tt.l}
		if err := s.Validate(); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("request %v limit %v: err = %v, want ErrInvalidSpec naming %s", tt.r, tt.l, err, tt.field)
		}
	}
}
