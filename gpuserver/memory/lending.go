package memory

import (
	"container/heap"
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Lender lends physical chunks of one node to pools that own none: a tenant executor process borrows its chunks
// from the gpuserver, which created every GPU's chunks at start (docs/tenants.md). Chunk indexes are the lender's.
type Lender interface {
	// Borrow lends n chunks of GPU gpu (each with its physical memory as imported into the borrower); it fails
	// with an error wrapping ErrNoSpace, lending nothing, when fewer can be lent now.
	Borrow(ctx context.Context, gpu, n int) ([]Chunk, error)
	// Return gives chunks back; the borrower released its handles on them (none is mapped any more).
	Return(gpu int, indexes []int) error
}

// NewLendingPool is GPU gpu's pool in a process that borrows its chunks from l: Get takes chunks freed earlier
// in this process first and borrows the rest; Put keeps chunks for the next Get (a chunk freed by one of the
// process's functions is reused by the next without a round trip) until Reclaim gives them back. total is the
// number of chunks of the GPU in the whole node (Total).
func NewLendingPool(ctx context.Context, gpu int, chunkSize uint64, total int, l Lender) *ChunkPool {
	return &ChunkPool{gpu: gpu, chunkSize: chunkSize, out: map[int]bool{}, lender: l, lendCtx: ctx,
		lent: map[int]device.Physical{}, total: total}
}

// borrowLocked takes n chunks: its own free ones first, then borrowed ones. It is called with p.mu held and
// releases it around the lender's call.
func (p *ChunkPool) borrowLocked(n int) ([]Chunk, error) {
	out := make([]Chunk, 0, n)
	for len(out) < n && len(p.free) > 0 {
		idx := heap.Pop(&p.free).(int)
		out = append(out, Chunk{Index: idx, Phys: p.lent[idx]})
	}
	if len(out) < n {
		p.mu.Unlock()
		more, err := p.lender.Borrow(p.lendCtx, p.gpu, n-len(out))
		p.mu.Lock()
		if err != nil {
			for _, c := range out {
				heap.Push(&p.free, c.Index)
			}
			return nil, fmt.Errorf("gpu %d: %d chunks wanted: %w", p.gpu, n, err)
		}
		for _, c := range more {
			p.lent[c.Index] = c.Phys
		}
		out = append(out, more...)
	}
	for _, c := range out {
		p.out[c.Index] = true
	}
	return out, nil
}

// Reclaim gives up to n of the pool's free borrowed chunks back to its lender (their handles released) and
// returns their indexes. It never waits for the lender.
func (p *ChunkPool) Reclaim(n int) ([]int, error) {
	if p.lender == nil {
		return nil, fmt.Errorf("%w: gpu %d: the pool owns its chunks", ErrInvalid, p.gpu)
	}
	p.mu.Lock()
	var idxs []int
	var errs []error
	for len(idxs) < n && len(p.free) > 0 {
		idx := heap.Pop(&p.free).(int)
		errs = append(errs, p.lent[idx].Release())
		delete(p.lent, idx)
		idxs = append(idxs, idx)
	}
	p.mu.Unlock()
	return idxs, errors.Join(errs...)
}

// Borrowed is the number of chunks the pool holds from its lender (free or handed out); 0 for a pool that owns
// its chunks.
func (p *ChunkPool) Borrowed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lent)
}

// FromPools is a Manager over pools made elsewhere (lending pools of a tenant executor); dev is the backend that
// maps their chunks.
func FromPools(dev device.Backend, chunkSize uint64, pools []*ChunkPool) *Manager {
	return &Manager{dev: dev, chunkSize: chunkSize, pools: pools}
}
