package replay

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// Autoscaled instances in a replay (faas-gpu replay --scale-labels): every function is deployed with the same
// com.openfaas.scale.* labels, so up's autoscaler (provider/local) scales its replicas, and the simulator runs
// the same decision code (simulate.Config.Autoscale) with the policy those labels parse to. The replica counts
// are compared over time: the real node's from the gateway's GET /system/functions (Replicas, the count the
// autoscaler asked for, and AvailableReplicas, those ready), polled while the window runs; the simulator's from
// its autoscaler's decisions (Result.Scaling), an instance ready InstanceStart after the decision that started it.

// ParseScaleLabels reads comma-separated label=value pairs ("max=8,min=1"; the com.openfaas.scale. prefix may be
// left out) and the policy autoscale.Parse gives them with the backend's most replicas maxReplicas. Empty is no
// label: one instance, the product's default for a function deployed without scale labels. Labels that parse
// but ask for no autoscaling (min alone) are refused: the replay would compare nothing.
func ParseScaleLabels(s string, maxReplicas uint64) (map[string]string, autoscale.Policy, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, autoscale.Policy{}, fmt.Errorf("%w: scale labels: %q: want label=value", ErrInvalidWindow, kv)
		}
		if k = strings.TrimSpace(k); !strings.HasPrefix(k, "com.openfaas.scale.") {
			k = "com.openfaas.scale." + k
		}
		labels[k] = strings.TrimSpace(v)
	}
	if len(labels) == 0 {
		return nil, autoscale.Policy{}, nil
	}
	p, err := autoscale.Parse(labels, nil, maxReplicas)
	if err != nil {
		return nil, autoscale.Policy{}, fmt.Errorf("%w: scale labels: %w", ErrInvalidWindow, err)
	}
	if !p.Autoscaled {
		return nil, autoscale.Policy{}, fmt.Errorf("%w: scale labels %q ask for no autoscaling (give max, target, "+
			"target-proportion or zero)", ErrInvalidWindow, s)
	}
	return labels, p, nil
}

// Replicas is one function's replica counts at one moment: those the autoscaler asked for and those ready.
type Replicas struct {
	Desired, Ready int
}

// Sample is every function's replicas (by function index) at At, in the window's time.
type Sample struct {
	At       time.Duration
	Replicas []Replicas
}

// PollReplicas samples get every `every` (in the window's time; timeScale times longer on the wall clock) from
// now until ctx ends, and returns the samples. get answers every function's replicas by index; a failed look is
// left out (the next one counts), and its error kept in the second result (the first one only).
func PollReplicas(ctx context.Context, every time.Duration, timeScale float64,
	get func(context.Context) ([]Replicas, error)) ([]Sample, error) {
	var out []Sample
	var firstErr error
	start := time.Now()
	t := time.NewTicker(time.Duration(float64(every) * timeScale))
	defer t.Stop()
	for {
		rs, err := get(ctx)
		at := time.Duration(float64(time.Since(start)) / timeScale)
		if err == nil {
			out = append(out, Sample{At: at, Replicas: rs})
		} else if firstErr == nil && ctx.Err() == nil {
			firstErr = err
		}
		select {
		case <-ctx.Done():
			return out, firstErr
		case <-t.C:
		}
	}
}

// Point is one moment of a function's instance count on both sides.
type Point struct {
	At          float64 `json:"at_s"`
	RealDesired int     `json:"real_desired"`
	RealReady   int     `json:"real_ready"`
	SimDesired  int     `json:"sim_desired"`
	SimReady    int     `json:"sim_ready"`
}

