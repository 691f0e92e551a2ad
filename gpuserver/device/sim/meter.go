package sim

import (
	"sync/atomic"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// meter counts a stream's compute operations and the GPU time they occupy its GPU's compute engine
// (device.ComputeMeter): a kernel's modelled time, scaled by Options.TimeScale in the timed mode. An operation that
// failed counts with no time, so that a gate waiting for its measurement is not left waiting.
type meter struct {
	ops  atomic.Uint64
	work atomic.Int64 // nanoseconds
}

// add counts o after it ran for d (its modelled duration, unscaled).
func (m *meter) add(o op, d time.Duration, scale float64) {
	if !o.compute {
		return
	}
	if scale > 0 {
		d = time.Duration(float64(d) * scale)
	}
	m.work.Add(int64(max(0, d)))
	m.ops.Add(1)
}

// ComputeWork implements device.ComputeMeter.
func (s *stream) ComputeWork() (uint64, time.Duration) {
	// ops first (add counts its time before the op): an operation read as counted has its time counted
	n := s.meter.ops.Load()
	return n, time.Duration(s.meter.work.Load())
}

var _ device.ComputeMeter = (*stream)(nil)
