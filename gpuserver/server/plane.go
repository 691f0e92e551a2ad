package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant"
)

// dataPlane is where the node's executors run, as the tracked pool sees them: in the gpuserver's own process
// (package executor's Node: every tenant in one process, --tenant-isolation=none) or in one executor process per
// tenant (package tenant, docs/tenants.md).
type dataPlane interface {
	GPUs() int
	Healthy(gpu int) bool
	MarkUnhealthy(gpu int, cause error)
	Status() []executor.Status
	Register(name string) error
	SetTenant(ctx context.Context, name, tenant string) error
	Deregister(ctx context.Context, name string) error
	EndInit(ctx context.Context, name string) error
	// Usable says why a function's device work is refused (executor.Node.Usable), nil when it is not.
	Usable(name string) error
	// hold holds binding id of function on gpu (a request's, or an implicit one).
	hold(ctx context.Context, name string, gpu int, id string, request bool) (heldBinding, error)
}

// heldBinding is a binding held on the data plane.
type heldBinding interface {
	// Finish releases it and says whether it broke while it was held (executor.Binding.Err).
	Finish() error
	// Orphaned reports whether the function was reset under it (executor.Binding.Orphaned).
	Orphaned() bool
	// Expire ends it because it was held too long (executor.Node.Expire): it breaks, the GPU is free for other
	// functions, and the function's work there is stopped.
	Expire(ctx context.Context, grace time.Duration, cause error) error
}

// nodePlane is the in-process data plane.
type nodePlane struct{ *executor.Node }

func (p nodePlane) hold(ctx context.Context, name string, gpu int, _ string, _ bool) (heldBinding, error) {
	b, err := p.Acquire(ctx, name, gpu, executor.Any)
	if errors.Is(err, executor.ErrLost) { // its memory is gone with no image: its process must start again
		return nil, fmt.Errorf("%w: %w", pool.ErrFunctionLost, err)
	}
	if err != nil {
		return nil, err
	}
	return nodeBinding{Binding: b, n: p.Node}, nil
}

type nodeBinding struct {
	*executor.Binding
	n *executor.Node
}

func (b nodeBinding) Expire(ctx context.Context, grace time.Duration, cause error) error {
	return b.n.Expire(ctx, b.Binding, grace, cause)
}

func (b nodeBinding) Finish() error {
	err := b.Err()
	b.Release()
	return err
}

// tenantPlane is the data plane of executor processes per tenant.
type tenantPlane struct{ *tenant.Plane }

// EndInit is folded into a request's hold, which ends the initialisation in the executor first: one frame less per
// request. (The executors end it themselves before a swap moves a function or an eviction drops its copy, so no
// image is lost to the placement made in between.)
func (p tenantPlane) EndInit(context.Context, string) error { return nil }

func (p tenantPlane) hold(ctx context.Context, name string, gpu int, id string, request bool) (heldBinding, error) {
	h, err := p.Acquire(ctx, name, gpu, executor.Any, id, request)
	if errors.Is(err, executor.ErrLost) { // its memory is gone with no image: its process must start again
		return nil, fmt.Errorf("%w: %w", pool.ErrFunctionLost, err)
	}
	if err != nil {
		return nil, err
	}
	return tenantHold{h}, nil
}

// Usable is nil: an executor process refuses its functions' work itself.
func (p tenantPlane) Usable(string) error { return nil }

// tenantHold is a binding held in a tenant's executor process.
type tenantHold struct{ *tenant.Hold }

// Expire ends a binding held too long in an executor process as executor.Node.Expire does in one process (the
// hand-off's KindExpire): the function's work there is refused until its request releases the binding, what it
// queued is stopped after grace, and the release answers that the binding broke. The GPU is free for the next
// request once it returns.
func (h tenantHold) Expire(ctx context.Context, grace time.Duration, cause error) error {
	return h.Hold.Expire(ctx, grace, cause)
}

// tenantActuator carries the controller's swaps and evictions out in the functions' executors.
type tenantActuator struct{ p *tenant.Plane }

var _ controller.Actuator = tenantActuator{}

func (a tenantActuator) SwapIn(ctx context.Context, function string, gpu int, from controller.Source) error {
	src := from.GPU
	if from.Kind == controller.SwapCold {
		src = executor.Host
	}
	return a.p.SwapIn(ctx, function, gpu, src)
}

func (a tenantActuator) Evict(ctx context.Context, function string, gpu int) error {
	return a.p.Evict(ctx, function, gpu)
}
