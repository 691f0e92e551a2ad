package sim

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// module is a module image loaded on one simulated GPU.
type module struct {
	b        *Backend
	gpu      int
	ctx      *simContext // nil: the backend's own context of the GPU
	who      int         // its context's view of memory (see who)
	source   string
	funcs    map[string]*function
	globals  map[string]global
	reserve  device.Ptr
	resSize  uint64
	phys     device.Physical
	mu       sync.Mutex
	unloaded bool
}

type global struct {
	ptr  device.Ptr
	size uint64
}

type function struct {
	mod    *module
	name   string
	params []device.Param
	attrs  device.FunctionAttributes
	kernel kernelFunc // nil: the sim cannot compute it
	work   workFunc   // the kernel's element operations per launch (with kernel)
	time   kernelTime // set for busy: its GPU time comes from its argument
	// unlike says why a kernel named like a reference kernel is not one (its layout differs).
	unlike string
}

func (f *function) Name() string                          { return f.name }
func (f *function) Params() []device.Param                { return append([]device.Param(nil), f.params...) }
func (f *function) Attributes() device.FunctionAttributes { return f.attrs }

var _ device.AttributedFunction = (*function)(nil)

// LoadModule loads PTX text, a cubin or a fat binary on a GPU (see the package documentation for how an image is
// chosen and what runs); its globals get memory on that GPU, with their initial bytes.
func (b *Backend) LoadModule(gpu int, img []byte) (device.Module, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	m, err := b.loadModule(gpu, nil, img)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// loadModule loads a module in a context (nil: the backend's own); its memory belongs to that context.
func (b *Backend) loadModule(gpu int, ctx *simContext, img []byte) (*module, error) {
	im, err := decodeImage(img, b.gpus[gpu].ComputeCapability)
	if err != nil {
		return nil, fmt.Errorf("sim: gpu %d: %w", gpu, err)
	}
	m := &module{b: b, gpu: gpu, ctx: ctx, who: who(gpu, 0), source: im.source, funcs: map[string]*function{},
		globals: map[string]global{}}
	if ctx != nil {
		m.who = who(gpu, ctx.id)
	}
	if err := m.place(im); err != nil {
		return nil, err
	}
	for _, k := range im.kernels {
		if _, dup := m.funcs[k.name]; dup {
			continue // the first of two kernels of the same name, as cuModuleGetFunction finds it
		}
		f := &function{mod: m, name: k.name, params: k.params, attrs: k.attrs}
		f.kernel, f.work, f.time, f.unlike = m.reference(k)
		m.funcs[k.name] = f
	}
	return m, nil
}

// place gives the module's data segments memory on its GPU (one reservation, each segment aligned), writes their
// initial bytes and the addresses their relocations ask for, and records each global's address.
func (m *module) place(im *image) error {
	bases := make([]uint64, len(im.segments))
	var total uint64
	for i, s := range im.segments {
		a := max(s.align, 1)
		if s.size > maxSegmentBytes || total > maxSegmentBytes {
			return fmt.Errorf("sim: %w: module data of more than %d bytes", device.ErrOutOfMemory,
				uint64(maxSegmentBytes))
		}
		total = alignUp(total, a)
		bases[i] = total
		total += s.size
	}
	if total == 0 {
		if len(im.globals) == 0 {
			return nil
		}
		total = 1 // zero-sized globals have an address too
	}
	b := m.b
	size := alignUp(total, b.gran)
	ptr, err := b.ReserveAddress(size, 0)
	if err != nil {
		return err
	}
	phys, err := b.CreatePhysical(m.gpu, size)
	if err != nil {
		_ = b.FreeAddress(ptr, size)
		return err
	}
	if err := b.Map(ptr, phys); err != nil {
		_ = phys.Release()
		_ = b.FreeAddress(ptr, size)
		return err
	}
	m.reserve, m.resSize, m.phys = ptr, size, phys
	if err := b.SetAccess(ptr, size, []int{m.gpu}); err != nil {
		return m.releaseMemory(err)
	}
	if m.ctx != nil {
		b.ownMemory(ptr, m.ctx.id)
	}
	for i, s := range im.segments { // fresh simulated memory reads as zero: write what the image sets
		base := ptr + device.Ptr(bases[i])
		if len(s.init) > 0 {
			if err := b.writeDevice(m.who, base, s.init[:min(uint64(len(s.init)), s.size)]); err != nil {
				return m.releaseMemory(err)
			}
		}
		for _, r := range s.relocs {
			if r.seg < 0 || r.seg >= len(bases) || r.off > s.size || uint64(r.size) > s.size-r.off {
				continue
			}
			addr := binary.LittleEndian.AppendUint64(nil, uint64(ptr)+bases[r.seg]+r.target)
			if err := b.writeDevice(m.who, base+device.Ptr(r.off), addr[:r.size]); err != nil {
				return m.releaseMemory(err)
			}
		}
	}
	for _, g := range im.globals {
		if _, dup := m.globals[g.name]; dup || g.seg < 0 || g.seg >= len(bases) {
			continue
		}
		m.globals[g.name] = global{ptr: ptr + device.Ptr(bases[g.seg]+g.off), size: g.size}
	}
	return nil
}

// maxSegmentBytes bounds a module's data (a GPU's memory is the real limit; this keeps the arithmetic far from
// overflowing).
const maxSegmentBytes = 1 << 44

func (m *module) releaseMemory(cause error) error {
	_ = m.b.Unmap(m.reserve, m.resSize)
	_ = m.phys.Release()
	_ = m.b.FreeAddress(m.reserve, m.resSize)
	m.phys = nil
	return cause
}

func (m *module) GPU() int { return m.gpu }

func (m *module) isUnloaded() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unloaded
}

func (m *module) Function(name string) (device.Function, error) {
	if m.isUnloaded() {
		return nil, fmt.Errorf("%w: module unloaded", device.ErrInvalidValue)
	}
	f, ok := m.funcs[name]
	if !ok {
		return nil, fmt.Errorf("%w: kernel %q", device.ErrNotFound, name)
	}
	return f, nil
}

func (m *module) Global(name string) (device.Ptr, uint64, error) {
	if m.isUnloaded() {
		return 0, 0, fmt.Errorf("%w: module unloaded", device.ErrInvalidValue)
	}
	g, ok := m.globals[name]
	if !ok {
		return 0, 0, fmt.Errorf("%w: global %q", device.ErrNotFound, name)
	}
	return g.ptr, g.size, nil
}

func (m *module) Unload() error {
	m.mu.Lock()
	if m.unloaded {
		m.mu.Unlock()
		return fmt.Errorf("%w: module unloaded twice", device.ErrInvalidValue)
	}
	m.unloaded = true
	m.mu.Unlock()
	if m.phys == nil {
		return nil
	}
	if err := m.b.Unmap(m.reserve, m.resSize); err != nil {
		return err
	}
	if err := m.phys.Release(); err != nil {
		return err
	}
	return m.b.FreeAddress(m.reserve, m.resSize)
}
