// Package autoscale decides how many replicas a function should have from the requests it has in flight, the way
// the OpenFaaS Pro autoscaler's capacity mode does, within the bounds of OpenFaaS's com.openfaas.scale.* labels:
// up at once when requests queue, down lazily (to the highest count recommended over a stabilisation window, 40 s
// by default as Dilu scales in), and to zero after an idle period where com.openfaas.scale.zero says so.
//
// The package is the decision only: Parse reads a function's labels, a Scaler turns observations (a time, the
// replica count, the load) into decisions, and Metrics exports them. It has no clock, no goroutine and no I/O of
// its own; the local backend (provider/local, under `faas-gpu up` and `faas-gpu provider -backend local`) drives
// it with the wall clock and the in-flight counts its proxy keeps, and applies each decision through the code
// path of PUT /system/scale-function.
package autoscale

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/provider"
)

// The labels, as OpenFaaS names them. A value may come as a label or as an annotation; the label wins.
const (
	// LabelMin is the fewest replicas while the function is awake (default 1); it is also the count a function
	// deploys with and wakes with from zero.
	LabelMin = "com.openfaas.scale.min"
	// LabelMax is the most replicas (default: the backend's maximum).
	LabelMax = "com.openfaas.scale.max"
	// LabelTarget is the target load per replica: requests in flight (capacity mode).
	LabelTarget = "com.openfaas.scale.target"
	// LabelTargetProportion scales the target: a replica counts as full at target x proportion (default 1.0;
	// OpenFaaS Pro's 0.9 would ask for two GPU replicas, two model copies, for one request in flight).
	LabelTargetProportion = "com.openfaas.scale.target-proportion"
	// LabelType is the scaling mode; only capacity (requests in flight) is implemented.
	LabelType = "com.openfaas.scale.type"
	// LabelZero allows scaling to zero after LabelZeroDuration without a request (default false).
	LabelZero = "com.openfaas.scale.zero"
	// LabelZeroDuration is the idle period before a scale to zero (default 15m).
	LabelZeroDuration = "com.openfaas.scale.zero-duration"
)

// Defaults. OpenFaaS Pro's target is 50 for every mode (its default mode is rps); here the only mode is capacity
// and a replica of a GPU function serves one request at a time, so the default target is one request
// in flight per replica. OpenFaaS Pro's default proportion is 0.9 (headroom: a replica counts as full at 90% of
// its target); at target 1 that asks for ceil(1/0.9) = 2 replicas for one request in flight, and each GPU replica
// holds its own model copy, so every busy function would hold twice the memory it uses. The default here is 1.0:
// N requests in flight ask for N replicas; a label of 0.9 asks for OpenFaaS Pro's headroom.
const (
	DefaultTarget           = 1.0
	DefaultTargetProportion = 1.0
	DefaultZeroDuration     = 15 * time.Minute
	// TypeCapacity is the one scaling mode implemented.
	TypeCapacity = "capacity"
)

// Policy is a function's scaling bounds and target.
type Policy struct {
	// Autoscaled is set when any label beyond LabelMin asks for autoscaling (max, target, target-proportion, type,
	// zero); a function with LabelMin alone keeps the replica count it is given (at deploy, by faas-cli scale).
	Autoscaled bool
	// Min and Max bound the replica count while the function is awake; Min may be 0 (it then deploys at zero and
	// wakes with one replica).
	Min, Max uint64
	// Target is the load per replica (requests in flight) at which the function has enough replicas, scaled by
	// Proportion.
	Target, Proportion float64
	// Zero allows scaling to zero after ZeroDuration without a request.
	Zero         bool
	ZeroDuration time.Duration
}

// Parse reads a function's scaling labels (labels, then annotations) and checks them; maxReplicas is the most the
// backend runs. A bad value is provider.ErrInvalid with a message naming the label.
func Parse(labels, annotations map[string]string, maxReplicas uint64) (Policy, error) {
	p := Policy{Min: 1, Max: maxReplicas, Target: DefaultTarget, Proportion: DefaultTargetProportion,
		ZeroDuration: DefaultZeroDuration}
	get := func(key string) (string, bool) {
		if v, ok := labels[key]; ok {
			return strings.TrimSpace(v), true
		}
		v, ok := annotations[key]
		return strings.TrimSpace(v), ok
	}
	bad := func(key, v, want string) error {
		return fmt.Errorf("%w: label %s: %q must be %s", provider.ErrInvalid, key, v, want)
	}
	if v, ok := get(LabelMin); ok {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > maxReplicas {
			return Policy{}, bad(LabelMin, v, fmt.Sprintf("a replica count from 0 to %d", maxReplicas))
		}
		p.Min = n
	}
	if v, ok := get(LabelMax); ok {
		p.Autoscaled = true
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 || n > maxReplicas {
			return Policy{}, bad(LabelMax, v, fmt.Sprintf("a replica count from 1 to %d", maxReplicas))
		}
		if n < p.Min {
			return Policy{}, bad(LabelMax, v, fmt.Sprintf("at least %s (%d)", LabelMin, p.Min))
		}
		p.Max = n
	}
	positive := func(key, v string, most float64) (float64, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) || f > most || math.IsInf(f, 0) {
			return 0, bad(key, v, fmt.Sprintf("a number above 0 and at most %g", most))
		}
		return f, nil
	}
	if v, ok := get(LabelTarget); ok {
		p.Autoscaled = true
		f, err := positive(LabelTarget, v, 1e6)
		if err != nil {
			return Policy{}, err
		}
		p.Target = f
	}
	if v, ok := get(LabelTargetProportion); ok {
		p.Autoscaled = true
		f, err := positive(LabelTargetProportion, v, 10)
		if err != nil {
			return Policy{}, err
		}
		p.Proportion = f
	}
	if v, ok := get(LabelType); ok {
		p.Autoscaled = true
		if v != TypeCapacity {
			return Policy{}, fmt.Errorf("%w: label %s: %q is not implemented here: faas-gpu's autoscaler (up, "+
				"provider -backend local) scales by requests in flight only, %s (rps, cpu, queue and custom rules "+
				"need the OpenFaaS Pro autoscaler in a cluster)", provider.ErrInvalid, LabelType, v, TypeCapacity)
		}
	}
	if v, ok := get(LabelZero); ok {
		p.Autoscaled = true
		z, err := strconv.ParseBool(v)
		if err != nil {
			return Policy{}, bad(LabelZero, v, "true or false")
		}
		p.Zero = z
	}
	if v, ok := get(LabelZeroDuration); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return Policy{}, bad(LabelZeroDuration, v, "a positive Go duration such as 15m")
		}
		p.ZeroDuration = d
	}
	return p, nil
}

// Wake is how many replicas a function at zero wakes with: Min, at least 1.
func (p Policy) Wake() uint64 { return max(p.Min, 1) }
