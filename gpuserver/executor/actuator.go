package executor

import (
	"context"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
)

// Actuator adapts a Node to the controller's data-movement interface (controller.Actuator): a swap decision becomes
// SwapIn from the decision's source GPU (or host; a cold start also reads the host image), an eviction Evict.
type Actuator struct{ Node *Node }

var _ controller.Actuator = Actuator{}

// SwapIn starts the swap and returns once it is enqueued; kernels wait per segment.
func (a Actuator) SwapIn(ctx context.Context, function string, gpu int, from controller.Source) error {
	src := from.GPU
	if from.Kind == controller.SwapCold {
		src = Host
	}
	if err := a.Node.Register(function); err != nil {
		return err
	}
	return a.Node.SwapIn(ctx, function, gpu, src)
}

// Evict drops the function's copy on gpu.
func (a Actuator) Evict(ctx context.Context, function string, gpu int) error {
	return a.Node.Evict(ctx, function, gpu)
}
