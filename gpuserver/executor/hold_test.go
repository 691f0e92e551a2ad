package executor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestExpiredBindingStopsItsWork: a request holds its binding too long with a hundred kernels queued on its GPU
// (each one blocks on the simulated clock until the test opens it). Expire breaks the binding, refuses the
// function's work until the binding is released, lets another tenant onto the GPU at once, and, when the queued
// work has not finished within the grace, tears the function's context down so that the queued kernels never run
// (only the one running finishes). After the release the function runs again, its model back from its image.
func TestExpiredBindingStopsItsWork(t *testing.T) {
	ctx := context.Background()
	clk := newGateClock()
	r := newRig(t, 64<<20, sim.Options{Clock: clk, TimeScale: 1}, true)
	t.Cleanup(clk.release)
	clk.release()
	m := initModel(t, r, "hog", 0, 4<<20)
	clk.mu.Lock()
	clk.open, clk.asleep = make(chan struct{}), 0
	clk.mu.Unlock()

	b, err := r.node.Acquire(ctx, "hog", 0, executor.Host)
	must(t, err)
	s, err := r.node.Stream("hog")
	must(t, err)
	dctx, err := r.node.Context("hog", 0)
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	fill, err := mod.Function("fill")
	must(t, err)
	args, err := device.PackArgs(fill.Params(), m.blocks[0], float32(1), uint32(1024))
	must(t, err)
	const queued = 100
	for range queued {
		must(t, s.Launch(fill, device.Dim3{X: 4}, device.Dim3{X: 256}, 0, args))
	}
	done := make(chan error, 1)
	go func() {
		done <- r.node.Expire(ctx, b, 50*time.Millisecond, errors.New("held longer than the test allows"))
	}()

	testkit.Eventually(t, 30*time.Second, "the function's work refused", func() bool {
		return errors.Is(r.node.Usable("hog"), executor.ErrHoldExpired)
	})
	if err := b.Err(); !errors.Is(err, executor.ErrBroken) || !errors.Is(err, executor.ErrHoldExpired) {
		t.Fatalf("the expired binding: %v, want ErrBroken and ErrHoldExpired", err)
	}
	if _, err := r.node.Alloc(ctx, "hog", 4096); !errors.Is(err, executor.ErrHoldExpired) {
		t.Fatalf("allocating under an expired binding: %v", err)
	}
	// Another tenant cannot have the GPU while the hog's work may still run (its kernels could reach the memory
	// mapped for the newcomer): it is told at once, without waiting under the node's lock.
	must(t, r.node.Register("next"))
	must(t, r.node.SetTenant(ctx, "next", "namespace/other"))
	if _, err := r.node.Acquire(ctx, "next", 0, executor.Host); !errors.Is(err, executor.ErrBusy) {
		t.Fatalf("another tenant while the expiry clears the gpu: %v, want ErrBusy", err)
	}
	// The queued kernels did not finish within the grace: the context goes, then the running kernel may end.
	testkit.Eventually(t, 30*time.Second, "the hog's context torn down", func() bool {
		c, err := r.node.Context("hog", 0)
		return err == nil && c != dctx
	})
	clk.release()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Expire did not return")
	}
	if ran := clk.sleeping(); ran > 2 {
		t.Fatalf("%d of %d queued kernels ran after the expiry, want at most the one running", ran, queued)
	}
	// Tearing the context down to stop the work is no fault of the tenant's (an executor process ends after one).
	if n := r.node.Status()[0].ContextFaults; n != 0 {
		t.Fatalf("stopping the expired work counted %d context faults, want none", n)
	}
	// Once the expiry returned, the GPU is the other tenant's for the asking, the hog's binding still unreleased.
	nb, err := r.node.Acquire(ctx, "next", 0, executor.Host)
	if err != nil {
		t.Fatalf("another tenant after the expiry: %v", err)
	}
	nb.Release()
	b.Release()
	if err := r.node.Usable("hog"); err != nil {
		t.Fatalf("after the release: %v", err)
	}
	b, err = r.node.Acquire(ctx, "hog", 0, executor.Host)
	must(t, err)
	verify(t, r, m, 0)

	// An idle hog (nothing queued) expires at once, and the other tenant gets the GPU before the hog releases.
	must(t, r.node.Expire(ctx, b, time.Minute, errors.New("held longer than the test allows")))
	nb, err = r.node.Acquire(ctx, "next", 0, executor.Host)
	if err != nil {
		t.Fatalf("another tenant after an idle binding expired: %v", err)
	}
	nb.Release()
	b.Release()
	b, err = r.node.Acquire(ctx, "hog", 0, executor.Host)
	must(t, err)
	verify(t, r, m, 0)
	b.Release()
}

// TestExpiredBindingLeavesOtherRequestsServed: once a request's binding has expired (its request still holding it),
// the function's other requests are bound and their work runs, reading the function's model exactly; the function's
// work outside a binding is refused while none is live and the expired one is not released, and accepted again
// after the release. Before, every new request of the function was refused (ErrHoldExpired, answered 500) until the
// expired request released.
func TestExpiredBindingLeavesOtherRequestsServed(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, true)
	m := initModel(t, r, "hog", 0, 4<<20)
	held, err := r.node.Acquire(ctx, "hog", 0, executor.Host)
	must(t, err)
	must(t, r.node.EndInit(ctx, "hog"))
	must(t, r.node.Expire(ctx, held, time.Minute, errors.New("held longer than the test allows")))
	if err := r.node.Usable("hog"); !errors.Is(err, executor.ErrHoldExpired) {
		t.Fatalf("the function's work without a live binding after the expiry: %v, want ErrHoldExpired", err)
	}
	for i := range 3 {
		if err := r.node.EndInit(ctx, "hog"); err != nil {
			t.Fatalf("request %d after the expiry, the end of initialisation: %v", i, err)
		}
		b, err := r.node.Acquire(ctx, "hog", -1, executor.Host)
		if err != nil {
			t.Fatalf("request %d after the expiry: %v, want it bound", i, err)
		}
		verify(t, r, m, b.GPU())
		if err := b.Err(); err != nil {
			t.Fatalf("request %d after the expiry: its binding %v", i, err)
		}
		b.Release()
	}
	if err := r.node.Usable("hog"); !errors.Is(err, executor.ErrHoldExpired) {
		t.Fatalf("the function's work without a live binding, the expired one unreleased: %v", err)
	}
	held.Release()
	if err := r.node.Usable("hog"); err != nil {
		t.Fatalf("after the expired binding's release: %v", err)
	}
}
