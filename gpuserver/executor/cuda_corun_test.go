package executor_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestCUDACoRunningFunctionsGetTheirShares (GPU suite, step 7): two functions bound on one GPU at once, each on a
// stream of its own in one executor (co-runners of one tenant), run vector_add on 1M elements in batches of 8,
// each batch synchronised: alone first, then together. It prints each one's achieved share (its rate together
// over its rate alone), the sum, and each batch's p50 and p98 latency, alone and together: what the driver does
// with two streams of a process (overlap, or time-slicing) when nothing gates them. A compute share cannot be
// enforced on the real driver yet (its streams do not measure their GPU time, device.ComputeMeter): a function
// granted a share is refused its stream (compute.ErrNotMetered) rather than run unenforced, which it checks; the
// gpuserver therefore binds shared functions exclusively on a real GPU (gpuserver/server/sharing.go).
func TestCUDACoRunningFunctionsGetTheirShares(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	dev, err := cuda.Open("")
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CUDA=1 but the driver cannot be opened: %v", err)
	}
	r := newRigOn(t, dev, false)
	ctx := context.Background()
	const n = 1 << 20
	type runner struct {
		name  string
		s     device.Stream
		va    device.Function
		args  []byte
		batch []time.Duration
	}
	var rs []*runner
	for _, fn := range []string{"a", "b"} {
		m := initModel(t, r, fn, 0, 4*n, 4*n)
		b, err := r.node.Acquire(ctx, fn, 0, executor.Host)
		must(t, err)
		t.Cleanup(b.Release)
		out, err := r.node.Alloc(ctx, fn, 4*n)
		must(t, err)
		s, err := r.node.Stream(fn)
		must(t, err)
		dctx, err := r.node.Context(fn, 0)
		must(t, err)
		mod, err := dctx.LoadModule(kernels.PTX())
		must(t, err)
		t.Cleanup(func() { _ = mod.Unload() })
		va, err := mod.Function("vector_add")
		must(t, err)
		args, err := device.PackArgs(va.Params(), m.blocks[0], m.blocks[1], out, uint32(n))
		must(t, err)
		rs = append(rs, &runner{name: fn, s: s, va: va, args: args})
	}
	// run launches batches on each runner of who for d; each runner's batches per second
	run := func(who []*runner, d time.Duration) []float64 {
		rates := make([]float64, len(who))
		var wg sync.WaitGroup
		for i, x := range who {
			x.batch = x.batch[:0]
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				for time.Since(start) < d {
					t0 := time.Now()
					for range 8 {
						if err := x.s.Launch(x.va, device.Dim3{X: n / 256}, device.Dim3{X: 256}, 0, x.args); err != nil {
							t.Error(err)
							return
						}
					}
					if err := x.s.Synchronize(ctx); err != nil {
						t.Error(err)
						return
					}
					x.batch = append(x.batch, time.Since(t0))
				}
				rates[i] = float64(len(x.batch)) / time.Since(start).Seconds()
			}()
		}
		wg.Wait()
		return rates
	}
	pct := func(l []time.Duration, p float64) time.Duration {
		s := slices.Clone(l)
		slices.Sort(s)
		if len(s) == 0 {
			return 0
		}
		return s[min(len(s)-1, int(p/100*float64(len(s))))]
	}
	run(rs, 200*time.Millisecond) // warm
	alone := make([]float64, len(rs))
	aloneLat := make([][2]time.Duration, len(rs))
	for i, x := range rs {
		alone[i] = run([]*runner{x}, time.Second)[0]
		aloneLat[i] = [2]time.Duration{pct(x.batch, 50), pct(x.batch, 98)}
	}
	together := run(rs, 2*time.Second)
	sum := 0.0
	for i, x := range rs {
		share := together[i] / alone[i]
		sum += share
		t.Logf("%s: alone %.1f batches/s (p50 %v, p98 %v), co-running %.1f/s (p50 %v, p98 %v): achieved share %.3f",
			x.name, alone[i], aloneLat[i][0], aloneLat[i][1], together[i], pct(x.batch, 50), pct(x.batch, 98), share)
		if share < 0.2 {
			t.Errorf("%s got %.3f of its alone rate beside the other: starved", x.name, share)
		}
	}
	t.Logf("achieved shares sum to %.3f (above 1: the two streams overlap on the GPU; 1: time-sliced)", sum)

	// a share granted on the real driver is refused, never run unenforced
	grant := compute.Grant{Binding: "a", Request: 0.5, Limit: 0.5, Share: 0.5, State: compute.StateIdle}
	_, err = r.node.ComputeShares(ctx, compute.Allotment{GPU: 0, Grants: []compute.Grant{grant}})
	must(t, err)
	if _, err := r.node.Stream("a"); !errors.Is(err, compute.ErrNotMetered) {
		t.Errorf("a's stream with a share on the real driver: %v, want compute.ErrNotMetered", err)
	}
}
