package memory

import (
	"fmt"
	"sort"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Kind says whether a block belongs to the model image or is scratch.
type Kind int

const (
	// KindModel blocks are allocated before the image is captured; their bytes are swapped in.
	KindModel Kind = iota
	// KindScratch blocks are allocated after capture; they are not in the image. The executor writes their bytes
	// back to the host when the function's copy leaves a GPU and restores them at its next swap-in, unless the
	// function declares its scratch its requests' own (then they are mapped zeroed).
	KindScratch
	// KindInit blocks are allocated after capture by a process of the function that is still initialising (a
	// replica started after the function's first request): not in the image, and always the function's own, so
	// the executor writes them back and restores them like scratch the function keeps, whatever its scratch mode.
	// They never share a segment with scratch: a request's scratch may be given back at its end.
	KindInit
)

func (k Kind) String() string {
	switch k {
	case KindScratch:
		return "scratch"
	case KindInit:
		return "init"
	}
	return "model"
}

// minSmallBlock is the minimum (and alignment) of blocks packed into shared segments.
const minSmallBlock = 256

// Segment is a reservation of whole chunks at a fixed address: the unit of mapping, swapping and readiness.
type Segment struct {
	// ID numbers the function's segments from 0 in creation order.
	ID int
	// Ptr is the segment's fixed device address.
	Ptr device.Ptr
	// Size is a whole number of chunks.
	Size uint64
	// Kind of every block in the segment.
	Kind Kind
}

// Chunks is the number of chunks of chunkSize the segment needs.
func (s Segment) Chunks(chunkSize uint64) int { return int(s.Size / chunkSize) }

// Contains reports whether p lies in the segment.
func (s Segment) Contains(p device.Ptr) bool { return p >= s.Ptr && uint64(p-s.Ptr) < s.Size }

type segState struct {
	Segment
	small  *Buddy // shared segment of small blocks; nil for a segment of one large block
	freed  bool   // a large block's segment whose block was freed (kept reserved: its address is never reused)
	placed bool   // placed by AllocAt in one of the function's ranges (its range holds the reservation)
}

// AddressSpace is one function's blocks at fixed addresses. It is safe for concurrent use.
type AddressSpace struct {
	dev       device.Backend
	function  string
	chunkSize uint64

	mu     sync.Mutex
	segs   []*segState // by ID
	blocks map[device.Ptr]int
	ranges []addrRange // reserved by ReserveRange, for segments placed with AllocAt
	closed bool
}

// NewAddressSpace returns an empty address space for a function; chunkSize is the physical chunk size (a multiple
// of every GPU's granularity).
func NewAddressSpace(dev device.Backend, function string, chunkSize uint64) *AddressSpace {
	return &AddressSpace{dev: dev, function: function, chunkSize: chunkSize, blocks: map[device.Ptr]int{}}
}

// Function is the owner's name.
func (a *AddressSpace) Function() string { return a.function }

// Alloc reserves a block of size bytes of the given kind and returns its fixed address. The segment the block lands
// in is returned too (new reports whether it was created by this call; it then needs backing wherever the function
// is resident).
func (a *AddressSpace) Alloc(size uint64, kind Kind) (ptr device.Ptr, seg Segment, created bool, err error) {
	if size == 0 {
		return 0, Segment{}, false, fmt.Errorf("%w: function %s: allocation of 0 bytes", ErrInvalid, a.function)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, Segment{}, false, fmt.Errorf("%w: function %s: address space closed", ErrInvalid, a.function)
	}
	if size < a.chunkSize/2 {
		for _, s := range a.segs {
			if s.small == nil || s.Kind != kind || s.small.LargestFree() < size {
				continue
			}
			off, err := s.small.Alloc(size)
			if err != nil {
				continue
			}
			p := s.Ptr + device.Ptr(off)
			a.blocks[p] = s.ID
			return p, s.Segment, false, nil
		}
		s, err := a.newSegment(a.chunkSize, kind)
		if err != nil {
			return 0, Segment{}, false, err
		}
		if s.small, err = NewBuddy(a.chunkSize, minSmallBlock); err != nil {
			return 0, Segment{}, false, err
		}
		off, err := s.small.Alloc(size)
		if err != nil {
			return 0, Segment{}, false, err
		}
		a.blocks[s.Ptr+device.Ptr(off)] = s.ID
		return s.Ptr + device.Ptr(off), s.Segment, true, nil
	}
	s, err := a.newSegment((size+a.chunkSize-1)/a.chunkSize*a.chunkSize, kind)
	if err != nil {
		return 0, Segment{}, false, err
	}
	a.blocks[s.Ptr] = s.ID
	return s.Ptr, s.Segment, true, nil
}

func (a *AddressSpace) newSegment(size uint64, kind Kind) (*segState, error) {
	p, err := a.dev.ReserveAddress(size, 0)
	if err != nil {
		return nil, fmt.Errorf("function %s: reserve %d bytes: %w", a.function, size, err)
	}
	s := &segState{Segment: Segment{ID: len(a.segs), Ptr: p, Size: size, Kind: kind}}
	a.segs = append(a.segs, s)
	return s, nil
}

// Free releases a block. Its address range stays reserved for the function (a segment's address never changes);
// a shared segment's room is reused by later small blocks.
func (a *AddressSpace) Free(ptr device.Ptr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.blocks[ptr]
	if !ok {
		return fmt.Errorf("%w: function %s: no block at %#x", ErrInvalid, a.function, uint64(ptr))
	}
	delete(a.blocks, ptr)
	s := a.segs[id]
	if s.small != nil {
		return s.small.Free(uint64(ptr - s.Ptr))
	}
	s.freed = true
	return nil
}

// Segments returns the function's segments in ID order.
func (a *AddressSpace) Segments() []Segment {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Segment, len(a.segs))
	for i, s := range a.segs {
		out[i] = s.Segment
	}
	return out
}

