package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

// cudaContext is a CUDA context of its own on one GPU (cuCtxCreate): a tenant's streams, events and modules. Its
// sticky fault is what its streams' synchronisations reported first (the driver answers every later call in the
// context with the same error).
type cudaContext struct {
	b   *Backend
	gpu int
	ctx cu.Context

	mu        sync.Mutex
	fault     error
	destroyed bool
}

var _ device.Context = (*cudaContext)(nil)

// NewContext creates a CUDA context of its own on a GPU.
func (b *Backend) NewContext(i int) (device.Context, error) {
	g, err := b.gpu(i)
	if err != nil {
		return nil, err
	}
	ctx, err := cu.CtxCreate(g.dev)
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", i, wrap(err))
	}
	return &cudaContext{b: b, gpu: i, ctx: ctx}, nil
}

func (c *cudaContext) GPU() int { return c.gpu }

func (c *cudaContext) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed:
		return fmt.Errorf("%w: context destroyed", device.ErrInvalidValue)
	case c.fault != nil:
		return c.fault
	}
	return nil
}

func (c *cudaContext) NewStream() (device.Stream, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	s, err := cu.StreamCreate(c.ctx)
	if err != nil {
		return nil, c.note(wrap(err))
	}
	return &stream{b: c.b, gpu: c.gpu, ctx: c.ctx, s: s, owner: c}, nil
}

func (c *cudaContext) NewEvent() (device.Event, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	e, err := cu.EventCreate(c.ctx)
	if err != nil {
		return nil, c.note(wrap(err))
	}
	return &event{ctx: c.ctx, e: e}, nil
}

func (c *cudaContext) LoadModule(image []byte) (device.Module, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	m, err := c.b.loadModule(c.gpu, c.ctx, image)
	if err != nil {
		return nil, c.note(err)
	}
	return m, nil
}

func (c *cudaContext) Err() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fault
}

// note records err as the context's sticky fault when it is one, and returns it.
func (c *cudaContext) note(err error) error {
	if c == nil || err == nil || !device.IsContextFault(err) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault == nil {
		c.fault = fmt.Errorf("a context of gpu %d was poisoned by a fault of its work: %w", c.gpu, err)
	}
	return err
}

// Destroy destroys the CUDA context with everything created in it; it works on a poisoned context.
func (c *cudaContext) Destroy() error {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return errors.New("cuda: context destroyed twice")
	}
	c.destroyed = true
	c.mu.Unlock()
	return wrap(cu.CtxDestroy(c.ctx))
}

// PageableMemoryAccess reports whether kernels on GPU i can read and write the host's pageable memory (HMM or
// ATS): then a kernel of any function can read the whole gpuserver process's memory (other functions' model
// images, its key), and no context or mapping discipline isolates tenants. docs/security.md says how to turn it
// off (nvidia_uvm uvm_disable_hmm=1); the gpuserver logs an error at start when it is on.
func (b *Backend) PageableMemoryAccess(i int) bool {
	g, err := b.gpu(i)
	if err != nil {
		return false
	}
	v, err := cu.DeviceAttribute(cu.AttrPageableMemoryAccess, g.dev)
	return err == nil && v != 0
}
