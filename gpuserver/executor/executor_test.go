package executor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

type rig struct {
	dev  device.Backend
	mem  *memory.Manager
	repo *repository.Repository
	node *executor.Node
}

func newRig(t *testing.T, gpuMemory uint64, opts sim.Options, evict bool) *rig {
	t.Helper()
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	if opts.Node, err = node.WithGPUMemory(gpuMemory); err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return newRigOn(t, dev, evict)
}

func newRigOn(t *testing.T, dev device.Backend, evict bool) *rig {
	t.Helper()
	mem, err := memory.New(dev, memory.Config{Share: 1, MaxBytesPerGPU: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := repository.Open(repository.Config{Dir: shmDir(t), Registrar: dev})
	if err != nil {
		t.Fatal(err)
	}
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, EvictUnderPressure: evict})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Error(err)
		}
		_ = repo.Close()
		_ = dev.Close(ctx)
	})
	return &rig{dev: dev, mem: mem, repo: repo, node: n}
}

func f32(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*31+i/4096)
	}
	return b
}

// model is a function with three model blocks (one small, two spanning several chunks) captured on gpu.
// checkVectorAdd runs the reference vector_add on fn's stream (GPU gpu) over the model's blocks 1 and 2 (1000
// floats each) into scratch, and checks every element of the result.
func checkVectorAdd(t *testing.T, ctx context.Context, r *rig, fn string, gpu int, m model, scratch device.Ptr) {
	t.Helper()
	s, err := r.node.Stream(fn)
	must(t, err)
	dctx, err := r.node.Context(fn, gpu) // kernels run in the context of the function's tenant
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	defer mod.Unload()
	va, err := mod.Function("vector_add")
	must(t, err)
	args, err := device.PackArgs(va.Params(), m.blocks[1], m.blocks[2], scratch, uint32(1000))
	must(t, err)
	must(t, s.Launch(va, device.Dim3{X: 4}, device.Dim3{X: 256}, 0, args))
	out := make([]byte, 4000)
	must(t, s.CopyDtoH(out, scratch))
	must(t, s.Synchronize(ctx))
	for i := 0; i < 1000; i++ {
		a := math.Float32frombits(binary.LittleEndian.Uint32(m.data[1][4*i:]))
		c := math.Float32frombits(binary.LittleEndian.Uint32(m.data[2][4*i:]))
		got := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
		if got != a+c && !(math.IsNaN(float64(got)) && math.IsNaN(float64(a+c))) {
			t.Fatalf("c[%d] = %v, want %v", i, got, a+c)
		}
	}
}

type model struct {
	name   string
	blocks []device.Ptr
	data   [][]byte
}

// initModel registers name, copies a block of each size (a pattern of its own) onto gpu under a binding and
// captures the function while it holds that binding.
func initModel(t *testing.T, r *rig, name string, gpu int, sizes ...int) model {
	t.Helper()
	return initBlocks(t, r, name, gpu, true, sizes...)
}

// initBlocks is initModel, with the capture only where capture is set.
func initBlocks(t *testing.T, r *rig, name string, gpu int, capture bool, sizes ...int) model {
	t.Helper()
	ctx := context.Background()
	must(t, r.node.Register(name))
	b, err := r.node.Acquire(ctx, name, gpu, executor.Host)
	must(t, err)
	defer b.Release()
	s, err := r.node.Stream(name)
	must(t, err)
	m := model{name: name}
	for i, size := range sizes {
		p, err := r.node.Alloc(ctx, name, uint64(size))
		must(t, err)
		d := pattern(size, byte(i+1)+name[0])
		must(t, s.CopyHtoD(p, d))
		m.blocks, m.data = append(m.blocks, p), append(m.data, d)
	}
	must(t, s.Synchronize(ctx))
	if capture {
		must(t, r.node.Capture(ctx, name))
	}
	return m
}

