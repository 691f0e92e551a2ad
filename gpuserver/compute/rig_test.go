package compute

import (
	"context"
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// manualClock is a clock only the test moves; SleepUntil waits until it has moved past t.
type manualClock struct {
	mu   sync.Mutex
	now  time.Time
	move chan struct{}
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Unix(1000, 0), move: make(chan struct{})}
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *manualClock) SleepUntil(ctx context.Context, t time.Time) error {
	for {
		c.mu.Lock()
		if !c.now.Before(t) {
			c.mu.Unlock()
			return ctx.Err()
		}
		move := c.move
		c.mu.Unlock()
		select {
		case <-move:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *manualClock) advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	close(c.move)
	c.move = make(chan struct{})
	return c.now
}

// rig is one timed virtual GPU (an H200) on a manual clock with its arbiter; the test issues the periods.
type rig struct {
	t    *testing.T
	clk  *manualClock
	dev  *sim.Backend
	arb  *Arbiter
	busy device.Function
	run  []*corunner
}

func newRig(t *testing.T) *rig {
	t.Helper()
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	clk := newManualClock()
	dev, err := sim.New(sim.Options{Node: node, TimeScale: 1, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	arb, err := NewArbiter(Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	mod, err := dev.LoadModule(0, kernels.PTX())
	if err != nil {
		t.Fatal(err)
	}
	busy, err := mod.Function("busy")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, clk: clk, dev: dev, arb: arb, busy: busy}
	t.Cleanup(func() {
		for _, c := range r.run {
			c.stop()
		}
		if err := dev.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return r
}

func busyArgs(d time.Duration) []byte {
	a := make([]byte, 8)
	binary.LittleEndian.PutUint64(a, uint64(d))
	return a
}

// corunner is a busy co-located binding: while on, it launches kernels of its length back to back through its gate.
type corunner struct {
	gate   *Gate
	st     device.Stream
	on     atomic.Bool
	parked atomic.Bool // off and waiting to be turned on
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func (r *rig) corunner(name string, request, limit float64, kernel time.Duration) *corunner {
	r.t.Helper()
	g, err := r.arb.Join(name, request, limit)
	if err != nil {
		r.t.Fatal(err)
	}
	raw, err := r.dev.NewStream(0)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := Gated(ctx, raw, raw.(device.ComputeMeter), g)
	if err != nil {
		r.t.Fatal(err)
	}
	c := &corunner{gate: g, st: st, wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	c.on.Store(true)
	r.run = append(r.run, c)
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			if !c.on.Load() {
				c.parked.Store(true)
				select {
				case <-c.wake:
				case <-ctx.Done():
				}
				c.parked.Store(false)
				continue
			}
			if err := st.Launch(r.busy, device.Dim3{X: 132}, device.Dim3{X: 256}, 0, busyArgs(kernel)); err != nil {
				if ctx.Err() == nil {
					c.err = err
				}
				return
			}
		}
	}()
	return c
}

func (c *corunner) set(on bool) {
	c.on.Store(on)
	if on {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (c *corunner) stop() {
	c.cancel()
	<-c.done
}

// quiet reports whether the co-runner has nothing more to do this period: it waits at its gate (or is off), and
// every launch it made was measured.
func (r *rig) quiet(c *corunner) bool {
	r.arb.mu.Lock()
	defer r.arb.mu.Unlock()
	c.gate.sampleLocked()
	measured := c.gate.admitted == c.gate.ops
	if c.on.Load() {
		return c.gate.waiting && c.gate.waitGen == r.arb.gen && measured
	}
	return c.parked.Load() && measured
}

// period waits until every co-runner is quiet, then moves the clock by one period and issues its tokens.
func (r *rig) period() {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, c := range r.run {
		for !r.quiet(c) {
			if c.err != nil {
				r.t.Fatalf("co-runner %s: %v", c.gate.binding, c.err)
			}
			select {
			case <-c.done:
				r.t.Fatalf("co-runner %s ended: %v", c.gate.binding, c.err)
			default:
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("co-runner %s never waited at its gate", c.gate.binding)
			}
			runtime.Gosched()
			time.Sleep(20 * time.Microsecond)
		}
	}
	r.arb.Tick(r.clk.advance(r.arb.Period()))
}

// used is the GPU time the co-runner's work occupied so far.
func (c *corunner) used() time.Duration {
	_, w := c.st.(device.ComputeMeter).ComputeWork()
	return w
}

func (c *corunner) share() (float64, State) {
	a := c.gate.a
	a.mu.Lock()
	defer a.mu.Unlock()
	return c.gate.share, c.gate.state
}
