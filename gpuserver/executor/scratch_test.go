package executor_test

import (
	"bytes"
	"context"
	"testing"

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