// verify reads every block back through the function's stream on its active GPU.
func verify(t *testing.T, r *rig, m model, wantGPU int) {
	t.Helper()
	ctx := context.Background()
	s, err := r.node.Stream(m.name)
	must(t, err)
	if s.GPU() != wantGPU {
		t.Fatalf("%s runs on gpu %d, want %d", m.name, s.GPU(), wantGPU)
	}
	for i, p := range m.blocks {
		out := make([]byte, len(m.data[i]))
		must(t, s.CopyDtoH(out, p))
		must(t, s.Synchronize(ctx))
		if !bytes.Equal(out, m.data[i]) {
			t.Fatalf("%s block %d at %#x differs on gpu %d", m.name, i, p, wantGPU)
		}
	}
}

// evictSource evicts the copy on gpu that was the source of a swap: it stays pinned until the swap's finisher ran
// (a moment after its copies completed), so eviction is retried while it answers ErrPinned.
func evictSource(t *testing.T, r *rig, name string, gpu int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		err := r.node.Evict(context.Background(), name, gpu)
		if err == nil {
			return
		}
		if !errors.Is(err, executor.ErrPinned) || time.Now().After(deadline) {
			t.Fatalf("evict %s on gpu %d: %v", name, gpu, err)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSwapBetweenGPUsKeepsAddressesAndBytes(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	m := initModel(t, r, "resnet", 0, 1000, 5<<20, 3<<20)
	segsBefore, _ := r.node.Segments("resnet")

	// GPU 0 -> GPU 3 over a peer copy, then GPU 3 -> GPU 1 after GPU 0's copy is gone, then host -> GPU 2
	must(t, r.node.SwapIn(ctx, "resnet", 3, 0))
	verify(t, r, m, 3)
	evictSource(t, r, "resnet", 0)
	must(t, r.node.SwapIn(ctx, "resnet", 1, 3))
	verify(t, r, m, 1)
	evictSource(t, r, "resnet", 3)
	must(t, r.node.Evict(ctx, "resnet", 1))
	gpus, active, _ := r.node.Resident("resnet")
	if len(gpus) != 0 || active != -1 {
		t.Fatalf("after evicting everywhere: resident %v active %d", gpus, active)
	}
	must(t, r.node.SwapIn(ctx, "resnet", 2, executor.Host))
	verify(t, r, m, 2)

	// compute on the swapped-in model into a scratch block: c = a + b over the first 1000 floats of blocks 1, 2
	b, err := r.node.Acquire(ctx, "resnet", -1, executor.Host)
	must(t, err)
	if b.GPU() != 2 {
		t.Fatalf("acquire went to gpu %d, the model is active on 2", b.GPU())
	}
	scratch, err := r.node.Alloc(ctx, "resnet", 4000)
	must(t, err)
	checkVectorAdd(t, ctx, r, "resnet", 2, m, scratch)
	b.Release()
	segsAfter, _ := r.node.Segments("resnet")
	for i, sg := range segsBefore {
		if segsAfter[i] != sg {
			t.Fatalf("segment %d moved: %+v -> %+v", i, sg, segsAfter[i])
		}
	}
	if k := segsAfter[len(segsAfter)-1].Kind; k != memory.KindScratch {
		t.Fatalf("block allocated after capture is %v, want scratch", k)
	}
	// evict and swap in again: model bytes come back, scratch is not copied
	must(t, r.node.Evict(ctx, "resnet", 2))
	must(t, r.node.SwapIn(ctx, "resnet", 0, executor.Host))
	verify(t, r, m, 0)
	if err := r.node.Deregister(ctx, "resnet"); err != nil {
		t.Fatal(err)
	}
	for g := range 4 {
		if p := r.mem.Pool(g); p.Free() != p.Total() {
			t.Fatalf("gpu %d: %d of %d chunks free after deregister", g, p.Free(), p.Total())
		}
	}
}

// gateClock blocks every delay until the test opens it; its time advances to what was slept until.
type gateClock struct {
	mu     sync.Mutex
	open   chan struct{}
	asleep int
	now    time.Time
}

func newGateClock() *gateClock { return &gateClock{open: make(chan struct{}), now: time.Unix(0, 0)} }

func (c *gateClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *gateClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	c.asleep++
	open := c.open
	c.mu.Unlock()
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
func (c *gateClock) sleeping() int { c.mu.Lock(); defer c.mu.Unlock(); return c.asleep }
func (c *gateClock) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.open:
	default:
		close(c.open)
	}
}

func TestEvictionUnderPressureNeverEvictsPinnedSource(t *testing.T) {
	ctx := context.Background()
	clk := newGateClock()
	// 16 MiB GPUs (8 chunks); a blocked clock keeps swaps in flight
	r := newRig(t, 16<<20, sim.Options{Clock: clk, TimeScale: 1}, true)
	t.Cleanup(clk.release)                     // runs before the rig's cleanup, so stuck swaps end
	clk.release()                              // initialise without blocking, then re-arm the gate
	a := initModel(t, r, "a", 0, 6<<20, 6<<20) // 12 MiB of 16
	clk.mu.Lock()
	clk.open = make(chan struct{})
	clk.asleep = 0
	clk.mu.Unlock()

	// swap a: GPU 0 -> GPU 1; its copy on GPU 0 is pinned while the copy runs
	must(t, r.node.SwapIn(ctx, "a", 1, 0))
	deadline := time.Now().Add(10 * time.Second)
	for clk.sleeping() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the swap never started")
		}
		time.Sleep(time.Millisecond)
	}
	// b needs 8 MiB on GPU 0, where 4 MiB are free: only a's pinned copy could make room
	must(t, r.node.Register("b"))
	bind, err := r.node.Acquire(ctx, "b", 0, executor.Host)
	must(t, err)
	if _, err := r.node.Alloc(ctx, "b", 8<<20); !errors.Is(err, executor.ErrNoMemory) {
		t.Fatalf("allocation that only evicting a pinned swap source could satisfy: %v, want ErrNoMemory", err)
	}
	bind.Release()
	if err := r.node.Evict(ctx, "a", 0); !errors.Is(err, executor.ErrPinned) {
		t.Fatalf("evicting a pinned source: %v, want ErrPinned", err)
	}
	gpus, _, _ := r.node.Resident("a")
	if len(gpus) != 2 {
		t.Fatalf("a resident on %v during its swap, want gpus 0 and 1", gpus)
	}
	clk.release()
	verify(t, r, a, 1)
	deadline = time.Now().Add(10 * time.Second)
	// once the swap is done, pressure on GPU 0 may evict a's parked copy there
	// (the swap's finisher unpins the source shortly after the copy completes: poll)
	bind, err = r.node.Acquire(ctx, "b", 0, executor.Host)
	must(t, err)
	for _, err = r.node.Alloc(ctx, "b", 8<<20); err != nil; _, err = r.node.Alloc(ctx, "b", 8<<20) {
		if !errors.Is(err, executor.ErrNoMemory) || time.Now().After(deadline) {
			t.Fatalf("allocation after the swap finished: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	bind.Release()
	deadline = time.Now().Add(10 * time.Second)
	for {
		gpus, _, _ = r.node.Resident("a")
		if len(gpus) == 1 && gpus[0] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a resident on %v, want only gpu 1", gpus)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestConcurrentAcquiresOfOneFunction(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	m := initModel(t, r, "bert", 1, 7<<20, 100)
	must(t, r.node.Evict(ctx, "bert", 1))
	before := r.node.Status()

	const n = 8
	var wg sync.WaitGroup
	gpus := make([]int, n)
	errs := make([]error, n)
	binds := make([]*executor.Binding, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			binds[i], errs[i] = r.node.Acquire(ctx, "bert", -1, executor.Host)
			if errs[i] == nil {
				gpus[i] = binds[i].GPU()
			}
		}()
	}
	wg.Wait()
	for i := range n {
		must(t, errs[i])
		if gpus[i] != gpus[0] {
			t.Fatalf("concurrent acquires bound to gpus %v, want one gpu", gpus)
		}
	}
	verify(t, r, m, gpus[0])
	var swaps int64
	for i, st := range r.node.Status() {
		swaps += st.Swaps - before[i].Swaps
	}
	if swaps != 1 {
		t.Fatalf("%d swaps for %d concurrent acquires, want 1", swaps, n)
	}
	// while bound, the function cannot be moved or evicted
	other := (gpus[0] + 1) % 4
	if err := r.node.SwapIn(ctx, "bert", other, executor.Host); !errors.Is(err, executor.ErrBusy) {
		t.Fatalf("moving a bound function: %v, want ErrBusy", err)
	}
	if err := r.node.Evict(ctx, "bert", gpus[0]); !errors.Is(err, executor.ErrBusy) {
		t.Fatalf("evicting a bound function: %v, want ErrBusy", err)
	}
	for _, b := range binds {
		b.Release()
		b.Release() // idempotent
	}
	must(t, r.node.SwapIn(ctx, "bert", other, gpus[0]))
	verify(t, r, m, other)
}

func TestUnhealthyGPUMovesWork(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	m := initModel(t, r, "yolo", 2, 3<<20)
	r.node.MarkUnhealthy(2, errors.New("xid 79: fell off the bus"))
	if r.node.Healthy(2) {
		t.Fatal("gpu 2 still healthy")
	}
	if err := r.node.SwapIn(ctx, "yolo", 2, executor.Host); !errors.Is(err, executor.ErrUnhealthy) {
		t.Fatalf("swap onto an unhealthy gpu: %v", err)
	}
	b, err := r.node.Acquire(ctx, "yolo", -1, executor.Host)
	must(t, err)
	defer b.Release()
	if b.GPU() == 2 {
		t.Fatal("work stayed on the unhealthy gpu")
	}
	verify(t, r, m, b.GPU())
	if st := r.node.Status()[2]; st.Healthy || st.Error == "" || len(st.Resident) != 0 {
		t.Fatalf("status of the failed gpu: %+v", st)
	}
}

func TestRestartKeepsHostRepository(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "shm")
	node, _ := topology.Preset("v100x4")
	node, _ = node.WithGPUMemory(64 << 20)
	dev, err := sim.New(sim.Options{Node: node})
	must(t, err)
	defer dev.Close(ctx)
	mem, _ := memory.New(dev, memory.Config{Share: 1})
	repo, err := repository.Open(repository.Config{Dir: dir, Registrar: dev})
	must(t, err)
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo})
	must(t, err)
	r := &rig{dev: dev, mem: mem, repo: repo, node: n}
	m := initModel(t, r, "llm", 0, 4<<20, 512)
	segs, _ := n.Segments("llm")
	must(t, n.Close(ctx))
	must(t, repo.Close())

	repo2, err := repository.Open(repository.Config{Dir: dir, Registrar: dev})
	must(t, err)
	defer repo2.Close()
	im, err := repo2.Get(ctx, "llm")
	must(t, err)
	defer im.Release()
	for i, s := range im.Segments() {
		if s.Ptr != segs[i].Ptr || s.Size != segs[i].Size {
			t.Fatalf("segment %d: %+v after restart, was %+v", i, s, segs[i])
		}
	}
	// the first block lies at the start of the first segment, the second in the shared small segment
	if !bytes.Equal(im.Bytes(0)[:len(m.data[0])], m.data[0]) {
		t.Fatal("image bytes changed across the restart")
	}
	off := uint64(m.blocks[1] - segs[1].Ptr)
	if !bytes.Equal(im.Bytes(1)[off:off+512], m.data[1]) {
		t.Fatal("small block bytes changed across the restart")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestNodeSwapsBetweenGPUsAndFromHost(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	m := initModel(t, r, "act", 0, 3<<20)
	a := r.node
	must(t, a.SwapIn(ctx, "act", 3, 0))
	verify(t, r, m, 3)
	// The source copy stays pinned until the swap's finisher has run: poll (its copies completed in verify).
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := a.Evict(ctx, "act", 0)
		if err == nil {
			break
		}
		if !errors.Is(err, executor.ErrPinned) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	must(t, a.Evict(ctx, "act", 3))
	must(t, a.SwapIn(ctx, "act", 1, executor.Host))
	verify(t, r, m, 1)
}

// shmDir is a repository dir on /dev/shm where there is one: the real driver page-locks the images, which Linux
// refuses for files on disk (the sim does not care).
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "faas-gpu-test-")
	if err != nil {
		return filepath.Join(t.TempDir(), "shm")
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
