package memory

import (
	"container/heap"
	"context"
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Chunk is one piece of physical memory of a ChunkPool.
type Chunk struct {
	// Index of the chunk in its pool (lower indexes are handed out first).
	Index int
	// Phys is the driver's physical allocation holding the chunk, at Offset: a slab of several chunks
	// (Config.SlabChunks), or the chunk's own allocation (Offset 0).
	Phys   device.Physical
	Offset uint64
}

// ChunkPool is one GPU's physical memory, created at start as chunks of one size. It is safe for concurrent use.
type ChunkPool struct {
	gpu       int
	chunkSize uint64
	chunks    []Chunk           // by index
	slabs     []device.Physical // the physical allocations the chunks lie in

	mu   sync.Mutex
	free intHeap
	out  map[int]bool

	// A lending pool (lending.go) owns no chunks: it borrows them from lender.
	lender  Lender
	lendCtx context.Context
	lent    map[int]device.Physical // chunks borrowed and not given back, free or handed out
	total   int                     // the node's chunks of the GPU
}

// NewChunkPool creates count chunks of chunkSize bytes on GPU gpu, each a physical allocation of its own. On error
// the chunks created so far are released.
func NewChunkPool(dev device.Backend, gpu int, chunkSize uint64, count int) (*ChunkPool, error) {
	return newChunkPool(dev, gpu, chunkSize, count, 1)
}

// newChunkPool creates count chunks of chunkSize bytes on GPU gpu, slab of them to a physical allocation (the last
// allocation holds the remainder).
func newChunkPool(dev device.Backend, gpu int, chunkSize uint64, count, slab int) (*ChunkPool, error) {
	if count <= 0 || chunkSize == 0 || slab <= 0 {
		return nil, fmt.Errorf("%w: chunk pool of %d chunks of %d bytes, %d per allocation", ErrInvalid, count,
			chunkSize, slab)
	}
	p := &ChunkPool{gpu: gpu, chunkSize: chunkSize, out: map[int]bool{}}
	for i := 0; i < count; i += slab {
		n := min(slab, count-i)
		ph, err := dev.CreatePhysical(gpu, uint64(n)*chunkSize)
		if err != nil {
			_ = p.release()
			return nil, fmt.Errorf("gpu %d: create chunks %d to %d of %d: %w", gpu, i, i+n-1, count, err)
		}
		p.slabs = append(p.slabs, ph)
		for k := range n {
			p.chunks = append(p.chunks, Chunk{Index: i + k, Phys: ph, Offset: uint64(k) * chunkSize})
			p.free = append(p.free, i+k)
		}
	}
	heap.Init(&p.free)
	return p, nil
}

// GPU of the pool.
func (p *ChunkPool) GPU() int { return p.gpu }

// ChunkSize is the size of every chunk.
func (p *ChunkPool) ChunkSize() uint64 { return p.chunkSize }

// Total is the number of chunks (of the whole node's GPU, for a lending pool).
func (p *ChunkPool) Total() int {
	if p.lender != nil {
		return p.total
	}
	return len(p.chunks)
}

// Free is the number of chunks not handed out.
func (p *ChunkPool) Free() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.free)
}

// Get takes n chunks, lowest indexes first; it fails with ErrNoSpace (taking nothing) when fewer are free.
func (p *ChunkPool) Get(n int) ([]Chunk, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n <= 0 {
		return nil, fmt.Errorf("%w: get %d chunks", ErrInvalid, n)
	}
	if p.lender != nil {
		return p.borrowLocked(n)
	}
	if n > len(p.free) {
		return nil, fmt.Errorf("%w: gpu %d: %d chunks wanted, %d of %d free", ErrNoSpace, p.gpu, n, len(p.free),
			len(p.chunks))
	}
	out := make([]Chunk, n)
	for i := range out {
		idx := heap.Pop(&p.free).(int)
		p.out[idx] = true
		out[i] = p.chunks[idx]
	}
	return out, nil
}

// Put returns chunks to the pool.
func (p *ChunkPool) Put(chunks []Chunk) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range chunks {
		if c.Index < 0 || (p.lender == nil && c.Index >= len(p.chunks)) || !p.out[c.Index] {
			return fmt.Errorf("%w: gpu %d: chunk %d is not handed out", ErrInvalid, p.gpu, c.Index)
		}
	}
	for _, c := range chunks {
		delete(p.out, c.Index)
		heap.Push(&p.free, c.Index)
	}
	return nil
}

// release frees every chunk's physical memory (chunks must be unmapped); a lending pool releases its handles on
// the chunks it borrowed (the lender keeps the memory).
func (p *ChunkPool) release() error {
	var first error
	for idx, ph := range p.lent {
		if err := ph.Release(); err != nil && first == nil {
			first = err
		}
		delete(p.lent, idx)
	}
	for _, ph := range p.slabs {
		if err := ph.Release(); err != nil && first == nil {
			first = err
		}
	}
	p.chunks, p.slabs = nil, nil
	return first
}

type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
