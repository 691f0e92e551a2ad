package server

import (
	"context"
	"errors"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// GPU failures: an executor takes a GPU out of service when a swap onto it fails, when a device error
// surfaces at a synchronising call of a function's stream, or on an explicit Node.MarkUnhealthy; with executor
// processes per tenant, also when the GPU fails the check the gpuserver runs after a tenant's fault there
// (tenant/health.go). A context fault (a tenant's kernel) never does, not even when it surfaces on the executors'
// own swap streams (executor.Node's processFaultLocked). The tracked pool
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
//     given back and the request bound again once the pool knows (Server.Replaced counts these).

// healthPool is a pool that can be told to stop placing requests on a GPU (and to forget the copies it thinks
// are there): controller.Pool and pool.FCFS.
type healthPool interface {
	pool.Pool
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
	for g := range t.node.GPUs() { // asked holding no lock: the tracked pool never holds one into the data plane
		if !t.node.Healthy(g) {
			down = append(down, g)
		}
	}
	if len(down) == 0 {
		return
	}
	t.health.mu.Lock()
	for _, g := range down {
		if !t.health.failed[g] {
			t.health.failed[g] = true
			failed = append(failed, g)
		}
	}
	t.health.mu.Unlock()
	if len(failed) == 0 {
		return
	}
	st := t.node.Status()
	if t.noHealthyGPU() { // nothing will ever serve the waiting acquires: fail them now (503), not at their timeout
		t.health.mu.Lock()
		for w := range t.health.waiting {
			w.cancel(pool.ErrNoHealthyGPU)
		}
		t.health.mu.Unlock()
	}
	for _, g := range failed {
		t.log.ErrorContext(ctx, "gpu unhealthy: no more requests are placed there", "gpu", g, "err", st[g].Error)
		if err := t.healthPool.SetHealthy(g, false); err != nil {
			t.log.ErrorContext(ctx, "pool: take the unhealthy gpu out of placement", "gpu", g, "err", err)
		}
	}
}

// Replaced counts the acquires whose first binding was on a GPU that failed before the request held it (the race
// in health.go), bound again on a healthy GPU.
func (s *Server) Replaced() int64 {
	s.pool.counts.mu.Lock()
	defer s.pool.counts.mu.Unlock()
	return s.pool.counts.replaced
}

// healthWatch is what the tracked pool knows of the GPUs' failures: those logged and told to the pool already, and
// the acquires waiting in the pool, failed at once when no GPU is left.
type healthWatch struct {
	mu      sync.Mutex
	failed  map[int]bool
	waiting map[*waiter]struct{}
}

func newHealthWatch() *healthWatch {
	return &healthWatch{failed: map[int]bool{}, waiting: map[*waiter]struct{}{}}
}

// waiter is an acquire waiting in the inner pool.
type waiter struct{ cancel context.CancelCauseFunc }

// wait counts w among the acquires waiting in the pool; waited uncounts it.
func (h *healthWatch) wait(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting[w] = struct{}{}
}

func (h *healthWatch) waited(w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.waiting, w)
}

// noHealthyGPU reports whether every GPU of the node's executors is out of service (false without executors).
func (t *trackedPool) noHealthyGPU() bool {
	if t.node == nil {
		return false
	}
	for g := range t.node.GPUs() {
		if t.node.Healthy(g) {
			return false
		}
	}
	return true
}
