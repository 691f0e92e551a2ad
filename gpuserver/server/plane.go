package server

import (
	"context"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// The data plane the tracked pool holds is an executor.DataPlane: package executor's Node in the gpuserver's own
// process (--tenant-isolation none) or package tenant's Plane, one executor process per tenant (docs/tenants.md).

// planeActuator carries the controller's swaps and evictions out on the data plane: a swap decision becomes SwapIn
// from the decision's source GPU (or the host image for a cold start), an eviction Evict. (It lives here, not in
// package executor, so that the data plane does not import the policy.)
type planeActuator struct{ p executor.DataPlane }

var _ controller.Actuator = planeActuator{}

// SwapIn starts the swap and returns once it is enqueued; kernels wait per segment.
func (a planeActuator) SwapIn(ctx context.Context, function string, gpu int, from controller.Source) error {
	src := from.GPU
	if from.Kind == controller.SwapCold {
		src = executor.Host
	}
	if err := a.p.Register(function); err != nil {
		return err
	}
	return a.p.SwapIn(ctx, function, gpu, src)
}

// Evict drops the function's copy on gpu.
func (a planeActuator) Evict(ctx context.Context, function string, gpu int) error {
	return a.p.Evict(ctx, function, gpu)
}
