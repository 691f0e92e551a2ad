package tenant

import (
	"bytes"
	"context"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestChunksAreZeroedBetweenExecutors: a chunk one executor wrote and gave back reads as zeros in the next
// executor it is lent to, and keeps its bytes when it goes back to the executor that held it last; a chunk lent
// to one executor cannot be given back by another; every chunk an ended executor held returns to the pool.
func TestChunksAreZeroedBetweenExecutors(t *testing.T) {
	ctx := context.Background()
	node, err := topology.Preset("v100x4")
	must(t, err)
	server, err := sim.New(sim.Options{Node: node})
	must(t, err)
	mem, err := memory.New(server, memory.Config{MaxBytesPerGPU: 8 << 20})
	must(t, err)
	l, err := newLending(server, mem)
	must(t, err)
	a, b := &generation{n: 1}, &generation{n: 2}
	none := func() []*generation { return nil }
	// An executor's own sim, importing what it is lent.
	exec, err := sim.New(sim.Options{Node: node})
	must(t, err)
	cs := mem.ChunkSize()
	use := func(g *generation, write []byte) []byte {
		t.Helper()
		lent, files, err := l.borrow(ctx, g, 0, 1, none)
		must(t, err)
		phys, err := exec.ImportPhysical(0, cs, files[0])
		must(t, err)
		files[0].Close()
		p, err := exec.ReserveAddress(cs, 0)
		must(t, err)
		must(t, exec.Map(p, phys))
		must(t, exec.SetAccess(p, cs, []int{0}))
		s, err := exec.NewStream(0)
		must(t, err)
		got := make([]byte, 64)
		must(t, s.CopyDtoH(got, p))
		if write != nil {
			must(t, s.CopyHtoD(p, write))
		}
		must(t, s.Synchronize(ctx))
		must(t, s.Destroy())
		must(t, exec.Unmap(p, cs))
		must(t, exec.FreeAddress(p, cs))
		must(t, phys.Release())
		if len(lent.Indexes) != 1 || lent.Indexes[0] != 0 {
			t.Fatalf("lent %v, want chunk 0 (lowest first)", lent.Indexes)
		}
		if err := l.giveBack(b, 0, []int{0}); g != b && err == nil {
			t.Fatal("an executor gave back a chunk lent to another")
		}
		if g != b {
			must(t, l.giveBack(g, 0, lent.Indexes))
		}
		return got
	}
	secret := bytes.Repeat([]byte{0xA5}, 64)
	use(a, secret)
	if got := use(a, nil); !bytes.Equal(got, secret) {
		t.Fatalf("the same executor reads %x back, want its own bytes", got[:8])
	}
	if got := use(b, nil); !bytes.Equal(got, make([]byte, 64)) {
		t.Fatalf("another executor reads %x in a chunk the first wrote: not zeroed", got[:8])
	}
	// An executor that ends holding chunks: they return to the pool.
	_, files, err := l.borrow(ctx, a, 1, 3, none)
	must(t, err)
	for _, f := range files {
		f.Close()
	}
	if lent := l.lent(); lent[1] != 3 {
		t.Fatalf("lent %v", lent)
	}
	l.takeAll(a)
	if lent := l.lent(); lent[1] != 0 || mem.Pool(1).Free() != mem.Pool(1).Total() {
		t.Fatalf("after the executor ended: lent %v, %d of %d free", lent, mem.Pool(1).Free(), mem.Pool(1).Total())
	}
	must(t, l.close())
	must(t, exec.Close(ctx))
	must(t, mem.Close(ctx))
	must(t, server.Close(ctx))
	var _ device.Sharer = server
}
