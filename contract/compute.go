package contract

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Compute shares of a function (docs/design.md, decision 11): the fraction of one GPU's compute its binding is
// guaranteed (request) and may grow to when its neighbours leave room (limit), both in (0, 1]. A function that names
// neither has request = limit = 1: an exclusive binding, as before shares existed. Values are fractions ("0.3") or
// percentages as HAMi writes them ("30%").
const (
	// AnnotationComputeRequest is the share of a GPU the function's binding is guaranteed; when absent it is the
	// limit when one is named, else 1 (exclusive).
	AnnotationComputeRequest = "com.openfaas.gpu.compute.request"
	// AnnotationComputeLimit is the share of a GPU the function's binding may grow to; when absent, 1.
	AnnotationComputeLimit = "com.openfaas.gpu.compute.limit"
)

// ErrInvalidShare is wrapped by ParseShare's and CheckShares' errors.
var ErrInvalidShare = errors.New("invalid compute share")

// ParseShare reads a compute share: a fraction in (0, 1] ("0.25", "1") or a percentage in (0%, 100%] ("25%").
// A bare number above 1 is refused rather than read as a percentage ("30" could mean either).
func ParseShare(v string) (float64, error) {
	s := strings.TrimSpace(v)
	pct := strings.HasSuffix(s, "%")
	if pct {
		s = strings.TrimSpace(strings.TrimSuffix(s, "%"))
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%w: %q is not a fraction (0.3) or a percentage (30%%)", ErrInvalidShare, v)
	}
	if pct {
		f /= 100
	}
	switch {
	case f <= 0:
		return 0, fmt.Errorf("%w: %q must be above 0", ErrInvalidShare, v)
	case f > 1 && !pct:
		return 0, fmt.Errorf("%w: %q is above 1 GPU (a fraction in (0, 1], or a percentage such as 30%%)",
			ErrInvalidShare, v)
	case f > 1:
		return 0, fmt.Errorf("%w: %q is above 100%% of a GPU", ErrInvalidShare, v)
	}
	return f, nil
}

// Shares fills the defaults of a function's compute shares: request and limit as read (0: not named) become the
// shares it runs with. A request above the limit is refused (CheckShares).
func Shares(request, limit float64) (float64, float64) {
	if limit == 0 {
		limit = 1
	}
	if request == 0 {
		request = limit
	}
	return request, limit
}

// CheckShares checks a function's compute shares as read (0: not named) and names the annotation at fault.
func CheckShares(request, limit float64) error {
	for _, s := range []struct {
		name string
		v    float64
	}{{AnnotationComputeRequest, request}, {AnnotationComputeLimit, limit}} {
		if math.IsNaN(s.v) || s.v < 0 || s.v > 1 {
			return fmt.Errorf("%w: %s: %v must be in (0, 1]", ErrInvalidShare, s.name, s.v)
		}
	}
	if r, l := Shares(request, limit); r > l {
		return fmt.Errorf("%w: %s: %v is above %s %v", ErrInvalidShare, AnnotationComputeRequest, r,
			AnnotationComputeLimit, l)
	}
	return nil
}
