package executor_test

import (
	"context"
	"encoding/binary"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// stallClock is a modelled clock that advances when slept on; once stalled, a sleep that would end after the
// stall point blocks until released (a copy that never finishes).
type stallClock struct {
	mu      sync.Mutex
	now     time.Time
	stall   time.Time // zero: never
	open    chan struct{}
	blocked int // sleeps blocked on the stall now
}

func (c *stallClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *stallClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	if c.stall.IsZero() || t.Before(c.stall) {
		if t.After(c.now) {
			c.now = t
		}
		c.mu.Unlock()
		return ctx.Err()
	}
	open := c.open
	c.blocked++
	c.mu.Unlock()
	defer func() { c.mu.Lock(); c.blocked--; c.mu.Unlock() }()
	select {
	case <-open:
		c.mu.Lock()
		if t.After(c.now) {
			c.now = t
		}
		c.mu.Unlock()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stalled is the number of sleeps blocked on the stall now.
func (c *stallClock) stalled() int { c.mu.Lock(); defer c.mu.Unlock(); return c.blocked }

// stallAfter makes sleeps ending more than d from now block until release.
func (c *stallClock) stallAfter(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stall, c.open = c.now.Add(d), make(chan struct{})
}

func (c *stallClock) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.stall.IsZero() {
		close(c.open)
		c.stall = time.Time{}
	}
}

// A kernel that touches only scratch memory runs while the model's swap-in is still copying: the fresh scratch
// segment is zeroed apart from the model's copies, so the kernel waits for its zeroing only, not for the whole
// swap (which, stalled here, never ends).
func TestScratchKernelDoesNotWaitForTheSwap(t *testing.T) {
	ctx := context.Background()
	clk := &stallClock{now: time.Unix(1000, 0)}
	r := newRig(t, 64<<20, sim.Options{Clock: clk, TimeScale: 1}, false)
	t.Cleanup(clk.release) // before the rig's cleanup: the stalled copies end
	initModel(t, r, "f", 0, 16<<20)
	must(t, r.node.Evict(ctx, "f", 0))
	clk.stallAfter(500 * time.Microsecond) // the 16 MiB copy (8 groups of 2 MiB at PCIe speed) never completes

	b, err := r.node.Acquire(ctx, "f", 0, executor.Host)
	must(t, err)
	defer b.Release()
	x, err := r.node.Alloc(ctx, "f", 2<<20) // scratch: allocated after the initialisation
	must(t, err)
	dc, err := r.node.Context("f", 0)
	must(t, err)
	mod, err := dc.LoadModule(kernels.PTX())
	must(t, err)
	fill, err := mod.Function("fill")
	must(t, err)
	s, err := r.node.Stream("f")
	must(t, err)
	args, err := device.PackArgs(fill.Params(), x, float32(2.5), uint32(256))
	must(t, err)
	must(t, s.Launch(fill, device.Dim3{X: 1}, device.Dim3{X: 256}, 0, args))
	out := make([]byte, 4*257)
	must(t, s.CopyDtoH(out, x))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.Synchronize(wctx); err != nil {
		t.Fatalf("a kernel on scratch waited for the model's swap: %v", err)
	}
	for i := range 257 {
		want := float32(2.5)
		if i == 256 {
			want = 0 // beyond the kernel's elements: the zeroed scratch
		}
		if v := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); v != want {
			t.Fatalf("scratch[%d] = %v, want %v", i, v, want)
		}
	}
}
