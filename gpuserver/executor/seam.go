package executor

import (
	"context"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
)

// DataPlane is the node's executors as the gpuserver holds them: the one seam between the gpuserver's pool and
// controller and the work they place. Two implement it: Node, every tenant in the gpuserver's own process
// (--tenant-isolation none), and tenant.Plane, one executor process per tenant (--tenant-isolation process), which
// carries each method over the control socket (tenant/handoff's Ops) to a Node in that process. Both answer with
// the sentinel errors of this package and of package pool, so that errors.Is gives the same answer in either mode.
//
// What the data plane does on its own is named here and reported upward as it happens:
//
//   - a copy it evicts (EvictPressure: a swap-in out of chunks; EvictReclaim: another tenant's chunks given back):
//     Config.OnEvict in process, handoff.EventEvicted and tenant.Config.OnEvict across; the gpuserver tells the
//     controller (controller.Controller.Evicted);
//   - a GPU it finds failed: Config.OnUnhealthy, handoff.EventGPUFailed; asked as Healthy before every acquire;
//   - a kernel fault of a tenant: Config.OnContextFault, handoff.EventFault, tenant.Config.OnFault;
//   - the one placement it makes itself: a Hold whose model is no longer on its GPU (a copy it evicted) swaps it in
//     there from Source (Any: a GPU with a copy, else the host image). The GPU is the controller's choice; the
//     copy's return is not reported (the controller placed it there already).
type DataPlane interface {
	// GPUs is the number of GPUs.
	GPUs() int
	// Healthy reports whether a GPU is in service.
	Healthy(gpu int) bool
	// MarkUnhealthy takes a GPU out of service.
	MarkUnhealthy(gpu int, cause error)
	// Status describes every GPU.
	Status() []Status
	// Register makes a function known (a no-op where SetTenant does it).
	Register(name string) error
	// SetTenant puts a function in its tenant (the address space and contexts it shares).
	SetTenant(ctx context.Context, name, tenant string) error
	// Deregister drops a function: its copies, its image.
	Deregister(ctx context.Context, name string) error
	// EndInit ends a function's initialisation before its first request queues: its model becomes its image. A
	// plane that ends it inside the request's Hold instead (one frame less per request: tenant.Plane) does nothing
	// here.
	EndInit(ctx context.Context, name string) error
	// Usable says why a function's device work is refused (its memory was lost, a binding of it expired and was
	// not released), nil when it is not. A plane whose executors refuse that work themselves answers nil.
	Usable(name string) error
	// Hold holds binding id of function on gpu, swapping its model in from source where it is not there (a copy
	// the data plane evicted on its own); request says whether it is a request's binding (the function's calls then
	// run on that GPU, and its initialisation ends first) or an implicit one (calls outside a request).
	Hold(ctx context.Context, name string, gpu int, source Source, id string, request bool) (Held, error)
	// SwapIn makes function's model usable on gpu, copying from source (the controller's swap).
	SwapIn(ctx context.Context, name string, gpu int, source Source) error
	// Evict drops function's copy on gpu (the controller's eviction).
	Evict(ctx context.Context, name string, gpu int) error
	// WaitReady waits until the copies of the function's active GPU completed (benchmarks).
	WaitReady(ctx context.Context, name string) error
	// ComputeShares gives the gates of a GPU's shared bindings their shares (gpuserver/compute's Allotment: a
	// period's grant, or a join or a leave) and answers what the gates saw (computegate.go).
	ComputeShares(ctx context.Context, a compute.Allotment) (compute.Report, error)
}

// Held is a binding held on the data plane (DataPlane.Hold).
type Held interface {
	// Finish releases it and says whether it broke while it was held (Binding.Err).
	Finish() error
	// Orphaned reports whether the function was reset under it (Binding.Orphaned).
	Orphaned() bool
	// Expire ends it because its request held it too long (Node.Expire): it breaks, its GPU is free for other
	// functions, the function's work there is refused until Finish, and what it queued is stopped after grace.
	Expire(ctx context.Context, grace time.Duration, cause error) error
}

var _ DataPlane = (*Node)(nil)

// Hold implements DataPlane: Acquire (id and request are the caller's: in one process the binding is its own).
func (n *Node) Hold(ctx context.Context, name string, gpu int, source Source, _ string, _ bool) (Held, error) {
	b, err := n.Acquire(ctx, name, gpu, source)
	if err != nil {
		return nil, err
	}
	return nodeHeld{b}, nil
}

// nodeHeld is a Binding as the data plane's Held.
type nodeHeld struct{ *Binding }

func (b nodeHeld) Finish() error {
	err := b.Err()
	b.Release()
	return err
}

func (b nodeHeld) Expire(ctx context.Context, grace time.Duration, cause error) error {
	return b.n.Expire(ctx, b.Binding, grace, cause)
}
