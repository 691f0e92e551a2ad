package executor_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestRequestScratchIsDroppedAtRelease: a function whose scratch is its requests' (a KV cache) gives its scratch
// chunks back to the pool when its last binding ends, and gets zeroed chunks at the same address at its next
// binding without a copy; its model stays resident and intact. A function with the default keeps its scratch and
// its bytes while resident.
func TestRequestScratchIsDroppedAtRelease(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	for _, perRequest := range []bool{true, false} {
		name := map[bool]string{true: "llm", false: "keeper"}[perRequest]
		m := initModel(t, r, name, 0, 1<<20, 3<<20)
		must(t, r.node.SetScratchPerRequest(name, perRequest))
		b, err := r.node.Acquire(ctx, name, 0, executor.Host)
		must(t, err)
		kv, err := r.node.Alloc(ctx, name, 4<<20) // the KV cache, allocated by the first request
		must(t, err)
		s, err := r.node.Stream(name)
		must(t, err)
		data := pattern(4<<20, 7)
		must(t, s.CopyHtoD(kv, data))
		must(t, s.Synchronize(ctx))
		bound := r.node.Status()[0]
		dropped := r.node.ScratchDropped()
		b.Release()
		idle := r.node.Status()[0]
		if perRequest {
			if idle.FreeBytes != bound.FreeBytes+4<<20 || r.node.ScratchDropped() != dropped+4<<20 {
				t.Fatalf("%s: free %d -> %d after the release, dropped %d: want the 4 MiB of scratch back", name,
					bound.FreeBytes, idle.FreeBytes, r.node.ScratchDropped()-dropped)
			}
		} else if idle.FreeBytes != bound.FreeBytes || r.node.ScratchDropped() != dropped {
			t.Fatalf("%s: free %d -> %d after the release: scratch is the function's, it stays", name,
				bound.FreeBytes, idle.FreeBytes)
		}
		if len(idle.Active) == 0 {
			t.Fatalf("%s: not active after the release: %+v", name, idle)
		}

		b, err = r.node.Acquire(ctx, name, 0, executor.Host)
		must(t, err)
		again := r.node.Status()[0]
		if again.FreeBytes != bound.FreeBytes || again.SwapBytes != bound.SwapBytes {
			t.Fatalf("%s: next binding: free %d swap bytes %d, want %d and %d (scratch mapped again, nothing copied)",
				name, again.FreeBytes, again.SwapBytes, bound.FreeBytes, bound.SwapBytes)
		}
		s, err = r.node.Stream(name)
		must(t, err)
		out := make([]byte, 4<<20)
		must(t, s.CopyDtoH(out, kv))
		must(t, s.Synchronize(ctx))
		want := data
		if perRequest {
			want = make([]byte, 4<<20)
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("%s: scratch after the next binding: want %s", name, map[bool]string{true: "zeros",
				false: "the bytes of the last request"}[perRequest])
		}
		verify(t, r, m, 0)
		b.Release()
	}
}

// scratchRun is one request of a function that keeps state in scratch: it binds (on gpu, or where the node places
// it with gpu < 0), optionally checks what its blocks hold, optionally writes new bytes, and releases.
func scratchRun(t *testing.T, r *rig, name string, gpu int, blocks []device.Ptr, want, write [][]byte) (boundOn int) {
	t.Helper()
	ctx := context.Background()
	b, err := r.node.Acquire(ctx, name, gpu, executor.Host)
	must(t, err)
	defer b.Release()
	s, err := r.node.Stream(name)
	must(t, err)
	for i, p := range blocks {
		if want != nil {
			out := make([]byte, len(want[i]))
			must(t, s.CopyDtoH(out, p))
			must(t, s.Synchronize(ctx))
			if !bytes.Equal(out, want[i]) {
				zeros := bytes.Count(out, []byte{0})
				t.Fatalf("%s on gpu %d: scratch block %d at %#x holds other bytes than its last request wrote "+
					"(%d of %d bytes zero)", name, b.GPU(), i, p, zeros, len(out))
			}
		}
		if write != nil {
			must(t, s.CopyHtoD(p, write[i]))
		}
	}
	must(t, s.Synchronize(ctx))
	return b.GPU()
}

