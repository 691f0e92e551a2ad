package server

import (
	"context"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestControllerPlansCopiesInWholeChunks: the executors hold a copy in whole chunks, the controller planned it by
// its quota to the byte: three functions of a 21 MiB quota, each with a 21 MiB model (11 chunks of 2 MiB, 22 MiB),
// fit the controller's plan of a GPU with 64 MiB of chunks (63 MiB) but not the chunks (66 MiB), so the third
// swap-in ran out of chunks and the data plane evicted a copy on its own. The gpuserver now gives the controller
// the chunks' size with their capacity (controller.Config.ChunkBytes): it plans 22 MiB a copy, and the eviction
// is its own.
func TestControllerPlansCopiesInWholeChunks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startOneGPU(ctx, t, Config{DeviceReserveBytes: 64 << 20})
	defer stop(t, s)
	if c := s.chunks.ChunkSize(); c != 2<<20 {
		t.Fatalf("chunks of %d bytes, the test needs 2 MiB", c)
	}
	p, x := s.Pool(), s.Executors()
	for _, fn := range []string{"a", "b", "c"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 21 << 20}); err != nil {
			t.Fatal(err)
		}
		_, release, err := s.pool.BindImplicit(ctx, fn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.Alloc(ctx, fn, 21<<20); err != nil {
			t.Fatalf("%s: %v", fn, err)
		}
		release()
		b, err := p.Acquire(ctx, fn)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	st := p.Status(ctx)
	if st.Evictions == nil || st.Evictions.DataPlane["pressure"] != 0 || st.Evictions.Controller != 1 {
		t.Fatalf("evictions %+v, want the controller's one and none by the data plane under pressure", st.Evictions)
	}
	if res := st.GPUs[0].Resident; len(res) != 2 {
		t.Errorf("the controller sees %v resident, want two copies (three take 66 MiB of chunks)", res)
	}
}
