package sim_test

import (
	"context"
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// busyArgs is the argument buffer of busy(d).
func busyArgs(d time.Duration) []byte {
	a := make([]byte, 8)
	binary.LittleEndian.PutUint64(a, uint64(d))
	return a
}

func busyKernel(t *testing.T, b *sim.Backend, gpu int) device.Function {
	t.Helper()
	mod, err := b.LoadModule(gpu, kernels.PTX())
	must(t, err)
	f, err := mod.Function("busy")
	must(t, err)
	return f
}

// In the timed mode the kernels of all streams of a GPU take turns on its compute engine: two streams with two
// 100 us kernels each finish after 400 us of modelled time, not 200.
func TestTimedKernelsShareTheGPU(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := newSim(t, sim.Options{Clock: clk, TimeScale: 1})
	busy := busyKernel(t, b, 0)
	s1, _ := b.NewStream(0)
	s2, _ := b.NewStream(0)
	other, _ := b.NewStream(1) // another GPU runs at the same time
	start := clk.Now()
	for _, s := range []device.Stream{s1, s2, s1, s2} {
		must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(100*time.Microsecond)))
	}
	busy1 := busyKernel(t, b, 1)
	must(t, other.Launch(busy1, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(300*time.Microsecond)))
	for _, s := range []device.Stream{s1, s2, other} {
		must(t, s.Synchronize(ctx))
	}
	if got := clk.Now().Sub(start); got != 400*time.Microsecond {
		t.Fatalf("four 100 us kernels on one GPU and one of 300 us on another took %v of modelled time, want 400us",
			got)
	}
}

// An event recorded after a kernel completes at the kernel's modelled end, not when the stream reached it.
func TestTimedEventCompletesAtModelledTime(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := newSim(t, sim.Options{Clock: clk, TimeScale: 1})
	busy := busyKernel(t, b, 0)
	s, _ := b.NewStream(0)
	e0, _ := b.NewTimedEvent(0)
	e1, _ := b.NewTimedEvent(0)
	must(t, s.Record(e0))
	must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(time.Millisecond)))
	must(t, s.Record(e1))
	// the stream reaches the record at once; the clock stands still until someone sleeps on it, so the event
	// must stay incomplete however long we look
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if done, _ := e1.Query(); done {
			t.Fatal("the event after a 1 ms kernel completed before the clock reached the kernel's end")
		}
	}
	must(t, e1.Synchronize(ctx))
	if done, err := e1.Query(); !done || err != nil {
		t.Fatalf("after Synchronize: query %v %v", done, err)
	}
	d, err := e1.Elapsed(e0)
	must(t, err)
	if d != time.Millisecond {
		t.Fatalf("elapsed %v around a 1 ms kernel", d)
	}
}

// A stream that waits for an event of another stream starts its next work when that event completes in modelled
// time: a kernel after a wait for a 12 MiB copy ends at the copy's end plus its own time.
func TestTimedStreamWaitAdvancesModelledTime(t *testing.T) {
	ctx := context.Background()
	node, _ := topology.Preset("v100x4")
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := newSim(t, sim.Options{Node: node, Clock: clk, TimeScale: 1})
	busy := busyKernel(t, b, 0)
	p := mapOn(t, b, 0, 12<<20)
	copyS, _ := b.NewStream(0)
	compS, _ := b.NewStream(0)
	ev, _ := b.NewEvent(0)
	start := clk.Now()
	must(t, compS.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(0))) // the stream is live
	must(t, copyS.CopyHtoD(p, make([]byte, 12<<20)))
	must(t, copyS.Record(ev))
	must(t, compS.Wait(ev))
	must(t, compS.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(10*time.Microsecond)))
	done, _ := b.NewTimedEvent(0)
	must(t, compS.Record(done))
	must(t, compS.Synchronize(ctx))
	want := node.TransferTime(12<<20, topology.HostPath(0), nil) + 10*time.Microsecond
	if got := clk.Now().Sub(start); got != want {
		t.Fatalf("a 10 us kernel after waiting for a 12 MiB copy ended after %v of modelled time, want %v", got, want)
	}
}

