package executor_test

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/bench/swap/torchlayout"
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

// TestPipelinedSwapAndExecuteBeatsSerial is the guard of docs/bench/swap.md's pipelining tables, in modelled time
// on the timed virtual GPU: a model swapped in from the host, one kernel per tensor reading it and an activation
// buffer the function keeps (scratch, written back at eviction and restored at the swap-in). Pipelined (each kernel
// waits only for its tensor's segment) must take at most the row's threshold of serial (every kernel waits for the
// whole model), and no less than the best the model allows (torchlayout.Model.Best, less 0.02).
//
// The rows: ResNet-18 (64 MiB) and ResNet-152 as a PyTorch function allocates them (the caching allocator's 2 and
// 20 MiB segments, package torchlayout), their kernels' times shared out by their arithmetic so that the whole pass
// takes the model's PCIe copy time (best 0.53 and 0.54), threshold 0.6; and the bench's synthetic models of 16 MiB
// layers, one kernel per layer taking about its layer's copy (1.68 ms, the bench's linear at 5e9 FLOP/s), whose
// best is (1 + 1/n) / 2 (0.625 at 64 MiB), threshold 0.8. Kernels are dry, their times from the profile, so the
// test computes nothing on the host. It failed on every row (pipelined/serial 1.00) while a kept scratch segment
// was restored behind the whole model on the host-to-device stream: the first kernel reads the activations, so it
// waited for every layer.
func TestPipelinedSwapAndExecuteBeatsSerial(t *testing.T) {
	node, err := topology.Preset("v100x4")
	must(t, err)
	const group = 2 << 20
	copyTime := func(bytes uint64) time.Duration { // the swap's groups on host -> GPU 0, one after another
		var d time.Duration
		for off := uint64(0); off < bytes; off += group {
			d += node.TransferTime(min(group, bytes-off), topology.HostPath(0), nil)
		}
		return d
	}
	type row struct {
		name      string
		model     torchlayout.Model
		kernel    []time.Duration // per tensor; 0: the sim's launch latency (a dry kernel not in the profile)
		threshold float64
	}
	var rows []row
	for _, depth := range []int{18, 152} {
		m, err := torchlayout.ResNet(depth)
		must(t, err)
		c, k := copyTime(m.Bytes()), make([]time.Duration, len(m.Tensors))
		for j, tn := range m.Tensors {
			k[j] = time.Duration(float64(c) * tn.FLOPs / m.FLOPs())
		}
		rows = append(rows, row{m.Name, m, k, 0.6})
	}
	for _, mib := range []uint64{64, 256} {
		m := torchlayout.Model{Name: fmt.Sprintf("%d MiB of 16 MiB layers", mib)}
		var k []time.Duration
		for i := range int(mib / 16) {
			m.Segments = append(m.Segments, 16<<20)
			m.Tensors = append(m.Tensors, torchlayout.Tensor{Name: fmt.Sprint(i), Bytes: 16 << 20, Segment: i})
			k = append(k, 1678*time.Microsecond)
		}
		rows = append(rows, row{m.Name, m, k, 0.8})
	}
	for _, r := range rows {
		t.Run(strings.ReplaceAll(r.name, " ", "_"), func(t *testing.T) {
			serial, pipelined := swapAndExecute(t, node, r.model, r.kernel)
			ratio := pipelined.Seconds() / serial.Seconds()
			copies := make([]time.Duration, len(r.model.Segments))
			for i, b := range r.model.Segments {
				copies[i] = copyTime(b)
			}
			kernels := make([]time.Duration, len(r.kernel))
			for j, d := range r.kernel {
				kernels[j] = cmp.Or(d, 5*time.Microsecond)
			}
			bp, bs := r.model.Best(copies, kernels)
			best := bp.Seconds() / bs.Seconds()
			t.Logf("%s (%d MiB, %d segments, %d kernels): serial %v, pipelined %v (modelled), pipelined/serial %.3f "+
				"(best %.3f)", r.name, r.model.Bytes()>>20, len(r.model.Segments), len(r.model.Tensors), serial,
				pipelined, ratio, best)
			if ratio > r.threshold {
				t.Fatalf("pipelined/serial %.3f > %g (serial %v, pipelined %v, best %.3f): pipelining gains "+
					"too little", ratio, r.threshold, serial, pipelined, best)
			}
			if ratio < best-0.02 {
				t.Fatalf("pipelined/serial %.3f is below the best possible %.3f: the measurement is wrong", ratio, best)
			}
		})
	}
}

// swapAndExecute measures, in modelled time, the swap-in of m (its segments allocated by the function, filled
// before the capture) followed by one dry kernel per tensor, kernel[j] long (the sim's launch latency where 0):
// serial (every kernel after the whole model) and pipelined (each kernel after its own segment).
func swapAndExecute(t *testing.T, node topology.Node, m torchlayout.Model, kernel []time.Duration) (serial,
	pipelined time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clk := newStepClock()
	// A module of one dry kernel per tensor, k<j>(x, w), its time from the profile.
	var ptx strings.Builder
	ptx.WriteString(".version 7.0\n.target sm_70\n.address_size 64\n")
	profile := map[string]time.Duration{}
	for j, d := range kernel {
		fmt.Fprintf(&ptx, ".visible .entry k%d(.param .u64 x, .param .u64 w)\n{ ret; }\n", j)
		if d > 0 {
			profile[fmt.Sprintf("k%d", j)] = d
		}
	}
	dev, err := sim.New(sim.Options{Node: node, Clock: clk, TimeScale: 1, Kernels: sim.KernelsDry,
		Profile: sim.Profile{Kernels: profile}})
	must(t, err)
	mem, err := memory.New(dev, memory.Config{Share: 0.9, MaxBytesPerGPU: m.Bytes() + 64<<20,
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
	var segs []device.Ptr
	for i, size := range m.Segments {
		p, err := n.Alloc(ctx, fn, size)
		must(t, err)
		host := make([]byte, size)
		host[0] = byte(i + 1)
		for k := 1; k < len(host); k *= 2 { // every segment its own bytes, filled without a loop per byte
			copy(host[k:], host[:k])
		}
		must(t, s.CopyHtoD(p, host))
		must(t, s.Synchronize(ctx))
		segs = append(segs, p)
	}
	must(t, n.Capture(ctx, fn))
	x, err := n.Alloc(ctx, fn, 16<<10) // the activations: scratch the function keeps
	must(t, err)
	must(t, s.CopyHtoD(x, make([]byte, 16<<10)))
	must(t, s.Synchronize(ctx))
	b.Release()

	dc, err := n.Context(fn, 0)
	must(t, err)
	mod, err := dc.LoadModule([]byte(ptx.String()))
	must(t, err)
	fns := make([]device.Function, len(kernel))
	for j := range kernel {
		fns[j], err = mod.Function(fmt.Sprintf("k%d", j))
		must(t, err)
	}

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
		for j, tn := range m.Tensors {
			a, err := device.PackArgs(fns[j].Params(), x, segs[tn.Segment]+device.Ptr(tn.Offset))
			must(t, err)
			must(t, s.Launch(fns[j], device.Dim3{X: 1}, device.Dim3{X: 1}, 0, a))
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
