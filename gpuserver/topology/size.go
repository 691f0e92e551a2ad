package topology

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize reads a byte size: a plain number of bytes, or a number with a binary (Ki, Mi, Gi, Ti) or decimal
// (K/KB, M/MB, G/GB, T/TB) suffix, as in "1536Mi", "32Gi" or "16GB". It refuses zero, negative and fractional
// byte counts.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("size %q: not a number with an optional unit (Ki, Mi, Gi, Ti, KB, MB, GB, TB)", s)
	}
	b := v * mult
	if b < 1 || b != math.Trunc(b) || b > math.MaxUint64/2 {
		return 0, fmt.Errorf("size %q: must be a positive whole number of bytes", s)
	}
	return uint64(b), nil
}
