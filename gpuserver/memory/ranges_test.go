package memory_test

import (
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// TestRangesPlaceSegmentsWhereTheFunctionSays: segments placed in a reserved range land at the addresses asked
// for, do not overlap live ones, are looked up over freed ones at the same address, and the range is freed only
// when empty.
func TestRangesPlaceSegmentsWhereTheFunctionSays(t *testing.T) {
	dev := newSim(t)
	const chunk = 2 << 20
	as := memory.NewAddressSpace(dev, "fn", chunk)
	if _, err := as.ReserveRange(chunk+1, 0); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("a range that is not whole chunks: %v", err)
	}
	base, err := as.ReserveRange(8*chunk, 0)
	if err != nil {
		t.Fatal(err)
	}
	small, _, _, err := as.Alloc(4096, memory.KindModel) // an ordinary block beside the range
	if err != nil {
		t.Fatal(err)
	}
	if small >= base && small < base+8*chunk {
		t.Fatalf("an ordinary block at %#x inside the range at %#x", small, base)
	}
	s1, err := as.AllocAt(base+2*chunk, 2*chunk, memory.KindModel)
	if err != nil || s1.Ptr != base+2*chunk || s1.Size != 2*chunk {
		t.Fatalf("placed: %+v %v", s1, err)
	}
	for _, bad := range []struct {
		p    device.Ptr
		size uint64
	}{
		{base + 3*chunk, chunk},      // overlaps s1
		{base + 7*chunk, 2 * chunk},  // runs past the range
		{base + chunk + 4096, chunk}, // not chunk-aligned
		{small, chunk},               // not in a range
	} {
		if _, err := as.AllocAt(bad.p, bad.size, memory.KindModel); !errors.Is(err, memory.ErrInvalid) {
			t.Errorf("AllocAt(%#x, %d): %v", bad.p, bad.size, err)
		}
	}
	if err := as.FreeRange(base); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("freeing a range with a live segment: %v", err)
	}
	if err := as.Free(base + 2*chunk); err != nil {
		t.Fatal(err)
	}
	s2, err := as.AllocAt(base+2*chunk, chunk, memory.KindScratch)
	if err != nil || s2.ID == s1.ID {
		t.Fatalf("placed again at a freed address: %+v %v", s2, err)
	}
	if got, ok := as.Lookup(base + 2*chunk + 100); !ok || got.ID != s2.ID {
		t.Fatalf("lookup finds segment %d, want the live %d", got.ID, s2.ID)
	}
	if got, ok := as.Lookup(base + 3*chunk + 100); !ok || got.ID != s1.ID {
		t.Fatalf("the freed segment's other half: %+v %v", got, ok)
	}
	if err := as.Free(base + 2*chunk); err != nil {
		t.Fatal(err)
	}
	if err := as.FreeRange(base); err != nil {
		t.Fatalf("an empty range: %v", err)
	}
	if err := as.FreeRange(base); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("freed twice: %v", err)
	}
	if _, err := as.ReserveRange(4*chunk, 0); err != nil {
		t.Fatal(err)
	}
	if err := as.Close(); err != nil {
		t.Fatalf("close with a range: %v", err)
	}
}

// TestFollowingIsTheRunOfPlacedNeighbours: a block may run from a placed segment into the ones placed right after
// it, up to the first hole; a freed neighbour ends the run, a segment of its own allocation has none.
func TestFollowingIsTheRunOfPlacedNeighbours(t *testing.T) {
	dev := newSim(t)
	const chunk = 2 << 20
	as := memory.NewAddressSpace(dev, "f", chunk)
	base, err := as.ReserveRange(8*chunk, 0)
	if err != nil {
		t.Fatal(err)
	}
	var segs []memory.Segment
	for _, at := range []uint64{0, 1, 3, 5} { // 0 and 1 and 3 (two chunks) touch; 5 after a hole
		size := uint64(chunk)
		if at == 3 {
			size = 2 * chunk
		}
		s, err := as.AllocAt(base+device.Ptr(at*chunk), size, memory.KindModel)
		if err != nil {
			t.Fatal(err)
		}
		segs = append(segs, s)
	}
	ids := func(ss []memory.Segment) []int {
		var out []int
		for _, s := range ss {
			out = append(out, s.ID)
		}
		return out
	}
	if got := ids(as.Following(segs[0])); len(got) != 1 || got[0] != segs[1].ID {
		t.Fatalf("after the first: %v, want [%d] (a hole at chunk 2)", got, segs[1].ID)
	}
	if err := as.Free(base + 5*chunk); err != nil {
		t.Fatal(err)
	}
	s, err := as.AllocAt(base+2*chunk, chunk, memory.KindModel) // fills the hole
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(as.Following(segs[0])); len(got) != 3 || got[0] != segs[1].ID || got[1] != s.ID || got[2] != segs[2].ID {
		t.Fatalf("after the first: %v, want [%d %d %d] (chunk 5's segment freed)", got, segs[1].ID, s.ID, segs[2].ID)
	}
	_, own, _, err := as.Alloc(chunk, memory.KindModel)
	if err != nil {
		t.Fatal(err)
	}
	if got := as.Following(own); len(got) != 0 {
		t.Fatalf("a segment of its own allocation: %v", got)
	}
}
