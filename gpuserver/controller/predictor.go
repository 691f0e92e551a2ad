package controller

import (
	"math"
	"time"
)

// Predictor learns a duration online: an exponentially weighted moving average and, for the tail, an
// exponentially weighted mean absolute deviation. It starts from a seed (from model size and link bandwidth, or a
// profile) that the first observations replace gradually.
type Predictor struct {
	mean, dev float64 // seconds
	n         int
}

// predictorWeight is the weight of a new observation.
const predictorWeight = 0.2

// NewPredictor returns a predictor seeded with seed.
func NewPredictor(seed time.Duration) Predictor { return Predictor{mean: seed.Seconds()} }

// Observe adds one measurement.
func (p *Predictor) Observe(d time.Duration) {
	x := d.Seconds()
	if p.n == 0 {
		p.mean, p.dev = x, 0
	} else {
		w := max(predictorWeight, 1/float64(p.n+1))
		p.dev = (1-w)*p.dev + w*math.Abs(x-p.mean)
		p.mean = (1-w)*p.mean + w*x
	}
	p.n++
}

// Mean is the expected duration.
func (p *Predictor) Mean() time.Duration { return time.Duration(p.mean * float64(time.Second)) }

// Tail is a high-percentile estimate: mean plus three mean absolute deviations.
func (p *Predictor) Tail() time.Duration {
	return time.Duration((p.mean + 3*p.dev) * float64(time.Second))
}

// Observations is how many measurements the predictor has seen.
func (p *Predictor) Observations() int { return p.n }
