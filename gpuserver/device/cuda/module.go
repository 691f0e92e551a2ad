package cuda

import (
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/ptx"
)

type module struct {
	b       *Backend
	gpu     int
	ctx     cu.Context
	m       cu.Module
	entries map[string][]device.Param // from PTX text, when the image is PTX

	// funcs are the kernels resolved so far: each is looked up (cuModuleGetFunction) and its parameter layout
	// read (cuFuncGetParamInfo per parameter) once per module, so once per GPU and context, not per launch.
	mu    sync.Mutex
	funcs map[string]*function
}

type function struct {
	mod    *module
	name   string
	f      cu.Function
	params []device.Param
}

func (f *function) Name() string           { return f.name }
func (f *function) Params() []device.Param { return append([]device.Param(nil), f.params...) }

// LoadModule loads PTX text or a cubin on a GPU (in its primary context).
func (b *Backend) LoadModule(i int, image []byte) (device.Module, error) {
	g, err := b.gpu(i)
	if err != nil {
		return nil, err
	}
	m, err := b.loadModule(i, g.ctx, image)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// loadModule loads an image in ctx, a context of GPU i.
func (b *Backend) loadModule(i int, ctx cu.Context, image []byte) (*module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("%w: empty image", device.ErrInvalidImage)
	}
	mod := &module{b: b, gpu: i, ctx: ctx, entries: map[string][]device.Param{}}
	img := image
	if ptx.IsPTX(image) {
		entries, err := ptx.Entries(image)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
		}
		for _, e := range entries {
			mod.entries[e.Name] = e.Params
		}
		if image[len(image)-1] != 0 {
			img = append(append([]byte(nil), image...), 0) // the driver reads PTX as a C string
		}
	}
	m, err := cu.ModuleLoad(ctx, img)
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", i, wrap(err))
	}
	mod.m = m
	return mod, nil
}

func (m *module) GPU() int { return m.gpu }

func (m *module) Function(name string) (device.Function, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fn, ok := m.funcs[name]; ok {
		return fn, nil
	}
	fn, err := m.resolve(name)
	if err != nil {
		return nil, err
	}
	if m.funcs == nil {
		m.funcs = map[string]*function{}
	}
	m.funcs[name] = fn
	return fn, nil
}

// resolve asks the driver for kernel name and its parameter layout.
func (m *module) resolve(name string) (*function, error) {
	f, err := cu.ModuleFunction(m.ctx, m.m, name)
	if err != nil {
		return nil, fmt.Errorf("kernel %q: %w", name, wrap(err))
	}
	fn := &function{mod: m, name: name, f: f}
	if offs, sizes, ok := cu.ParamInfo(m.ctx, f); ok {
		for i := range offs {
			fn.params = append(fn.params, device.Param{Offset: uint32(offs[i]), Size: uint32(sizes[i])})
		}
	} else if p, ok := m.entries[name]; ok {
		fn.params = p
	} else {
		return nil, fmt.Errorf("%w: kernel %q: the driver cannot report its parameters (CUDA < 12.4) and the image "+
			"is not PTX", device.ErrNotSupported, name)
	}
	return fn, nil
}

func (m *module) Global(name string) (device.Ptr, uint64, error) {
	p, size, err := cu.ModuleGlobal(m.ctx, m.m, name)
	if err != nil {
		return 0, 0, fmt.Errorf("global %q: %w", name, wrap(err))
	}
	return device.Ptr(p), size, nil
}

func (m *module) Unload() error { return wrap(cu.ModuleUnload(m.ctx, m.m)) }
