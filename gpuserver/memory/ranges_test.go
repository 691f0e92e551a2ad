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
