package memory

import (
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Ranges: a function's own virtual address ranges (cuMemAddressReserve of PyTorch's expandable segments), in which
// it places segments at addresses it chooses (cuMemMap). A range is reserved once on every GPU like a segment and
// holds no memory itself; a segment placed in it is an ordinary segment (mapped, swapped and freed as any other)
// except that its address comes from the function, and that once freed its addresses may be placed again.

type addrRange struct {
	ptr  device.Ptr
	size uint64
}

// ReserveRange reserves size bytes of address space (a multiple of the chunk size) for the function to place
// segments in with AllocAt.
func (a *AddressSpace) ReserveRange(size, alignment uint64) (device.Ptr, error) {
	if size == 0 || size%a.chunkSize != 0 {
		return 0, fmt.Errorf("%w: function %s: range of %d bytes is not a multiple of %d", ErrInvalid, a.function,
			size, a.chunkSize)
	}
	if alignment != 0 && (alignment&(alignment-1) != 0) {
		return 0, fmt.Errorf("%w: function %s: alignment %d", ErrInvalid, a.function, alignment)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, fmt.Errorf("%w: function %s: address space closed", ErrInvalid, a.function)
	}
	p, err := a.dev.ReserveAddress(size, max(alignment, a.chunkSize))
	if err != nil {
		return 0, fmt.Errorf("function %s: reserve a range of %d bytes: %w", a.function, size, err)
	}
	a.ranges = append(a.ranges, addrRange{ptr: p, size: size})
	return p, nil
}

// rangeOf returns the index of the range holding [p, p+size), or -1.
func (a *AddressSpace) rangeOf(p device.Ptr, size uint64) int {
	for i, r := range a.ranges {
		if p >= r.ptr && uint64(p-r.ptr) <= r.size && size <= r.size-uint64(p-r.ptr) {
			return i
		}
	}
	return -1
}

// AllocAt places a segment of size bytes (whole chunks, chunk-aligned) at ptr inside one of the function's ranges,
// where no live segment is. It is one block: Free(ptr) releases it, after which its addresses may be placed again.
func (a *AddressSpace) AllocAt(ptr device.Ptr, size uint64, kind Kind) (Segment, error) {
	if size == 0 || size%a.chunkSize != 0 || uint64(ptr)%a.chunkSize != 0 {
		return Segment{}, fmt.Errorf("%w: function %s: %d bytes at %#x are not whole aligned chunks of %d", ErrInvalid,
			a.function, size, uint64(ptr), a.chunkSize)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return Segment{}, fmt.Errorf("%w: function %s: address space closed", ErrInvalid, a.function)
	}
	if a.rangeOf(ptr, size) < 0 {
		return Segment{}, fmt.Errorf("%w: function %s: %d bytes at %#x are not in a reserved range", ErrInvalid,
			a.function, size, uint64(ptr))
	}
	for _, s := range a.segs {
		if !s.freed && s.placed && ptr < s.Ptr+device.Ptr(s.Size) && s.Ptr < ptr+device.Ptr(size) {
			return Segment{}, fmt.Errorf("%w: function %s: %#x overlaps segment %d at %#x", ErrInvalid, a.function,
				uint64(ptr), s.ID, uint64(s.Ptr))
		}
	}
	s := &segState{Segment: Segment{ID: len(a.segs), Ptr: ptr, Size: size, Kind: kind}, placed: true}
	a.segs = append(a.segs, s)
	a.blocks[ptr] = s.ID
	return s.Segment, nil
}

// FreeRange releases a range whose segments have all been freed.
func (a *AddressSpace) FreeRange(ptr device.Ptr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, r := range a.ranges {
		if r.ptr != ptr {
			continue
		}
		for _, s := range a.segs {
			if s.placed && !s.freed && s.Ptr >= r.ptr && uint64(s.Ptr-r.ptr) < r.size {
				return fmt.Errorf("%w: function %s: range %#x still holds segment %d", ErrInvalid, a.function,
					uint64(ptr), s.ID)
			}
		}
		if err := a.dev.FreeAddress(r.ptr, r.size); err != nil {
			return fmt.Errorf("function %s: free range %#x: %w", a.function, uint64(ptr), err)
		}
		a.ranges = append(a.ranges[:i], a.ranges[i+1:]...)
		return nil
	}
	return fmt.Errorf("%w: function %s: no range at %#x", ErrInvalid, a.function, uint64(ptr))
}

// Following returns the live segments placed right after seg in its range, each starting where the one before it
// ends: a block of the function may run across them (PyTorch's expandable segments map the pages of one range one
// by one and place tensors across their boundaries), so whoever reads from seg may read from them. None for a
// segment not placed in a range, or followed by a hole.
func (a *AddressSpace) Following(seg Segment) []Segment {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seg.ID < 0 || seg.ID >= len(a.segs) || !a.segs[seg.ID].placed {
		return nil
	}
	var out []Segment
	for end := seg.Ptr + device.Ptr(seg.Size); ; {
		id, ok := a.blocks[end]
		if !ok || !a.segs[id].placed || a.segs[id].freed || a.segs[id].Ptr != end {
			return out
		}
		out = append(out, a.segs[id].Segment)
		end += device.Ptr(a.segs[id].Size)
	}
}
