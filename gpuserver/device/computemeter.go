package device

import "time"

// ComputeMeter is a stream that measures the GPU time its compute work (kernels, graphs, memsets, local copies)
// occupies its GPU: what a compute share's tokens are counted in (gpuserver/compute). Work counts once it is
// placed on the GPU's timeline, a little after the call that enqueued it.
type ComputeMeter interface {
	// ComputeWork is the number of compute operations measured so far and the GPU time they occupy (modelled
	// time, scaled as the device's clock is, on the timed virtual GPU).
	ComputeWork() (ops uint64, work time.Duration)
}
