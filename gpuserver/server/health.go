package server

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// GPU failures (issue 4): an executor takes a GPU out of service when a swap onto it fails, when a device error
// surfaces at a synchronising call of a function's stream, or on an explicit Node.MarkUnhealthy. The pool around
// the controller then keeps requests off it:
//
//   - the controller (which has no notion of health yet) may still bind a request to the failed GPU: the tracked
//     pool keeps that controller binding as a placeholder (the controller sees the GPU busy until the request
//     ends) and binds the request on the executors to a healthy GPU instead, from a healthy GPU's copy or from
//     the host image (re-placed); the binding the caller gets, and the GPU the remoting session runs on, are the
//     healthy one;
//   - swaps the controller decides onto the failed GPU are skipped by healthActuator, for the same reason;
//   - a pool that offers healthSetter (the controller hook asked for in the report) is told once, so that it
//     stops placing there at all;
//   - Status shows the GPU unhealthy (and the faas_gpu_gpu_healthy metric follows) with nothing resident there;
//   - a request whose binding was on the GPU when it failed gets errors from its CUDA calls (executor.ErrUnhealthy,
//     CUDA_ERROR_DEVICE_UNAVAILABLE through the shim), and its release answers an error saying the binding broke.

// healthSetter is what a pool may implement to stop placing requests on a GPU (and forget the copies it thinks
// are there). controller.Pool does not yet; the tracked pool re-places around it meanwhile.
type healthSetter interface {
	SetHealthy(gpu int, healthy bool) error
}

// healthActuator is the controller's actuator on the executors that skips swaps onto a failed GPU: the tracked
// pool re-places such a binding on a healthy GPU itself.
type healthActuator struct{ executor.Actuator }

var _ controller.Actuator = healthActuator{}

// SwapIn swaps onto a healthy GPU; onto a failed one (or one failing under the swap) it does nothing.
func (a healthActuator) SwapIn(ctx context.Context, function string, gpu int, from controller.Source) error {
	if !a.Node.Healthy(gpu) {
		return nil
	}
	err := a.Actuator.SwapIn(ctx, function, gpu, from)
	if errors.Is(err, executor.ErrUnhealthy) && !a.Node.Healthy(gpu) {
		return nil
	}
	return err
}

// noteHealth tells the inner pool (when it can take it) and the log about GPUs that failed since the last call.
func (t *trackedPool) noteHealth(ctx context.Context) {
	if t.node == nil {
		return
	}
	st := t.node.Status()
	t.mu.Lock()
	var failed []executor.Status
	for _, g := range st {
		if !g.Healthy && !t.failed[g.GPU] {
			t.failed[g.GPU] = true
			failed = append(failed, g)
		}
	}
	t.mu.Unlock()
	for _, g := range failed {
		t.log.ErrorContext(ctx, "gpu unhealthy: no more requests are placed there", "gpu", g.GPU, "err", g.Error)
		if hs, ok := t.Pool.(healthSetter); ok {
			if err := hs.SetHealthy(g.GPU, false); err != nil {
				t.log.ErrorContext(ctx, "pool: take the unhealthy gpu out of placement", "gpu", g.GPU, "err", err)
			}
		}
	}
}

// bindHealthy holds function on the executors for binding b: on b's GPU when it is healthy, else (re-placed) on
// a healthy GPU of the executors' choice, whose index, name and swap kind then replace b's.
func (t *trackedPool) bindHealthy(ctx context.Context, function string, b pool.Binding) (pool.Binding, *executor.Binding,
	error) {
	if t.node.Healthy(b.GPU) {
		held, err := t.node.Acquire(ctx, function, b.GPU, executor.Any)
		if err == nil || !errors.Is(err, executor.ErrUnhealthy) || t.node.Healthy(b.GPU) {
			return b, held, err
		}
	}
	t.noteHealth(ctx)
	copies, _, err := t.node.Resident(function)
	if err != nil {
		return b, nil, err
	}
	held, err := t.node.Acquire(ctx, function, -1, executor.Any)
	if err != nil {
		return b, nil, fmt.Errorf("re-place %q off unhealthy gpu %d: %w", function, b.GPU, err)
	}
	from := b.GPU
	b.GPU = held.GPU()
	if b.GPU < len(t.gpuNames) {
		b.GPUName = t.gpuNames[b.GPU]
	}
	switch {
	case slices.Contains(copies, b.GPU):
		b.Swap = controller.SwapNone
	case len(copies) > 0:
		b.Swap = controller.SwapNVLink
	default:
		b.Swap = controller.SwapPCIe
	}
	t.mu.Lock()
	t.replaced++
	t.mu.Unlock()
	t.log.WarnContext(ctx, "request re-placed off an unhealthy gpu", "function", function, "gpu", b.GPU,
		"unhealthy_gpu", from, "swap", b.Swap)
	return b, held, nil
}

// healthStatus marks the failed GPUs of st unhealthy, with nothing resident on them.
func (t *trackedPool) healthStatus(st *pool.Status) {
	if t.node == nil {
		return
	}
	for i := range st.GPUs {
		g := &st.GPUs[i]
		if g.Index >= t.node.GPUs() || t.node.Healthy(g.Index) {
			continue
		}
		g.Healthy, g.Resident = false, []string{}
		for j := range st.Functions {
			f := &st.Functions[j]
			f.Resident = slices.DeleteFunc(f.Resident, func(gpu int) bool { return gpu == g.Index })
		}
	}
}

// Replaced counts the requests the controller bound to an unhealthy GPU that were re-placed on a healthy one.
func (s *Server) Replaced() int64 {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.replaced
}