// InstanceSeries compares one function's instances over the window on both sides.
type InstanceSeries struct {
	Function string `json:"function"`
	// Points are the real node's samples with the simulator's counts at the same moments.
	Points []Point `json:"points"`
	// Mean and peak ready instances over the samples; MeanAbsDiff the mean of |real ready - sim ready|.
	RealMean    float64 `json:"real_ready_mean"`
	SimMean     float64 `json:"sim_ready_mean"`
	RealPeak    int     `json:"real_ready_peak"`
	SimPeak     int     `json:"sim_ready_peak"`
	MeanAbsDiff float64 `json:"ready_mean_abs_difference"`
	// RealUps and SimUps count the increases of the desired count between samples (real) and the scale-up
	// decisions (simulator); Downs the decreases.
	RealUps   int `json:"real_scale_ups"`
	SimUps    int `json:"sim_scale_ups"`
	RealDowns int `json:"real_scale_downs"`
	SimDowns  int `json:"sim_scale_downs"`
}

// simCount is function fn's instance count in the simulator at `at`: desired after every decision made by then,
// ready counting an increase only InstanceStart after its decision (a decrease at once: the instances stopped
// take no new request).
func simCount(events []simulate.ScaleEvent, fn int, initial int, start, at time.Duration) (desired, ready int) {
	desired, ready = initial, initial
	for _, ev := range events {
		if ev.Function != fn || ev.At > at {
			continue
		}
		from, to := int(ev.From), int(ev.To)
		desired += to - from
		if to < from || ev.At+start <= at {
			ready += to - from
		}
	}
	return desired, max(ready, 0)
}

// CompareInstances builds the series of every function that scaled on either side (its desired count left its
// initial count in a sample or in a decision), from the real node's samples and the simulator's decisions; initial
// is each function's replicas at deploy (the policy's Min, at least 1) and start the simulator's InstanceStart.
func CompareInstances(fns []Function, samples []Sample, events []simulate.ScaleEvent, initial int,
	start time.Duration) []InstanceSeries {
	scaled := map[int]bool{}
	for _, ev := range events {
		scaled[ev.Function] = true
	}
	for _, s := range samples {
		for i, r := range s.Replicas {
			if r.Desired != initial || r.Ready > initial {
				scaled[i] = true
			}
		}
	}
	var idx []int
	for i := range scaled {
		if i < len(fns) {
			idx = append(idx, i)
		}
	}
	sort.Ints(idx)
	var out []InstanceSeries
	for _, fi := range idx {
		ser := InstanceSeries{Function: fns[fi].Name}
		prev := initial
		var sumR, sumS, sumD float64
		for _, s := range samples {
			if fi >= len(s.Replicas) {
				continue
			}
			r := s.Replicas[fi]
			sd, sr := simCount(events, fi, initial, start, s.At)
			ser.Points = append(ser.Points, Point{At: math.Round(s.At.Seconds()*10) / 10, RealDesired: r.Desired,
				RealReady: r.Ready, SimDesired: sd, SimReady: sr})
			sumR, sumS, sumD = sumR+float64(r.Ready), sumS+float64(sr), sumD+math.Abs(float64(r.Ready-sr))
			ser.RealPeak, ser.SimPeak = max(ser.RealPeak, r.Ready), max(ser.SimPeak, sr)
			switch {
			case r.Desired > prev:
				ser.RealUps++
			case r.Desired < prev:
				ser.RealDowns++
			}
			prev = r.Desired
		}
		if n := float64(len(ser.Points)); n > 0 {
			ser.RealMean, ser.SimMean, ser.MeanAbsDiff = round2(sumR/n), round2(sumS/n), round2(sumD/n)
		}
		for _, ev := range events {
			if ev.Function != fi {
				continue
			}
			if ev.To > ev.From {
				ser.SimUps++
			} else {
				ser.SimDowns++
			}
		}
		out = append(out, ser)
	}
	return out
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }

// Timeline writes a series' points every `every` as "t: real ready/desired, sim ready/desired" for a table.
func (s InstanceSeries) Timeline(every time.Duration) string {
	var b strings.Builder
	next := 0.0
	for _, p := range s.Points {
		if p.At+1e-9 < next {
			continue
		}
		next = p.At + every.Seconds()
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatFloat(p.At, 'f', 0, 64) + "s " + strconv.Itoa(p.RealReady) + "/" +
			strconv.Itoa(p.SimReady))
	}
	return b.String()
}
