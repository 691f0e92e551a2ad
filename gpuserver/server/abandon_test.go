package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// bigPy is faultyPy with a model of 64 MiB besides its vectors, so that swapping it in takes a while on the timed
// simulated GPU.
var bigPy = strings.Replace(faultyPy, "n = 1024\n", "n = 1024\nbig = cuda.alloc(64 << 20)\ncuda.htod(big, b\"\\x01\" * (64 << 20))\n", 1)

// TestAcquireGivenUpInItsHoldIsUndone, with an executor process per tenant on a timed simulated node: the data
// plane dropped a function's copy behind the controller's back, so the next request's hold swaps the model in from
// the host image, which takes longer than the request waits. Its acquire fails with its deadline; the hold its
// executor was running is undone with it: the GPU is free, the failed acquire counts as no request served, a hold
// of the function on another GPU binds (a binding left in the executor made it "in use on another gpu"), and a
// request after it computes the right answer.
//
// The same in one process (--tenant-isolation none), where the first request ends the initialisation before it
// queues: the acquire fails, its binding (if the pool made it) is counted as none served, and nothing stays held.
func TestAcquireGivenUpInItsHoldIsUndone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a Python process through the shim and an executor process")
	}
	t.Run("executor-process", func(t *testing.T) {
		tc, _ := tenantConfig(t)
		testAcquireGivenUp(t, tc)
	})
	t.Run("in-process", func(t *testing.T) { testAcquireGivenUp(t, nil) })
}

func testAcquireGivenUp(t *testing.T, tc *TenantConfig) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc, SimTimeScale: 200})
	defer stop(t, s)
	const fn, want = "big.ns1", "sum 1.0496e+06"
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 96 << 20}); err != nil {
		t.Fatal(err)
	}
	p := startFn(t, s, fn, bigPy)
	// Its initialisation's implicit binding is given up once the copy it queued ended and its calls went idle.
	testkit.Eventually(t, time.Minute, "the initialisation's binding released", func() bool {
		return functionStatus(ctx, t, s, fn).Running == 0
	})

	// The first request's hold ends the function's initialisation in its executor: its 64 MiB model is read back
	// into its image, on the timed GPU longer than the request waits.
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	start := time.Now()
	b, err := s.Pool().Acquire(short, fn)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an acquire whose hold captures 64 MiB on the timed GPU, within 100ms: %+v %v", b, err)
	}
	t.Logf("the acquire failed after %s: %v", time.Since(start), err)

	for _, g := range s.Pool().Status(ctx).GPUs {
		if g.Busy {
			t.Errorf("gpu %d busy after the acquire failed: %+v", g.Index, g)
		}
	}
	f := functionStatus(ctx, t, s, fn)
	if f.Served != 0 || f.OnTime != 0 || f.Running != 0 || len(f.Resident) != 1 {
		t.Errorf("after the failed acquire: %+v", f)
	}
	var dp executor.DataPlane = s.pool.node
	gpu := f.Resident[0]
	other := (gpu + 1) % dp.GPUs()
	h, err := dp.Hold(ctx, fn, other, executor.Any, "probe", true)
	if err != nil {
		t.Fatalf("a hold of %s on gpu %d after the one given up on gpu %d: %v", fn, other, gpu, err)
	}
	if err := h.Finish(); err != nil {
		t.Fatalf("release the probe: %v", err)
	}
	if l, _, err := request(ctx, s, p, fn, "good"); l != want || err != nil {
		t.Fatalf("a request after the one given up: %q %v\n%s", l, err, p.Stderr())
	}
	if f := functionStatus(ctx, t, s, fn); f.Served != 1 {
		t.Errorf("served after one request: %+v", f)
	}
}
