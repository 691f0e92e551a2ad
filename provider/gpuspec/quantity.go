package gpuspec

import (
	"fmt"
	"math/big"
	"strings"
)

// suffixes of a Kubernetes quantity that make sense for bytes, with their multipliers.
var suffixes = []struct {
	suffix string
	mult   *big.Int
}{
	{"Ki", pow(2, 10)}, {"Mi", pow(2, 20)}, {"Gi", pow(2, 30)}, {"Ti", pow(2, 40)}, {"Pi", pow(2, 50)}, {"Ei", pow(2, 60)},
	{"k", pow(10, 3)}, {"M", pow(10, 6)}, {"G", pow(10, 9)}, {"T", pow(10, 12)}, {"P", pow(10, 15)}, {"E", pow(10, 18)},
}

func pow(base, exp int64) *big.Int {
	return new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil)
}

var maxUint64 = new(big.Int).SetUint64(^uint64(0))

// ParseQuantity reads a byte count written as a Kubernetes quantity: a non-negative decimal number (1536, 1.5,
// 1e9) followed by an optional binary (Ki, Mi, Gi, Ti, Pi, Ei) or decimal (k, M, G, T, P, E) suffix. A fractional
// byte count is rounded up, as Kubernetes does. The result must be positive and fit in 64 bits; the milli suffix
// "m" is refused because a fraction of a byte is never what was meant.
func ParseQuantity(s string) (uint64, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return 0, fmt.Errorf("quantity is empty (e.g. 1536Mi, 2Gi, 500M)")
	}
	mult := big.NewInt(1)
	num := v
	for _, sf := range suffixes {
		if strings.HasSuffix(v, sf.suffix) {
			mult, num = sf.mult, strings.TrimSuffix(v, sf.suffix)
			break
		}
	}
	if strings.HasSuffix(num, "m") {
		return 0, fmt.Errorf("%q: the milli suffix m is not a byte quantity (did you mean M or Mi?)", s)
	}
	if num == "" || !isNumber(num) {
		return 0, fmt.Errorf("%q is not a quantity (e.g. 1536Mi, 2Gi, 500M)", s)
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("%q is not a quantity (e.g. 1536Mi, 2Gi, 500M)", s)
	}
	r.Mul(r, new(big.Rat).SetInt(mult))
	// Round up to a whole byte.
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	switch {
	case q.Sign() <= 0:
		return 0, fmt.Errorf("%q must be greater than zero", s)
	case q.Cmp(maxUint64) > 0:
		return 0, fmt.Errorf("%q is too large", s)
	}
	return q.Uint64(), nil
}

// isNumber accepts digits with at most one decimal point and an optional decimal exponent (e3, E-2), the forms a
// Kubernetes quantity allows; it refuses signs, spaces, hex and the like that big.Rat would otherwise accept.
func isNumber(s string) bool {
	mant, exp := s, ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant, exp = s[:i], s[i+1:]
		if strings.HasPrefix(exp, "-") || strings.HasPrefix(exp, "+") {
			exp = exp[1:]
		}
		if exp == "" || strings.Trim(exp, "0123456789") != "" || len(exp) > 3 {
			return false
		}
	}
	digits, dots := 0, 0
	for _, c := range mant {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return false
		}
	}
	return digits > 0 && dots <= 1
}
