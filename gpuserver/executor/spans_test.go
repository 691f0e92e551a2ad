package executor_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
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

// TestKernelAcrossPlacedSegmentsWaitsForEachOfThem: under PyTorch's expandable segments a function places the pages
// of one range as segments of their own (AllocAt) and a tensor runs across them. A kernel launched right after a
// swap-in (pipelined), its pointer in the first page and its data running into the next three, waited only for the
// first page's copy and read the others' chunks before their copies landed: vector_add answered with what those
// chunks held before (NaN, left there by another function) for the pages whose copies had not begun. It now waits
// for the pages placed after its own too.
func TestKernelAcrossPlacedSegmentsWaitsForEachOfThem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := topology.Preset("v100x4")
	must(t, err)
	dev, err := sim.New(sim.Options{Node: node, TimeScale: 1000}) // a page's copy: 175 ms on the wall clock
	must(t, err)
	mem, err := memory.New(dev, memory.Config{Share: 0.9, MaxBytesPerGPU: 64 << 20})
	must(t, err)
	repo, err := repository.Open(repository.Config{Dir: shmDir(t), Registrar: dev})
	must(t, err)
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, GroupBytes: 2 << 20})
	must(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		if err := n.Close(cctx); err != nil {
			t.Error(err)
		}
		_ = repo.Close()
		_ = dev.Close(cctx)
	})
	const fn, page = "f", 2 << 20
	must(t, n.Register(fn))
	b, err := n.Acquire(ctx, fn, 0, executor.Host)
	must(t, err)
	base, err := n.ReserveRange(fn, 8*page, 0)
	must(t, err)
	s, err := n.Stream(fn)
	must(t, err)
	for i := range 4 { // four pages, page i holding float32(i + 1)
		_, err := n.AllocAt(ctx, fn, base+device.Ptr(i*page), page, executor.Initialising)
		must(t, err)
		must(t, s.Memset32(base+device.Ptr(i*page), math.Float32bits(float32(i+1)), page/4))
	}
	must(t, s.Synchronize(ctx))
	must(t, n.Capture(ctx, fn))
	out, err := n.Alloc(ctx, fn, 3*page)
	must(t, err)
	b.Release()
	dc, err := n.Context(fn, 0)
	must(t, err)
	mod, err := dc.LoadModule(kernels.PTX())
	must(t, err)
	defer mod.Unload()
	va, err := mod.Function("vector_add")
	must(t, err)

	must(t, n.Evict(ctx, fn, 0))
	// Another function takes every free chunk of the GPU, fills it with NaN and gives it back: whatever chunks the
	// swap-in gets hold NaN until its copies land.
	must(t, n.Register("g"))
	bg, err := n.Acquire(ctx, "g", 0, executor.Host)
	must(t, err)
	sg, err := n.Stream("g")
	must(t, err)
	taken := 0
	for {
		p, err := n.Alloc(ctx, "g", page)
		if errors.Is(err, executor.ErrNoMemory) {
			break
		}
		must(t, err)
		must(t, sg.Memset32(p, 0xffffffff, page/4))
		taken++
	}
	must(t, sg.Synchronize(ctx))
	bg.Release()
	must(t, n.Deregister(ctx, "g"))
	if taken < 7 {
		t.Fatalf("the other function took %d chunks of 2 MiB, want the 7 the swap-in needs at least", taken)
	}
	b, err = n.Acquire(ctx, fn, 0, executor.Host) // the swap-in's copies are enqueued; nothing waited for
	must(t, err)
	defer b.Release()
	s, err = n.Stream(fn)
	must(t, err)
	const count = 3 * page / 4 // 6 MiB of float32 from the middle of page 0 to the middle of page 3
	x := base + page/2
	args, err := device.PackArgs(va.Params(), x, x, out, uint32(count))
	must(t, err)
	must(t, s.Launch(va, device.Dim3{X: count / 256}, device.Dim3{X: 256}, 0, args))
	got := make([]byte, 3*page)
	must(t, s.CopyDtoH(got, out))
	must(t, s.Synchronize(ctx))
	wrong := 0
	for k := range count {
		want := float32(2 * (1 + (k+page/8)/(page/4))) // page i holds i + 1: 2, 4, 6, 8 from page 0 to 3
		if v := math.Float32frombits(binary.LittleEndian.Uint32(got[4*k:])); v != want {
			if wrong == 0 {
				t.Errorf("c[%d] = %v, want %v", k, v, want)
			}
			wrong++
		}
	}
	if wrong > 0 {
		t.Fatalf("%d of %d values wrong: the kernel read pages whose copies had not landed", wrong, count)
	}
}
