package sim

import (
	"errors"
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// simContext is a simulated CUDA context (device.Context): its streams' work touches mapped memory as any work of
// its GPU does, its modules' memory only from itself, and a context fault of its work poisons it alone.
type simContext struct {
	b   *Backend
	gpu int
	id  uint64

	mu        sync.Mutex
	fault     error // sticky: the first context fault of its work
	destroyed bool
	streams   map[*stream]struct{}
	modules   map[*module]struct{}
}

var _ device.Context = (*simContext)(nil)

// NewContext creates a context on a GPU.
func (b *Backend) NewContext(gpu int) (device.Context, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	if err := b.processFault(); err != nil { // as cuDevicePrimaryCtxRetain answers after a fault
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
	b.nextCtx++
	return &simContext{b: b, gpu: gpu, id: b.nextCtx, streams: map[*stream]struct{}{},
		modules: map[*module]struct{}{}}, nil
}

func (c *simContext) GPU() int { return c.gpu }

// usable returns why nothing more can be created in the context: its fault or its destruction.
func (c *simContext) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.destroyed:
		return fmt.Errorf("%w: context destroyed", device.ErrInvalidValue)
	case c.fault != nil:
		return c.fault
	}
	return c.b.processFault()
}

func (c *simContext) NewStream() (device.Stream, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	s, err := c.b.newStream(c.gpu, c)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.streams[s] = struct{}{}
	c.mu.Unlock()
	return s, nil
}

func (c *simContext) NewEvent() (device.Event, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	return c.b.NewEvent(c.gpu)
}

func (c *simContext) NewTimedEvent() (device.Event, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	return c.b.NewTimedEvent(c.gpu)
}

func (c *simContext) LoadModule(image []byte) (device.Module, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	m, err := c.b.loadModule(c.gpu, c, image)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.modules[m] = struct{}{}
	c.mu.Unlock()
	return m, nil
}

// Err returns the context's sticky fault (or the process's, with Options.ProcessWide).
func (c *simContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault != nil {
		return c.fault
	}
	return c.b.processFault()
}

// poison records the context's first fault.
func (c *simContext) poison(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault == nil {
		c.fault = fmt.Errorf("context %d on gpu %d was poisoned by a fault of its work: %w", c.id, c.gpu, err)
	}
}

// Destroy stops the context's streams, dropping the work still queued on them (a kernel running finishes), and
// unloads its modules.
func (c *simContext) Destroy() error {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return fmt.Errorf("%w: context destroyed twice", device.ErrInvalidValue)
	}
	c.destroyed = true
	streams, modules := c.streams, c.modules
	c.streams, c.modules = nil, nil
	c.mu.Unlock()
	var errs []error
	for s := range streams {
		s.aborted.Store(true)
	}
	for s := range streams {
		if !s.isDestroyed() {
			errs = append(errs, s.Destroy())
		}
	}
	for m := range modules {
		if !m.isUnloaded() {
			errs = append(errs, m.Unload())
		}
	}
	return errors.Join(errs...)
}

// forget drops a stream the caller destroyed itself.
func (c *simContext) forget(s *stream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.streams, s)
}
