package memory

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrNoSpace is returned when an allocator has no room for a request.
var ErrNoSpace = errors.New("no space")

// ErrInvalid is wrapped by errors about bad sizes or offsets.
var ErrInvalid = errors.New("invalid memory request")

// Buddy is a binary buddy allocator over [0, Size) with blocks of MinBlock << k bytes. It is not safe for
// concurrent use.
type Buddy struct {
	size     uint64
	minBlock uint64
	orders   int
	free     []map[uint64]struct{} // per order: offsets of free blocks
	alloc    map[uint64]int        // offset -> order of allocated blocks
	used     uint64
}

// NewBuddy returns an allocator over size bytes (a power of two) with the given minimum block (a power of two).
func NewBuddy(size, minBlock uint64) (*Buddy, error) {
	if size == 0 || minBlock == 0 || size&(size-1) != 0 || minBlock&(minBlock-1) != 0 || minBlock > size {
		return nil, fmt.Errorf("%w: buddy size %d and minimum block %d must be powers of two, minimum <= size",
			ErrInvalid, size, minBlock)
	}
	orders := bits.TrailingZeros64(size/minBlock) + 1
	b := &Buddy{size: size, minBlock: minBlock, orders: orders, free: make([]map[uint64]struct{}, orders),
		alloc: map[uint64]int{}}
	for i := range b.free {
		b.free[i] = map[uint64]struct{}{}
	}
	b.free[orders-1][0] = struct{}{}
	return b, nil
}

// Size is the managed size.
func (b *Buddy) Size() uint64 { return b.size }

// Used is the bytes in allocated blocks (rounded up sizes).
func (b *Buddy) Used() uint64 { return b.used }

// Alloc returns the offset of a block of at least n bytes, aligned to its own (power-of-two) size.
func (b *Buddy) Alloc(n uint64) (uint64, error) {
	if n == 0 || n > b.size {
		return 0, fmt.Errorf("%w: buddy allocation of %d bytes (size %d)", ErrInvalid, n, b.size)
	}
	order := b.orderFor(n)
	k := order
	for k < b.orders && len(b.free[k]) == 0 {
		k++
	}
	if k == b.orders {
		return 0, fmt.Errorf("%w: %d bytes", ErrNoSpace, n)
	}
	off := lowest(b.free[k])
	delete(b.free[k], off)
	for k > order { // split, keeping the lower half
		k--
		b.free[k][off+b.minBlock<<k] = struct{}{}
	}
	b.alloc[off] = order
	b.used += b.minBlock << order
	return off, nil
}

// Free returns the block at off and merges it with free buddies.
func (b *Buddy) Free(off uint64) error {
	order, ok := b.alloc[off]
	if !ok {
		return fmt.Errorf("%w: no buddy block at offset %d", ErrInvalid, off)
	}
	delete(b.alloc, off)
	b.used -= b.minBlock << order
	for order < b.orders-1 {
		buddy := off ^ (b.minBlock << order)
		if _, free := b.free[order][buddy]; !free {
			break
		}
		delete(b.free[order], buddy)
		off = min(off, buddy)
		order++
	}
	b.free[order][off] = struct{}{}
	return nil
}

// BlockSize is the size of the allocated block at off (0 if none).
func (b *Buddy) BlockSize(off uint64) uint64 {
	order, ok := b.alloc[off]
	if !ok {
		return 0
	}
	return b.minBlock << order
}

// LargestFree is the largest block that Alloc can return now.
func (b *Buddy) LargestFree() uint64 {
	for k := b.orders - 1; k >= 0; k-- {
		if len(b.free[k]) > 0 {
			return b.minBlock << k
		}
	}
	return 0
}

// Empty reports whether nothing is allocated.
func (b *Buddy) Empty() bool { return len(b.alloc) == 0 }

func (b *Buddy) orderFor(n uint64) int {
	blocks := (n + b.minBlock - 1) / b.minBlock
	return bits.Len64(blocks - 1)
}

func lowest(m map[uint64]struct{}) uint64 {
	first := true
	var lo uint64
	for k := range m {
		if first || k < lo {
			lo, first = k, false
		}
	}
	return lo
}
