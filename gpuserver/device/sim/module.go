package sim

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/ptx"
)

// module is a PTX module loaded on one simulated GPU.
type module struct {
	b        *Backend
	gpu      int
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
	kernel kernelFunc
}

func (f *function) Name() string           { return f.name }
func (f *function) Params() []device.Param { return append([]device.Param(nil), f.params...) }

var globalRe = regexp.MustCompile(`(?m)^\s*(?:\.visible\s+|\.extern\s+)?\.global\s+(?:\.align\s+(\d+)\s+)?` +
	`(\.[a-z]+[0-9]*)\s+([A-Za-z_$%][A-Za-z0-9_$%]*)\s*(?:\[(\d+)\])?`)

// LoadModule loads PTX text on a GPU; its globals get memory on that GPU.
func (b *Backend) LoadModule(gpu int, image []byte) (device.Module, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	if !ptx.IsPTX(image) {
		return nil, fmt.Errorf("sim: %w: only PTX text can be loaded on the simulated device", device.ErrInvalidImage)
	}
	entries, err := ptx.Entries(image)
	if err != nil {
		return nil, fmt.Errorf("sim: %w: %w", device.ErrInvalidImage, err)
	}
	m := &module{b: b, gpu: gpu, funcs: map[string]*function{}, globals: map[string]global{}}
	for _, e := range entries {
		f := &function{mod: m, name: e.Name, params: e.Params}
		if k, ok := referenceKernel(e.Name); ok {
			if err := k.check(e); err != nil {
				return nil, fmt.Errorf("sim: %w: %w", device.ErrInvalidImage, err)
			}
			f.kernel = k.run
		}
		m.funcs[e.Name] = f
	}
	if err := m.loadGlobals(image); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *module) loadGlobals(image []byte) error {
	type decl struct {
		name        string
		size, align uint64
	}
	var decls []decl
	var total uint64
	for _, g := range globalRe.FindAllStringSubmatch(string(image), -1) {
		elem := map[byte]uint64{'8': 1, '6': 2, '2': 4, '4': 8}[g[2][len(g[2])-1]]
		if elem == 0 {
			elem = 1
		}
		size, align := elem, elem
		if g[4] != "" {
			n, _ := strconv.ParseUint(g[4], 10, 32)
			size = elem * n
		}
		if g[1] != "" {
			align, _ = strconv.ParseUint(g[1], 10, 32)
		}
		total = alignUp(total, max(align, 1))
		decls = append(decls, decl{name: g[3], size: size, align: align})
		total += size
	}
	if len(decls) == 0 {
		return nil
	}
	size := alignUp(total, m.b.gran)
	ptr, err := m.b.ReserveAddress(size, 0)
	if err != nil {
		return err
	}
	phys, err := m.b.CreatePhysical(m.gpu, size)
	if err != nil {
		_ = m.b.FreeAddress(ptr, size)
		return err
	}
	if err := m.b.Map(ptr, phys); err != nil {
		_ = phys.Release()
		_ = m.b.FreeAddress(ptr, size)
		return err
	}
	if err := m.b.SetAccess(ptr, size, []int{m.gpu}); err != nil {
		return err
	}
	m.reserve, m.resSize, m.phys = ptr, size, phys
	var off uint64
	for _, d := range decls {
		off = alignUp(off, max(d.align, 1))
		m.globals[d.name] = global{ptr: ptr + device.Ptr(off), size: d.size}
		off += d.size
	}
	return nil
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
