package memory_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestBuddyProperties drives a buddy allocator with a random workload and checks, after every step, that blocks
// never overlap and are aligned, that an allocation fails only when no aligned free region of its size exists
// (fragmentation is bounded by the buddy rule, not by bookkeeping), that rounding at most doubles a request, and
// that freeing everything leaves one free block (no leak).
func TestBuddyProperties(t *testing.T) {
	const size, minBlock = 1 << 20, 256
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 42))
		b, err := memory.NewBuddy(size, minBlock)
		if err != nil {
			t.Fatal(err)
		}
		free := make([]bool, size/minBlock) // model: which min-blocks are free
		for i := range free {
			free[i] = true
		}
		type blk struct{ off, size, asked uint64 }
		live := map[uint64]blk{}
		var asked uint64
		for step := range 4000 {
			if len(live) > 0 && rng.IntN(100) < 45 {
				keys := make([]uint64, 0, len(live))
				for k := range live {
					keys = append(keys, k)
				}
				sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
				k := keys[rng.IntN(len(keys))]
				bl := live[k]
				if err := b.Free(k); err != nil {
					t.Fatalf("seed %d step %d: free: %v", seed, step, err)
				}
				for i := bl.off / minBlock; i < (bl.off+bl.size)/minBlock; i++ {
					free[i] = true
				}
				asked -= bl.asked
				delete(live, k)
				continue
			}
			n := uint64(1 + rng.IntN(64<<10))
			if rng.IntN(10) == 0 {
				n = uint64(1 + rng.IntN(size/4))
			}
			off, err := b.Alloc(n)
			rounded := uint64(minBlock)
			for rounded < n {
				rounded *= 2
			}
			if err != nil {
				if !errors.Is(err, memory.ErrNoSpace) {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				// no aligned fully free region of the rounded size may exist
				per := rounded / minBlock
				for start := uint64(0); start < uint64(len(free)); start += per {
					all := true
					for i := start; i < start+per; i++ {
						if !free[i] {
							all = false
							break
						}
					}
					if all {
						t.Fatalf("seed %d step %d: alloc %d failed although [%d,+%d) is free", seed, step, n,
							start*minBlock, rounded)
					}
				}
				continue
			}
			if off%rounded != 0 || b.BlockSize(off) != rounded || rounded >= 2*n && rounded > minBlock {
				t.Fatalf("seed %d step %d: block at %d of %d for %d bytes", seed, step, off, b.BlockSize(off), n)
			}
			for i := off / minBlock; i < (off+rounded)/minBlock; i++ {
				if !free[i] {
					t.Fatalf("seed %d step %d: block [%d,+%d) overlaps a live block", seed, step, off, rounded)
				}
				free[i] = false
			}
			live[off] = blk{off, rounded, n}
			asked += n
			if b.Used() > 2*asked+uint64(len(live))*minBlock {
				t.Fatalf("seed %d step %d: %d bytes used for %d asked", seed, step, b.Used(), asked)
			}
		}
		for k := range live {
			if err := b.Free(k); err != nil {
				t.Fatal(err)
			}
		}
		if !b.Empty() || b.Used() != 0 || b.LargestFree() != size {
			t.Fatalf("seed %d: after freeing everything: used %d, largest free %d", seed, b.Used(), b.LargestFree())
		}
	}
	if err := (&memory.Buddy{}).Free(3); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("free of an unknown block: %v", err)
	}
}

