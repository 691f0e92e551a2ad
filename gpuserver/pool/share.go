package pool

import (
	"fmt"

	"github.com/faas-gpu/faas-gpu/contract"
)

// Shares are the function's compute shares of one GPU with their defaults filled (contract.Shares): request is
// what its binding is guaranteed, limit what it may grow to. Both 1 (the default) is an exclusive binding.
func (s FunctionSpec) Shares() (request, limit float64) {
	return contract.Shares(s.ComputeRequest, s.ComputeLimit)
}

// Exclusive reports whether the function's bindings hold a GPU alone: its request is the whole GPU (the default).
// An exclusive function never shares a GPU with another binding, and its launches pass no gate.
func (s FunctionSpec) Exclusive() bool {
	r, _ := s.Shares()
	return r >= 1
}

// validateShares checks the compute shares; the error names the field of the spec (compute_request or
// compute_limit) and wraps ErrInvalidSpec.
func (s FunctionSpec) validateShares() error {
	inRange := func(v float64) bool { return v >= 0 && v <= 1 } // false for NaN; 0 is "not named"
	switch r, l := s.Shares(); {
	case !inRange(s.ComputeRequest):
		return fmt.Errorf("%w: compute_request: %v must be in (0, 1]", ErrInvalidSpec, s.ComputeRequest)
	case !inRange(s.ComputeLimit):
		return fmt.Errorf("%w: compute_limit: %v must be in (0, 1]", ErrInvalidSpec, s.ComputeLimit)
	case r > l:
		return fmt.Errorf("%w: compute_request: %v is above compute_limit %v", ErrInvalidSpec, r, l)
	}
	return nil
}

// CoRunner is one of the bindings sharing a GPU: its function and the shares it holds there.
type CoRunner struct {
	Function string  `json:"function"`
	Request  float64 `json:"request"`
	Limit    float64 `json:"limit"`
}
