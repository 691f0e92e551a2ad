package executor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// stepClock is a clock the test moves: while held, time stands still at the held instant and every sleep waits;
// once released, a sleep returns at once and moves time to its deadline. Everything a round enqueues while held is
// enqueued at one instant, so the round's modelled times depend only on the model (links, kernels, stream order),
// never on how loaded the machine running the test is.
type stepClock struct {
	mu   sync.Mutex
	now  time.Time
	open chan struct{}
}

func newStepClock() *stepClock {
	c := &stepClock{now: time.Unix(0, 0), open: make(chan struct{})}
	close(c.open)
	return c
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *stepClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	open := c.open
	c.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	if t.After(c.now) {
		c.now = t
	}
	c.mu.Unlock()
	return nil
}

// hold stops time at least an hour after anything modelled so far (every stream's earlier work has ended) and
// returns that instant.
func (c *stepClock) hold() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Hour)
	c.open = make(chan struct{})
	return c.now
}

func (c *stepClock) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.open:
	default:
		close(c.open)
	}
}

// TestPipelinedSwapAndExecuteBeatsSerial is the guard of docs/bench/swap.md's pipelining table, in modelled time
// on the timed virtual GPU: a model of 16 MiB layers swapped in from the host, one kernel per layer that takes about
// its layer's PCIe copy (1.68 ms: the bench's linear at 5e9 FLOP/s; dry, from the profile, so that the test does not
// compute matrix products on the host), reading an activation buffer the function keeps (scratch, written back at
// eviction and restored at the swap-in). Pipelined (each kernel waits only for its layer) must take at most 0.8 of
// serial (every kernel waits for the whole model); the best possible is (1 + 1/n) / 2. It failed (pipelined/serial
// 1.00) while a kept scratch segment was restored behind the whole model on the host-to-device stream: the first
// kernel reads the activations, so it waited for every layer.
func TestPipelinedSwapAndExecuteBeatsSerial(t *testing.T) {
	for _, mib := range []uint64{64, 256} {
		t.Run(fmt.Sprintf("%dMiB", mib), func(t *testing.T) {
			serial, pipelined := swapAndExecute(t, mib<<20)
			ratio := pipelined.Seconds() / serial.Seconds()
			layers := float64(mib / 16)
			t.Logf("%d MiB (%g layers): serial %v, pipelined %v (modelled), pipelined/serial %.3f (best %.3f)",
				mib, layers, serial, pipelined, ratio, (1+1/layers)/2)
			if ratio > 0.8 {
				t.Fatalf("pipelined/serial %.3f > 0.8 (serial %v, pipelined %v): pipelining gains nothing", ratio,
					serial, pipelined)
			}
			if ratio < (1+1/layers)/2-0.02 {
				t.Fatalf("pipelined/serial %.3f is below the best possible %.3f: the measurement is wrong", ratio,
					(1+1/layers)/2)
			}
		})
	}
}

// layerPTX is a module with one kernel, layer(x, w), that the sim runs dry (its time from the profile).
const layerPTX = ".version 7.0\n.target sm_70\n.address_size 64\n" +
	".visible .entry layer(.param .u64 x, .param .u64 w)\n{ ret; }\n"

// swapAndExecute measures, in modelled time, the swap-in of a model of size bytes followed by its layers' kernels:
// serial (every kernel after the whole model) and pipelined (each kernel after its own layer).
func swapAndExecute(t *testing.T, size uint64) (serial, pipelined time.Duration) {
	const layerBytes = 16 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clk := newStepClock()
	node, err := topology.Preset("v100x4")
	must(t, err)
	// 1.68 ms a layer: the bench's linear (2 x 2048 x 2048 FLOP at 5e9 FLOP/s), about its 16 MiB PCIe copy.
	dev, err := sim.New(sim.Options{Node: node, Clock: clk, TimeScale: 1, Kernels: sim.KernelsDry,
		Profile: sim.Profile{Kernels: map[string]time.Duration{"layer": 1678 * time.Microsecond}}})
	must(t, err)
	mem, err := memory.New(dev, memory.Config{Share: 0.9, MaxBytesPerGPU: size + 64<<20,
		SlabChunks: memory.DefaultSlabChunks})
	must(t, err)
	repo, err := repository.Open(repository.Config{Dir: shmDir(t), Registrar: dev})
	must(t, err)
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, GroupBytes: 2 << 20})
	must(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		clk.release()
		if err := n.Close(cctx); err != nil {
			t.Error(err)
		}
		_ = repo.Close()
		_ = dev.Close(cctx)
	})

	const fn = "layers"
	must(t, n.Register(fn))
	b, err := n.Acquire(ctx, fn, 0, executor.Host)
	must(t, err)
	s, err := n.Stream(fn)
	must(t, err)
	host := make([]byte, layerBytes)
	var weights []device.Ptr
	for i := range size / layerBytes {
		p, err := n.Alloc(ctx, fn, layerBytes)
		must(t, err)
		host[0] = byte(i + 1)
		for k := 1; k < len(host); k *= 2 { // every layer its own bytes, filled without a loop per byte
			copy(host[k:], host[:k])
		}
		must(t, s.CopyHtoD(p, host))
		must(t, s.Synchronize(ctx))
		weights = append(weights, p)
	}
	must(t, n.Capture(ctx, fn))
	x, err := n.Alloc(ctx, fn, 16<<10) // the activations: scratch the function keeps
	must(t, err)
	must(t, s.CopyHtoD(x, host[:16<<10]))
	must(t, s.Synchronize(ctx))
	b.Release()

	dc, err := n.Context(fn, 0)
	must(t, err)
	mod, err := dc.LoadModule([]byte(layerPTX))
	must(t, err)
	layer, err := mod.Function("layer")
	must(t, err)

	round := func(waitAll bool) time.Duration {
		must(t, n.Evict(ctx, fn, 0)) // the scratch is written back; the next swap-in restores it
		held := clk.hold()
		b, err := n.Acquire(ctx, fn, 0, executor.Host)
		must(t, err)
		defer b.Release()
		s, err := n.Stream(fn)
		must(t, err)
		start, err := dc.NewTimedEvent()
		must(t, err)
		end, err := dc.NewTimedEvent()
		must(t, err)
		must(t, s.Record(start))
		if waitAll {
			must(t, s.(*executor.Stream).WaitAll())
		}
		for _, w := range weights {
			a, err := device.PackArgs(layer.Params(), x, w)
			must(t, err)
			must(t, s.Launch(layer, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, a))
		}
		must(t, s.Record(end))
		if got := clk.Now(); !got.Equal(held) {
			t.Fatalf("the clock moved while the round was enqueued (%v): the round is not at one instant",
				got.Sub(held))
		}
		clk.release()
		must(t, s.Synchronize(ctx))
		d, err := end.Elapsed(start)
		must(t, err)
		return d
	}
	round(true) // a first round: the activations' scratch gets its host copy at the eviction that follows
	serial = round(true)
	pipelined = round(false)
	must(t, mod.Unload())
	return serial, pipelined
}
