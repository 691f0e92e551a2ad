package memory_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// countingMapper counts the driver's map calls of a backend.
type countingMapper struct {
	device.Backend
	maps, ranges, access int
}

func (c *countingMapper) Map(ptr device.Ptr, phys device.Physical) error {
	c.maps++
	return c.Backend.Map(ptr, phys)
}

func (c *countingMapper) MapRange(ptr device.Ptr, phys device.Physical, offset, size uint64) error {
	c.ranges++
	return c.Backend.(device.RangeMapper).MapRange(ptr, phys, offset, size)
}

func (c *countingMapper) SetAccess(ptr device.Ptr, size uint64, gpus []int) error {
	c.access++
	return c.Backend.SetAccess(ptr, size, gpus)
}

// Chunks carved out of larger allocations: a run of neighbours is mapped with one call, access granted once, and
// every chunk's bytes follow the chunk wherever and in whatever order it is mapped.
func TestSlabChunksMapInRunsAndKeepTheirBytes(t *testing.T) {
	ctx := context.Background()
	dev := &countingMapper{Backend: newSim(t)}
	const chunk = 2 << 20
	m, err := memory.New(dev, memory.Config{Share: 1, MaxBytesPerGPU: 32 << 20, SlabChunks: 4})
	must(t, err)
	defer m.Close(ctx)
	p := m.Pool(0)
	chunks, err := p.Get(6) // two runs: chunks 0-3 of the first allocation, 4-5 of the second
	must(t, err)
	ptr, err := dev.ReserveAddress(6*chunk, 0)
	must(t, err)
	must(t, m.MapAt(ptr, chunks, []int{0}))
	if dev.ranges != 2 || dev.maps != 0 || dev.access != 1 {
		t.Fatalf("6 chunks in 2 runs: %d range maps, %d maps, %d access calls; want 2, 0, 1", dev.ranges, dev.maps,
			dev.access)
	}
	s, err := dev.NewStream(0)
	must(t, err)
	pattern := func(i int) []byte { return bytes.Repeat([]byte{byte(0x10 + i)}, chunk) }
	for i := range chunks {
		must(t, s.CopyHtoD(ptr+device.Ptr(i*chunk), pattern(i)))
	}
	must(t, s.Synchronize(ctx))
	must(t, m.Unmap(ptr, 6*chunk))
	// the same chunks in reverse order: six runs of one
	rev := slices.Clone(chunks)
	slices.Reverse(rev)
	must(t, m.MapAt(ptr, rev, []int{0}))
	for i, c := range rev {
		out := make([]byte, chunk)
		must(t, s.CopyDtoH(out, ptr+device.Ptr(i*chunk)))
		must(t, s.Synchronize(ctx))
		if !bytes.Equal(out, pattern(c.Index)) {
			t.Fatalf("chunk %d mapped at position %d does not hold its bytes", c.Index, i)
		}
	}
	must(t, m.Unmap(ptr, 6*chunk))
	must(t, s.Destroy())
	must(t, p.Put(chunks))
	must(t, dev.FreeAddress(ptr, 6*chunk))
}

// A device that maps whole allocations only cannot hold several chunks in one.
func TestSlabChunksNeedARangeMapper(t *testing.T) {
	type wholeOnly struct{ device.Backend }
	if _, err := memory.New(wholeOnly{newSim(t)}, memory.Config{SlabChunks: 4}); !errors.Is(err, memory.ErrInvalid) {
		t.Fatalf("slabs on a device without MapRange: %v, want ErrInvalid", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
