package cuda

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

// cudaContext is a CUDA context of its own on one GPU (cuCtxCreate): a tenant's streams, events and modules. Its
// sticky fault is the first context fault its work reported (the driver answers every later call in the context
// with the same error).
//
// Destroying a context while another thread is inside a call on it is undefined behaviour in the driver, and the
// gpuserver tears a tenant's context down from one session while another session of the tenant may be waiting on
// one of its streams. So every object of the context is handed out wrapped (guardedStream, guardedEvent,
// guardedModule): each call holds the context's use lock for reading, Destroy holds it for writing, and a call
// after Destroy fails cleanly. After a fault the driver ends the context's work at once, so Destroy does not wait
// long.
type cudaContext struct {
	b   *Backend
	gpu int
	ctx cu.Context

	use       sync.RWMutex // held for reading by every call in the context, for writing by Destroy
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

// enter starts a call in the context; the returned func ends it.
func (c *cudaContext) enter() (func(), error) {
	c.use.RLock()
	c.mu.Lock()
	destroyed := c.destroyed
	c.mu.Unlock()
	if destroyed {
		c.use.RUnlock()
		return nil, fmt.Errorf("%w: the context was destroyed", device.ErrInvalidValue)
	}
	return c.use.RUnlock, nil
}

// usable is enter for calls that create objects: a poisoned context creates nothing.
func (c *cudaContext) usable() (func(), error) {
	done, err := c.enter()
	if err != nil {
		return nil, err
	}
	if err := c.Err(); err != nil {
		done()
		return nil, err
	}
	return done, nil
}

func (c *cudaContext) NewStream() (device.Stream, error) {
	done, err := c.usable()
	if err != nil {
		return nil, err
	}
	defer done()
	s, err := cu.StreamCreate(c.ctx)
	if err != nil {
		return nil, c.note(wrap(err))
	}
	return &guardedStream{s: &stream{b: c.b, gpu: c.gpu, ctx: c.ctx, s: s}, c: c}, nil
}

func (c *cudaContext) NewEvent() (device.Event, error) { return c.newEvent(false) }

func (c *cudaContext) NewTimedEvent() (device.Event, error) { return c.newEvent(true) }

func (c *cudaContext) newEvent(timing bool) (device.Event, error) {
	done, err := c.usable()
	if err != nil {
		return nil, err
	}
	defer done()
	e, err := cu.EventCreate(c.ctx, timing)
	if err != nil {
		return nil, c.note(wrap(err))
	}
	return &guardedEvent{e: &event{ctx: c.ctx, e: e, timing: timing}, c: c}, nil
}

func (c *cudaContext) LoadModule(image []byte) (device.Module, error) {
	done, err := c.usable()
	if err != nil {
		return nil, err
	}
	defer done()
	m, err := c.b.loadModule(c.gpu, c.ctx, image)
	if err != nil {
		return nil, c.note(err)
	}
	return &guardedModule{m: m, c: c}, nil
}

func (c *cudaContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fault
}

// note records err as the context's sticky fault when it is one, and returns it.
func (c *cudaContext) note(err error) error {
	if err == nil || !device.IsContextFault(err) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault == nil {
		c.fault = fmt.Errorf("a context of gpu %d was poisoned by a fault of its work: %w", c.gpu, err)
	}
	return err
}

// call runs f inside the context and notes its fault.
func (c *cudaContext) call(f func() error) error {
	done, err := c.enter()
	if err != nil {
		return err
	}
	defer done()
	return c.note(f())
}

// Destroy destroys the CUDA context with everything created in it, once no call is inside it; it works on a
// poisoned context.
func (c *cudaContext) Destroy() error {
	c.use.Lock()
	defer c.use.Unlock()
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return errors.New("cuda: context destroyed twice")
	}
	c.destroyed = true
	c.mu.Unlock()
	return wrap(cu.CtxDestroy(c.ctx))
}

// guardedStream is a stream of a context of its own (see cudaContext).
type guardedStream struct {
	s *stream
	c *cudaContext
}