// Dry kernels take the profile's time: by name, else the profile's launch time.
func TestTimedProfileGivesDryKernelsTheirTime(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := newSim(t, sim.Options{Clock: clk, TimeScale: 1, Kernels: sim.KernelsDry, Profile: sim.Profile{
		Kernels: map[string]time.Duration{"gemm": 70 * time.Microsecond}, Launch: 20 * time.Microsecond}})
	mod, err := b.LoadModule(0, []byte(".version 7.0\n.target sm_70\n.address_size 64\n"+
		".visible .entry gemm(.param .u64 a)\n{ ret; }\n.visible .entry softmax(.param .u64 a)\n{ ret; }\n"))
	must(t, err)
	gemm, _ := mod.Function("gemm")
	softmax, _ := mod.Function("softmax")
	s, _ := b.NewStream(0)
	start := clk.Now()
	for _, f := range []device.Function{gemm, softmax, gemm} {
		must(t, s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, make([]byte, 8)))
	}
	must(t, s.Synchronize(ctx))
	if got := clk.Now().Sub(start); got != 160*time.Microsecond {
		t.Fatalf("two 70 us kernels and one of the default 20 us took %v", got)
	}
}

// On the wall clock a synchronize returns at the modelled end of the work, not before.
func TestTimedSynchronizeOnTheWallClock(t *testing.T) {
	b := newSim(t, sim.Options{TimeScale: 1})
	busy := busyKernel(t, b, 0)
	s, _ := b.NewStream(0)
	start := time.Now()
	for range 20 {
		must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(100*time.Microsecond)))
	}
	must(t, s.Synchronize(context.Background()))
	if got := time.Since(start); got < 2*time.Millisecond {
		t.Fatalf("twenty 100 us kernels synchronized after %v", got)
	}
}

// heldClock is a fake clock whose sleeps wait until the test lets them go; the test may move time on meanwhile, as
// a machine too loaded to run the sim's goroutines on time does.
type heldClock struct {
	mu     sync.Mutex
	now    time.Time
	asleep int
	open   chan struct{}
}

func (c *heldClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *heldClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	c.asleep++
	open := c.open
	c.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	return nil
}

// An event's time is when the work before it ends in modelled time, not when the stream's goroutine got to it: a
// stream that reaches its record a second late (the machine was loaded) still records the copy's modelled end,
// and the elapsed time around a 12 MiB copy is the copy's time. (It was the late wall-clock instant: pipelining
// on the timed virtual GPU measured as no gain under load.)
func TestTimedEventTimeIsModelledWhenTheStreamIsLate(t *testing.T) {
	ctx := context.Background()
	node, _ := topology.Preset("v100x4")
	clk := &heldClock{now: time.Unix(1000, 0), open: make(chan struct{})}
	b := newSim(t, sim.Options{Node: node, Clock: clk, TimeScale: 1})
	p := mapOn(t, b, 0, 12<<20)
	s, _ := b.NewStream(0)
	e0, _ := b.NewTimedEvent(0)
	e1, _ := b.NewTimedEvent(0)
	must(t, s.Record(e0))
	must(t, s.CopyHtoD(p, make([]byte, 12<<20)))
	must(t, s.Record(e1))
	deadline := time.Now().Add(20 * time.Second)
	for {
		clk.mu.Lock()
		asleep := clk.asleep
		clk.mu.Unlock()
		if asleep > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the copy never slept on the clock")
		}
		time.Sleep(time.Millisecond)
	}
	clk.mu.Lock()
	clk.now = clk.now.Add(time.Second) // the copy's goroutine wakes a second late
	close(clk.open)
	clk.mu.Unlock()
	must(t, e1.Synchronize(ctx))
	d, err := e1.Elapsed(e0)
	must(t, err)
	if want := node.TransferTime(12<<20, topology.HostPath(0), nil); d != want {
		t.Fatalf("elapsed %v around a 12 MiB copy whose stream woke a second late, want the copy's %v", d, want)
	}
}

// Options.LaunchCPU is spent by each launch on the calling thread, as a real driver's cuLaunchKernel is: five
// launches at 2 ms each take at least 10 ms of that thread's CPU before they return, though the kernels take none.
func TestLaunchCPUIsSpentOnTheCallingThread(t *testing.T) {
	b := newSim(t, sim.Options{TimeScale: 1, LaunchCPU: 2 * time.Millisecond})
	busy := busyKernel(t, b, 0)
	s, _ := b.NewStream(0)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ru unix.Rusage
		must(t, unix.Getrusage(unix.RUSAGE_THREAD, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	for range 5 {
		must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(0)))
	}
	if got := cpu() - before; got < 9500*time.Microsecond {
		t.Fatalf("five launches at 2 ms of launch CPU spent %v of the calling thread's CPU", got)
	}
	must(t, s.Synchronize(context.Background()))
	if _, err := sim.New(sim.Options{Node: b.Node(), LaunchCPU: -time.Microsecond}); err == nil {
		t.Fatal("a negative LaunchCPU was accepted")
	}
}