func newSim(t *testing.T) *sim.Backend {
	t.Helper()
	n, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	n, _ = n.WithGPUMemory(256 << 20)
	b, err := sim.New(sim.Options{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

// TestChunkPoolNeverFragments: any request for at most the free chunk count succeeds, whatever was taken and
// returned before, and every chunk comes back.
func TestChunkPoolNeverFragments(t *testing.T) {
	dev := newSim(t)
	m, err := memory.New(dev, memory.Config{Share: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	p := m.Pool(2)
	if p.Total() != 64 { // half of 256 MiB in 2 MiB chunks
		t.Fatalf("pool has %d chunks, want 64", p.Total())
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var held [][]memory.Chunk
	seen := map[int]bool{}
	for step := range 2000 {
		if len(held) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(held))
			for _, c := range held[i] {
				delete(seen, c.Index)
			}
			if err := p.Put(held[i]); err != nil {
				t.Fatal(err)
			}
			held = append(held[:i], held[i+1:]...)
			continue
		}
		n := 1 + rng.IntN(20)
		free := p.Free()
		cs, err := p.Get(n)
		if n <= free && err != nil {
			t.Fatalf("step %d: %d of %d free chunks not granted: %v", step, n, free, err)
		}
		if n > free {
			if !errors.Is(err, memory.ErrNoSpace) || p.Free() != free {
				t.Fatalf("step %d: over-request: %v, free %d -> %d", step, err, free, p.Free())
			}
			continue
		}
		for _, c := range cs {
			if seen[c.Index] {
				t.Fatalf("step %d: chunk %d handed out twice", step, c.Index)
			}
			seen[c.Index] = true
		}
		held = append(held, cs)
	}
	for _, h := range held {
		if err := p.Put(h); err != nil {
			t.Fatal(err)
		}
	}
	if p.Free() != p.Total() {
		t.Fatalf("leak: %d of %d free", p.Free(), p.Total())
	}
	if err := p.Put([]memory.Chunk{{Index: 3}}); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("double put: %v", err)
	}
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if free, total, _ := dev.MemoryInfo(2); free != total {
		t.Fatalf("close left %d of %d bytes allocated", total-free, total)
	}
}

func TestAddressSpaceKeepsAddressesAndSeparatesKinds(t *testing.T) {
	dev := newSim(t)
	const chunk = 2 << 20
	as := memory.NewAddressSpace(dev, "fn", chunk)
	p1, s1, created, err := as.Alloc(1000, memory.KindModel)
	if err != nil || !created {
		t.Fatalf("first small block: %v created=%v", err, created)
	}
	p2, s2, created, _ := as.Alloc(3000, memory.KindModel)
	if created || s2.ID != s1.ID || p2 == p1 {
		t.Fatalf("second small block should share the segment: %v %v", s1, s2)
	}
	p3, s3, created, _ := as.Alloc(5<<20, memory.KindModel)
	if !created || s3.Size != 6<<20 || p3 != s3.Ptr {
		t.Fatalf("large block: %+v", s3)
	}
	_, s4, created, _ := as.Alloc(100, memory.KindScratch)
	if !created || s4.Kind != memory.KindScratch || s4.ID == s1.ID {
		t.Fatalf("scratch must not share a model segment: %+v", s4)
	}
	if seg, ok := as.Lookup(p2 + 10); !ok || seg.ID != s1.ID {
		t.Fatalf("lookup inside a small block: %v %v", seg, ok)
	}
	if seg, ok := as.Lookup(p3 + 6<<20 - 1); !ok || seg.ID != s3.ID {
		t.Fatalf("lookup at the end of a large block: %v %v", seg, ok)
	}
	if _, ok := as.Lookup(1); ok {
		t.Fatal("lookup of an unknown address")
	}
	if err := as.Free(p1); err != nil {
		t.Fatal(err)
	}
	p5, _, _, _ := as.Alloc(1000, memory.KindModel)
	if p5 != p1 {
		t.Fatalf("a freed small block's room is reused: got %#x, want %#x", p5, p1)
	}
	if err := as.Free(p1 + 1); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("free of a non-block: %v", err)
	}
	model, scratch := as.Bytes()
	if model != 8<<20 || scratch != 2<<20 {
		t.Fatalf("bytes: model %d scratch %d", model, scratch)
	}
	if err := as.Close(); err != nil {
		t.Fatal(err)
	}
	var _ device.Ptr = p5
}