func (g *guardedStream) GPU() int { return g.s.gpu }
func (g *guardedStream) CopyHtoD(dst device.Ptr, src []byte) error {
	return g.c.call(func() error { return g.s.CopyHtoD(dst, src) })
}
func (g *guardedStream) CopyDtoH(dst []byte, src device.Ptr) error {
	return g.c.call(func() error { return g.s.CopyDtoH(dst, src) })
}
func (g *guardedStream) CopyDtoD(dst, src device.Ptr, size uint64) error {
	return g.c.call(func() error { return g.s.CopyDtoD(dst, src, size) })
}
func (g *guardedStream) Memset8(dst device.Ptr, v uint8, n uint64) error {
	return g.c.call(func() error { return g.s.Memset8(dst, v, n) })
}
func (g *guardedStream) Memset32(dst device.Ptr, v uint32, n uint64) error {
	return g.c.call(func() error { return g.s.Memset32(dst, v, n) })
}
func (g *guardedStream) Launch(f device.Function, grid, block device.Dim3, sharedMem uint32, args []byte) error {
	return g.c.call(func() error { return g.s.Launch(f, grid, block, sharedMem, args) })
}
func (g *guardedStream) LaunchEx(f device.Function, grid, block device.Dim3, sharedMem uint32,
	attrs []device.LaunchAttribute, args []byte) error {
	raw := make([]device.LaunchAttribute, len(attrs))
	for i, a := range attrs {
		raw[i] = a
		if a.Event != nil {
			raw[i].Event = unguard(a.Event)
		}
	}
	return g.c.call(func() error { return g.s.LaunchEx(f, grid, block, sharedMem, raw, args) })
}
func (g *guardedStream) Record(e device.Event) error {
	return g.c.call(func() error { return g.s.Record(unguard(e)) })
}
func (g *guardedStream) Wait(e device.Event) error {
	return g.c.call(func() error { return g.s.Wait(unguard(e)) })
}
func (g *guardedStream) Synchronize(ctx context.Context) error {
	return g.c.call(func() error { return g.s.Synchronize(ctx) })
}
func (g *guardedStream) Destroy() error { return g.c.call(g.s.Destroy) }

// unguard returns the driver event behind a context's event.
func unguard(e device.Event) device.Event {
	if ge, ok := e.(*guardedEvent); ok {
		return ge.e
	}
	return e
}

// guardedEvent is an event of a context of its own.
type guardedEvent struct {
	e *event
	c *cudaContext
}

func (g *guardedEvent) Query() (done bool, err error) {
	err = g.c.call(func() error {
		var qerr error
		done, qerr = g.e.Query()
		return qerr
	})
	return done, err
}
func (g *guardedEvent) Synchronize(ctx context.Context) error {
	return g.c.call(func() error { return g.e.Synchronize(ctx) })
}
func (g *guardedEvent) Destroy() error { return g.c.call(g.e.Destroy) }
func (g *guardedEvent) Elapsed(start device.Event) (d time.Duration, err error) {
	err = g.c.call(func() error {
		var eerr error
		d, eerr = g.e.Elapsed(unguard(start))
		return eerr
	})
	return d, err
}

// guardedModule is a module of a context of its own; its functions are the driver's (launches check that they
// run in the module's context).
type guardedModule struct {
	m *module
	c *cudaContext
}

func (g *guardedModule) GPU() int { return g.m.gpu }
func (g *guardedModule) Function(name string) (f device.Function, err error) {
	err = g.c.call(func() error {
		var ferr error
		f, ferr = g.m.Function(name)
		return ferr
	})
	return f, err
}
func (g *guardedModule) Global(name string) (p device.Ptr, size uint64, err error) {
	err = g.c.call(func() error {
		var gerr error
		p, size, gerr = g.m.Global(name)
		return gerr
	})
	return p, size, err
}
func (g *guardedModule) Unload() error           { return g.c.call(g.m.Unload) }
func (g *guardedModule) FunctionNames() []string { return g.m.FunctionNames() }

// The wrappers keep the optional interfaces of what they wrap: a launch with attributes (cuLaunchKernelEx) or a
// kernel list through a tenant's context must not answer NOT_SUPPORTED where the primary context's would not.
var (
	_ device.ExtendedLauncher = (*guardedStream)(nil)
	_ device.EnumerableModule = (*guardedModule)(nil)
)

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
