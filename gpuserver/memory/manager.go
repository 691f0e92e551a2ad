package memory

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// DefaultShare is the share of each GPU's memory reserved at start when Config.Share is 0.
const DefaultShare = 0.9

// Config configures a Manager.
type Config struct {
	// Share of each GPU's memory (as the driver reports it free at start) reserved as chunks, in (0, 1];
	// DefaultShare when 0.
	Share float64
	// ChunkSize of physical chunks; the largest GPU granularity when 0. It must be a multiple of it.
	ChunkSize uint64
	// MaxBytesPerGPU caps the reservation per GPU (0: no cap); tests and benchmarks keep it small.
	MaxBytesPerGPU uint64
	// SlabChunks is how many chunks one physical allocation holds (1 when 0): a segment whose chunks lie next to
	// each other in one allocation is mapped with one driver call instead of one per chunk (the device must be a
	// device.RangeMapper). Chunks that are lent to other processes (docs/tenants.md) must be allocations of their
	// own: 1.
	SlabChunks int
}

// DefaultSlabChunks is the slab a gpuserver without tenant executors uses: 32 chunks (64 MiB of 2 MiB chunks), so
// that mapping 1 GiB takes 16 driver calls and one access call instead of 512 of each.
const DefaultSlabChunks = 32

// Manager holds every GPU's chunk pool. It is safe for concurrent use.
type Manager struct {
	dev       device.Backend
	ranges    device.RangeMapper // dev, when it maps parts of allocations
	chunkSize uint64
	pools     []*ChunkPool
}

// New reserves each GPU's share of physical memory as chunks.
func New(dev device.Backend, cfg Config) (*Manager, error) {
	if cfg.Share == 0 {
		cfg.Share = DefaultShare
	}
	if cfg.Share < 0 || cfg.Share > 1 {
		return nil, fmt.Errorf("%w: share %v must be in (0, 1]", ErrInvalid, cfg.Share)
	}
	gpus := dev.GPUs()
	if len(gpus) == 0 {
		return nil, fmt.Errorf("memory: %w", device.ErrUnavailable)
	}
	var gran uint64
	for _, g := range gpus {
		gran = max(gran, g.Granularity)
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = gran
	}
	if cfg.SlabChunks == 0 {
		cfg.SlabChunks = 1
	}
	if _, ok := dev.(device.RangeMapper); cfg.SlabChunks < 0 || cfg.SlabChunks > 1 && !ok {
		return nil, fmt.Errorf("%w: %d chunks per physical allocation (the device maps whole allocations only)",
			ErrInvalid, cfg.SlabChunks)
	}
	if cfg.ChunkSize%gran != 0 {
		return nil, fmt.Errorf("%w: chunk size %d must be a multiple of the granularity %d", ErrInvalid,
			cfg.ChunkSize, gran)
	}
	m := &Manager{dev: dev, chunkSize: cfg.ChunkSize}
	m.ranges, _ = dev.(device.RangeMapper)
	for _, g := range gpus {
		free, _, err := dev.MemoryInfo(g.Index)
		if err != nil {
			_ = m.Close(context.Background())
			return nil, fmt.Errorf("gpu %d: memory info: %w", g.Index, err)
		}
		bytes := uint64(float64(free) * cfg.Share)
		if cfg.MaxBytesPerGPU > 0 {
			bytes = min(bytes, cfg.MaxBytesPerGPU)
		}
		p, err := newChunkPool(dev, g.Index, cfg.ChunkSize, int(bytes/cfg.ChunkSize), cfg.SlabChunks)
		if err != nil {
			_ = m.Close(context.Background())
			return nil, err
		}
		m.pools = append(m.pools, p)
	}
	return m, nil
}

// ChunkSize of every pool.
func (m *Manager) ChunkSize() uint64 { return m.chunkSize }

// Pool returns GPU gpu's chunk pool.
func (m *Manager) Pool(gpu int) *ChunkPool { return m.pools[gpu] }

// GPUs is the number of pools.
func (m *Manager) GPUs() int { return len(m.pools) }

// NewAddressSpace returns an address space for a function with this manager's chunk size.
func (m *Manager) NewAddressSpace(function string) *AddressSpace {
	return NewAddressSpace(m.dev, function, m.chunkSize)
}

// MapSegment maps chunks at seg's address (one chunk per chunkSize, in order) and grants access to gpus. On
// error nothing stays mapped.
func (m *Manager) MapSegment(seg Segment, chunks []Chunk, gpus []int) error {
	return m.MapAt(seg.Ptr, chunks, gpus)
}

// MapAt maps chunks consecutively at ptr and grants access to gpus: each run of chunks lying next to each other in
// one physical allocation with one driver call, access for the whole range with one. On error nothing stays
// mapped.
func (m *Manager) MapAt(ptr device.Ptr, chunks []Chunk, gpus []int) error {
	mapped := uint64(0) // bytes mapped from ptr
	for i := 0; i < len(chunks); {
		c, n := chunks[i], 1
		for m.ranges != nil && i+n < len(chunks) && chunks[i+n].Phys == c.Phys &&
			chunks[i+n].Offset == c.Offset+uint64(n)*m.chunkSize {
			n++
		}
		at := ptr + device.Ptr(mapped)
		var err error
		if m.ranges != nil {
			err = m.ranges.MapRange(at, c.Phys, c.Offset, uint64(n)*m.chunkSize)
		} else {
			err = m.dev.Map(at, c.Phys)
		}
		if err != nil {
			if mapped > 0 {
				err = errors.Join(err, m.dev.Unmap(ptr, mapped))
			}
			return fmt.Errorf("map chunks %d to %d at %#x: %w", c.Index, chunks[i+n-1].Index, uint64(at), err)
		}
		mapped += uint64(n) * m.chunkSize
		i += n
	}
	if err := m.dev.SetAccess(ptr, mapped, gpus); err != nil {
		return errors.Join(fmt.Errorf("set access at %#x: %w", uint64(ptr), err), m.dev.Unmap(ptr, mapped))
	}
	return nil
}

// Unmap removes the mappings of size bytes at ptr.
func (m *Manager) Unmap(ptr device.Ptr, size uint64) error { return m.dev.Unmap(ptr, size) }

// Close releases every chunk (none may be mapped).
func (m *Manager) Close(context.Context) error {
	var errs []error
	for _, p := range m.pools {
		if err := p.release(); err != nil {
			errs = append(errs, err)
		}
	}
	m.pools = nil
	return errors.Join(errs...)
}