// TestKeptScratchSurvivesEvictionAndMoves: a function loads state lazily in its first request (a 6 MiB block with
// a segment of its own and a small block in a shared segment, both allocated after its initialisation: scratch).
// Another function's swap-in evicts it; its next request, swapped in from the host, reads the same bytes. A move
// to another GPU (the model over a peer copy) keeps them too, and a move back to a GPU where an older copy of its
// scratch stayed parked reads what the last request wrote, not the parked bytes. Before, scratch was mapped zeroed
// after every eviction and move (answers computed on zeros, with 200), and a parked copy served stale scratch.
// With per-request scratch declared, the same sequence reads zeros after the eviction, by declaration, and nothing
// is written back.
func TestKeptScratchSurvivesEvictionAndMoves(t *testing.T) {
	ctx := context.Background()
	for _, perRequest := range []bool{false, true} {
		r := newRig(t, 64<<20, sim.Options{}, true)
		name := "lazy"
		m := initModel(t, r, name, 0, 1<<20)
		must(t, r.node.SetScratchPerRequest(name, perRequest))
		must(t, r.node.SetScratchLimit(name, 32<<20))

		b, err := r.node.Acquire(ctx, name, 0, executor.Host)
		must(t, err)
		big, err := r.node.Alloc(ctx, name, 6<<20) // the lazily loaded model
		must(t, err)
		small, err := r.node.Alloc(ctx, name, 4096) // a small tensor beside it
		must(t, err)
		b.Release()
		blocks := []device.Ptr{big, small}
		a := [][]byte{pattern(6<<20, 11), pattern(4096, 12)}
		scratchRun(t, r, name, 0, blocks, nil, a)

		// Another function fills GPU 0: the lazy one is evicted under pressure.
		initModel(t, r, "other", 0, 63<<20)
		if gpus, _, _ := r.node.Resident(name); len(gpus) != 0 {
			t.Fatalf("perRequest=%v: %s still resident on %v: the test no longer evicts it", perRequest, name, gpus)
		}
		st := r.node.Status()[0]
		if perRequest {
			zeros := [][]byte{make([]byte, 6<<20), make([]byte, 4096)}
			scratchRun(t, r, name, 1, blocks, zeros, nil)
			verify(t, r, m, 1)
			if st.ScratchWrittenBack != 0 {
				t.Fatalf("per-request scratch: %d bytes written back, want none", st.ScratchWrittenBack)
			}
			continue
		}
		if st.ScratchWrittenBack != 6<<20+2<<20 {
			t.Fatalf("written back from gpu 0: %d bytes, want the two scratch segments (8 MiB)",
				st.ScratchWrittenBack)
		}
		g1 := scratchRun(t, r, name, -1, blocks, a, nil)
		if g1 == 0 {
			t.Fatalf("placed on gpu 0, which the other function fills")
		}
		verify(t, r, m, g1)
		if got := r.node.Status()[g1].ScratchRestored; got != 8<<20 {
			t.Fatalf("restored into gpu %d: %d bytes, want 8 MiB", g1, got)
		}

		// A second request changes the state; the function moves to g2 over a peer copy (its copy on g1 stays
		// parked), changes it again, and comes back to g1.
		bb := [][]byte{pattern(6<<20, 21), pattern(4096, 22)}
		scratchRun(t, r, name, g1, blocks, a, bb)
		g2 := 1 + g1%3
		must(t, r.node.SwapIn(ctx, name, g2, g1))
		cc := [][]byte{pattern(6<<20, 31), pattern(4096, 32)}
		scratchRun(t, r, name, g2, blocks, bb, cc)
		verify(t, r, m, g2)
		if gpus, _, _ := r.node.Resident(name); len(gpus) != 2 {
			t.Fatalf("resident on %v, want a parked copy on gpu %d beside gpu %d", gpus, g1, g2)
		}
		must(t, r.node.SwapIn(ctx, name, g1, executor.Host))
		scratchRun(t, r, name, g1, blocks, cc, nil)
		verify(t, r, m, g1)
		if err := r.node.Usable(name); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLostScratchIsRefused: when a function's active copy is destroyed (its GPU failed) after its work changed its
// scratch and before a write-back, and scratch blocks it had then are still allocated at its next binding, its work
// is refused with ErrLost (its process must start again) instead of running on zeros. A function whose blocks of
// that moment were a request's temporaries, freed before its next binding, goes on; a function whose work did not
// run since its scratch was written back comes back from the host copy. A function whose scratch exceeds its quota
// at a write-back is refused the same way.
func TestLostScratchIsRefused(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	for _, name := range []string{"ran", "idle", "temps", "greedy"} {
		initModel(t, r, name, 0, 1<<20)
	}
	fill := func(name string, gpu, size int) []device.Ptr {
		b, err := r.node.Acquire(ctx, name, gpu, executor.Host)
		must(t, err)
		p, err := r.node.Alloc(ctx, name, uint64(size))
		must(t, err)
		b.Release()
		return []device.Ptr{p}
	}
	ran, idle := fill("ran", 0, 2<<20), fill("idle", 0, 2<<20)
	data := [][]byte{pattern(2<<20, 5)}
	must(t, r.node.SetScratchLimit("ran", 16<<20))
	scratchRun(t, r, "ran", 0, ran, nil, data)
	scratchRun(t, r, "idle", 0, idle, nil, data)
	must(t, r.node.Evict(ctx, "idle", 0)) // written back
	b, err := r.node.Acquire(ctx, "idle", 2, executor.Host)
	must(t, err)
	b.Release()
	must(t, r.node.SwapIn(ctx, "ran", 2, executor.Host)) // "ran" writes its scratch back on the way
	scratchRun(t, r, "ran", 2, ran, data, pattern2(data))

	// "temps" is in a request on gpu 2 with a temporary block written when the gpu fails; the request frees it.
	tb, err := r.node.Acquire(ctx, "temps", 2, executor.Host)
	must(t, err)
	tmp, err := r.node.Alloc(ctx, "temps", 4096)
	must(t, err)
	ts, err := r.node.Stream("temps")
	must(t, err)
	must(t, ts.Memset8(tmp, 7, 4096))
	r.node.MarkUnhealthy(2, errors.New("the test fails it"))
	if tb.Err() == nil {
		t.Fatal("a binding on the failed gpu did not break")
	}
	must(t, r.node.Free("temps", tmp))
	tb.Release()

	if _, err := r.node.Acquire(ctx, "ran", 1, executor.Host); !errors.Is(err, executor.ErrLost) {
		t.Fatalf("acquire after its scratch was lost with its gpu: %v, want ErrLost", err)
	}
	if err := r.node.Usable("ran"); !errors.Is(err, executor.ErrLost) {
		t.Fatalf("a function whose scratch was lost: %v, want ErrLost", err)
	}
	if err := r.node.Usable("idle"); err != nil {
		t.Fatalf("a function that ran nothing since its write-back: %v", err)
	}
	scratchRun(t, r, "idle", 1, idle, data, nil)
	scratchRun(t, r, "temps", 1, nil, nil, nil) // its temporary was freed: nothing it kept was lost

	greedy := fill("greedy", 3, 8<<20)
	must(t, r.node.SetScratchLimit("greedy", 4<<20))
	scratchRun(t, r, "greedy", 3, greedy, nil, [][]byte{pattern(8<<20, 9)})
	must(t, r.node.Evict(ctx, "greedy", 3))
	if err := r.node.Usable("greedy"); !errors.Is(err, executor.ErrLost) || !errors.Is(err, executor.ErrNoMemory) {
		t.Fatalf("scratch beyond the quota at a write-back: %v, want ErrLost and ErrNoMemory", err)
	}
	must(t, r.node.Reset(ctx, "greedy")) // its process started again: it initialises afresh
	if err := r.node.Usable("greedy"); err != nil {
		t.Fatalf("after its reset: %v", err)
	}
}

func pattern2(d [][]byte) [][]byte {
	out := make([][]byte, len(d))
	for i, b := range d {
		out[i] = pattern(len(b), b[0]+1)
	}
	return out
}

// TestLaterReplicasInitialisationIsKept: a function whose scratch is its requests' is captured at its first
// request; then a second process of it (a replica started later) initialises: a large block and a small one
// allocated in its own initialisation (executor.Initialising), outside any request, and written. The end of the
// bindings its initialisation ran under gives none of it back, and neither does an eviction: every later binding,
// from the host after the eviction, reads what it wrote; the quota counts it. A request's scratch allocated beside
// it is still given back. Before, those blocks were scratch like a request's: given back at the end of the next
// binding and mapped zeroed, and the replica computed on zeros. A process that declared its initialisation
// (BeginInit) also holds the capture back until it ends (FinishInit), and until no request is in flight.
func TestLaterReplicasInitialisationIsKept(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	m := initModel(t, r, "llm", 0, 1<<20)
	must(t, r.node.SetScratchPerRequest("llm", true))
	must(t, r.node.SetScratchLimit("llm", 32<<20))
	must(t, r.node.EndInit(ctx, "llm"))

	b, err := r.node.Acquire(ctx, "llm", 0, executor.Host) // the second replica's initialisation binds implicitly
	must(t, err)
	big, _, _, err := r.node.AllocSegment(ctx, "llm", 3<<20, executor.Initialising)
	must(t, err)
	small, _, _, err := r.node.AllocSegment(ctx, "llm", 4096, executor.Initialising)
	must(t, err)
	req, _, _, err := r.node.AllocSegment(ctx, "llm", 4096, executor.Serving) // a request's, beside it
	must(t, err)
	s, err := r.node.Stream("llm")
	must(t, err)
	blocks, data := []device.Ptr{big, small}, [][]byte{pattern(3<<20, 3), pattern(4096, 4)}
	for i, p := range blocks {
		must(t, s.CopyHtoD(p, data[i]))
	}
	must(t, s.CopyHtoD(req, pattern(4096, 5)))
	must(t, s.Synchronize(ctx))
	dropped := r.node.ScratchDropped()
	b.Release()
	if got := r.node.ScratchDropped() - dropped; got != 2<<20 {
		t.Fatalf("%d bytes given back at the end of the binding, want the request's segment only (2 MiB)", got)
	}
	scratchRun(t, r, "llm", 0, blocks, data, nil)
	must(t, r.node.Evict(ctx, "llm", 0))
	scratchRun(t, r, "llm", 1, blocks, data, nil) // from the host, on another gpu
	scratchRun(t, r, "llm", 1, []device.Ptr{req}, [][]byte{make([]byte, 4096)}, nil)
	verify(t, r, m, 1)

	// Capture held back by a process in its declared initialisation, then by a request in flight.
	n := initUncaptured(t, r, "late", 2, 1<<20)
	must(t, r.node.BeginInit("late"))
	must(t, r.node.EndInit(ctx, "late"))
	if r.node.Captured("late") {
		t.Fatal("captured while a process of it was in its declared initialisation")
	}
	hold, err := r.node.Acquire(ctx, "late", 2, executor.Host)
	must(t, err)
	r.node.FinishInit("late")
	must(t, r.node.EndInit(ctx, "late"))
	if r.node.Captured("late") {
		t.Fatal("captured, after a deferral, while a request of it was in flight")
	}
	hold.Release()
	must(t, r.node.EndInit(ctx, "late"))
	if !r.node.Captured("late") {
		t.Fatal("not captured once no process initialised and no request was in flight")
	}
	must(t, r.node.Evict(ctx, "late", 2))
	scratchRun(t, r, "late", 2, nil, nil, nil)
	verify(t, r, n, 2)
}
