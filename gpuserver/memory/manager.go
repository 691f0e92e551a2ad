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
}

// Manager holds every GPU's chunk pool. It is safe for concurrent use.
type Manager struct {
	dev       device.Backend
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
	if cfg.ChunkSize%gran != 0 {
		return nil, fmt.Errorf("%w: chunk size %d must be a multiple of the granularity %d", ErrInvalid,
			cfg.ChunkSize, gran)
	}
	m := &Manager{dev: dev, chunkSize: cfg.ChunkSize}
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
		p, err := NewChunkPool(dev, g.Index, cfg.ChunkSize, int(bytes/cfg.ChunkSize))
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

// MapAt maps chunks consecutively at ptr and grants access to gpus. On error nothing stays mapped.
func (m *Manager) MapAt(ptr device.Ptr, chunks []Chunk, gpus []int) error {
	for i, c := range chunks {
		if err := m.dev.Map(ptr+device.Ptr(uint64(i)*m.chunkSize), c.Phys); err != nil {
			if i > 0 {
				err = errors.Join(err, m.dev.Unmap(ptr, uint64(i)*m.chunkSize))
			}
			return fmt.Errorf("map chunk %d at %#x: %w", c.Index, uint64(ptr)+uint64(i)*m.chunkSize, err)
		}
	}
	size := uint64(len(chunks)) * m.chunkSize
	if err := m.dev.SetAccess(ptr, size, gpus); err != nil {
		return errors.Join(fmt.Errorf("set access at %#x: %w", uint64(ptr), err), m.dev.Unmap(ptr, size))
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
