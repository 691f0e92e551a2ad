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
// surfaces at a synchronising call of a function's stream, or on an explicit Node.MarkUnhealthy. The tracked pool
// tells the pool (controller.Pool.SetHealthy) before every acquire, at every release of a binding that broke and
// at every status, so the controller itself keeps requests off the GPU:
//
//   - the controller never places a request on it, forgets the copies it had there and plans swaps and evictions
//     on the healthy GPUs only; Status shows it unhealthy with nothing resident (and the faas_gpu_gpu_healthy
//     metric follows);
//   - a request whose binding was on the GPU when it failed gets errors from its CUDA calls (executor.ErrUnhealthy,
//     CUDA_ERROR_DEVICE_UNAVAILABLE through the shim), and its release answers an error wrapping
//     pool.ErrGPUUnhealthy (503 on the API): the binding broke;
//   - the one race left: a GPU fails after the executors were last asked and before the request holds its binding
//     (the pool's swap onto it, or the executor's hold there, fails with executor.ErrUnhealthy). The binding is
//     given back and the request bound again once the pool knows (Server.Replaced counts these);
//   - a pool that cannot be told (the fcfs pool) keeps binding the failed GPU: there the request is re-placed on
//     a healthy GPU by the executors (bindHealthy) and the status is corrected (healthStatus).

// healthSetter is what a pool implements to stop placing requests on a GPU (and forget the copies it thinks are
// there); controller.Pool does.
type healthSetter interface {
	SetHealthy(gpu int, healthy bool) error
}

// failedUnder reports whether err says a GPU failed under a binding being made.
func failedUnder(err error) bool {
	return errors.Is(err, executor.ErrUnhealthy) || errors.Is(err, pool.ErrGPUUnhealthy)
}

// noteHealth tells the inner pool (when it can take it) and the log about GPUs that failed since the last call.
func (t *trackedPool) noteHealth(ctx context.Context) {
	if t.node == nil {
		return
	}
	var down, failed []int
	for g := range t.node.GPUs() { // asked outside t.mu: the tracked pool never holds it into the executors
		if !t.node.Healthy(g) {
			down = append(down, g)
		}
	}
	if len(down) == 0 {
		return
	}
	t.mu.Lock()
	for _, g := range down {
		if !t.failed[g] {
			t.failed[g] = true
			failed = append(failed, g)
		}
	}
	t.mu.Unlock()
	if len(failed) == 0 {
		return
	}
	st := t.node.Status()
	for _, g := range failed {
		t.log.ErrorContext(ctx, "gpu unhealthy: no more requests are placed there", "gpu", g, "err", st[g].Error)
		if hs, ok := t.Pool.(healthSetter); ok {
			if err := hs.SetHealthy(g, false); err != nil {
				t.log.ErrorContext(ctx, "pool: take the unhealthy gpu out of placement", "gpu", g, "err", err)
			}
		}
	}
}

// bindHealthy holds function on the executors for binding b of a pool that cannot be told about failed GPUs: on
// b's GPU when it is healthy, else (re-placed) on a healthy GPU of the executors' choice, whose index, name and
// swap kind then replace b's; the pool's binding stays on the failed GPU as a placeholder.
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

// healthStatus marks the failed GPUs of st unhealthy, with nothing resident on them (for a pool that cannot be
// told).
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

// Replaced counts the acquires whose first binding was on a GPU that failed before the request held it (the race
// in health.go), bound again on a healthy GPU; with the fcfs pool, also those re-placed off a GPU it still binds.
func (s *Server) Replaced() int64 {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.replaced
}
