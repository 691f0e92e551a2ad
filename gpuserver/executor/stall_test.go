package executor_test

import (
	"context"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// An operation that waits on the device for one function (its swap to another GPU, another tenant claiming its GPU,
// the capture of its image) waits without the node's lock: another function's launches on another GPU go on
// meanwhile, with exact answers, and the operation completes exactly once the device has passed the work it waited
// for. Function a's stream holds a kernel that the stalled clock never lets end until the test releases it.
func TestSwapDoesNotStallAnotherFunctionsLaunches(t *testing.T) {
	for _, tc := range []struct {
		name    string
		capture bool // a is still initialising: the operation is its capture
		op      func(ctx context.Context, r *rig) error
		check   func(t *testing.T, r *rig, a model)
	}{
		{name: "swap to another gpu",
			op:    func(ctx context.Context, r *rig) error { return r.node.SwapIn(ctx, "a", 1, executor.Host) },
			check: func(t *testing.T, r *rig, a model) { verify(t, r, a, 1) }},
		{name: "another tenant claims the gpu",
			op: func(ctx context.Context, r *rig) error {
				must(t, r.node.Register("c.other"))
				b, err := r.node.Acquire(ctx, "c.other", 0, executor.Host)
				if err == nil {
					b.Release()
				}
				return err
			},
			check: func(t *testing.T, r *rig, a model) {
				if active := r.node.Active("a"); active != -1 {
					t.Fatalf("a active on gpu %d after another tenant claimed gpu 0", active)
				}
				b, err := r.node.Acquire(context.Background(), "a", 0, executor.Host)
				must(t, err)
				defer b.Release()
				verify(t, r, a, 0)
			}},
		{name: "capture", capture: true,
			op: func(ctx context.Context, r *rig) error { return r.node.Capture(ctx, "a") },
			check: func(t *testing.T, r *rig, a model) {
				must(t, r.node.Evict(context.Background(), "a", 0))
				must(t, r.node.SwapIn(context.Background(), "a", 1, executor.Host)) // from the captured image
				verify(t, r, a, 1)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clk := &stallClock{now: time.Unix(1000, 0)}
			r := newRig(t, 64<<20, sim.Options{Clock: clk, TimeScale: 1}, false)
			t.Cleanup(clk.release) // before the rig's cleanup: the stalled kernel ends

			// b runs on gpu 2 with its binding, stream and kernel at hand before a's operation starts.
			b := initModel(t, r, "b", 2, 4096, 4000, 4000)
			bind, err := r.node.Acquire(ctx, "b", 2, executor.Host)
			must(t, err)
			defer bind.Release()
			scratch, err := r.node.Alloc(ctx, "b", 4000)
			must(t, err)
			checkVectorAdd(t, ctx, r, "b", 2, b, scratch)

			// a, on gpu 0, has a kernel queued that ends only when the clock is released.
			var a model
			if tc.capture {
				a = initUncaptured(t, r, "a", 0, 4096, 3<<20)
			} else {
				a = initModel(t, r, "a", 0, 4096, 3<<20)
			}
			clk.stallAfter(time.Second)
			ab, err := r.node.Acquire(ctx, "a", 0, executor.Host)
			must(t, err)
			launchBusy(t, r, "a", 0, time.Hour)
			ab.Release()

			done := make(chan error, 1)
			go func() { done <- tc.op(ctx, r) }()
			testkit.Eventually(t, 30*time.Second, "a's operation waits on the device", func() bool { return clk.stalled() > 0 })

			launched := make(chan struct{})
			go func() {
				defer close(launched)
				for range 10 {
					checkVectorAdd(t, ctx, r, "b", 2, b, scratch)
				}
			}()
			select {
			case <-launched:
			case <-time.After(20 * time.Second):
				clk.release()
				<-launched
				t.Fatal("b's launches waited for a's operation on another gpu")
			}
			select {
			case err := <-done:
				t.Fatalf("a's operation returned (%v) before the device passed the kernel it waits for", err)
			default:
			}
			clk.release()
			must(t, <-done)
			tc.check(t, r, a)
		})
	}
}

// initUncaptured is initModel without the capture: the function is still initialising.
func initUncaptured(t *testing.T, r *rig, name string, gpu int, sizes ...int) model {
	t.Helper()
	return initBlocks(t, r, name, gpu, false, sizes...)
}

// launchBusy queues the sim's busy kernel (d of GPU time) on fn's stream.
func launchBusy(t *testing.T, r *rig, fn string, gpu int, d time.Duration) {
	t.Helper()
	s, err := r.node.Stream(fn)
	must(t, err)
	dctx, err := r.node.Context(fn, gpu)
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	busy, err := mod.Function("busy")
	must(t, err)
	args, err := device.PackArgs(busy.Params(), uint64(d.Nanoseconds()))
	must(t, err)
	must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, args))
}