// Holds reports whether segment id holds at least one allocated block: a segment of one block until it is freed, a
// shared segment while one of its small blocks is allocated. A segment that holds none has no bytes anyone may read.
func (a *AddressSpace) Holds(id int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id < 0 || id >= len(a.segs) {
		return false
	}
	s := a.segs[id]
	if s.small != nil {
		return !s.small.Empty()
	}
	return !s.freed
}

// Blocks lists the addresses of the allocated blocks of the given kind.
func (a *AddressSpace) Blocks(kind Kind) []device.Ptr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []device.Ptr
	for p, id := range a.blocks {
		if a.segs[id].Kind == kind {
			out = append(out, p)
		}
	}
	return out
}

// Allocated reports whether a block starts at p.
func (a *AddressSpace) Allocated(p device.Ptr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.blocks[p]
	return ok
}

// Lookup returns the segment containing p: a live one when a freed segment placed in a range (AllocAt) shares its
// addresses.
func (a *AddressSpace) Lookup(p device.Ptr) (Segment, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := sort.Search(len(a.segs), func(i int) bool { return uint64(a.segs[i].Ptr)+a.segs[i].Size > uint64(p) })
	// segments are reserved in increasing address order on both backends, but do not rely on it
	if i < len(a.segs) && a.segs[i].Contains(p) && !(a.segs[i].placed && a.segs[i].freed) {
		return a.segs[i].Segment, true
	}
	var freed *segState
	for _, s := range a.segs {
		if !s.Contains(p) {
			continue
		}
		if !(s.placed && s.freed) {
			return s.Segment, true
		}
		freed = s
	}
	if freed != nil {
		return freed.Segment, true
	}
	return Segment{}, false
}

// Bytes returns the bytes of model and scratch segments.
func (a *AddressSpace) Bytes() (model, scratch uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.segs {
		if s.Kind == KindModel {
			model += s.Size
		} else {
			scratch += s.Size
		}
	}
	return model, scratch
}

// Close frees every reservation; no segment may be mapped any more.
func (a *AddressSpace) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var first error
	for _, s := range a.segs {
		if s.placed {
			continue // its range holds the reservation
		}
		if err := a.dev.FreeAddress(s.Ptr, s.Size); err != nil && first == nil {
			first = fmt.Errorf("function %s: free segment %d: %w", a.function, s.ID, err)
		}
	}
	for _, r := range a.ranges {
		if err := a.dev.FreeAddress(r.ptr, r.size); err != nil && first == nil {
			first = fmt.Errorf("function %s: free range %#x: %w", a.function, uint64(r.ptr), err)
		}
	}
	a.ranges = nil
	return first
}
