package remoting

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Modules, their kernels and globals, loaded in the function's context on each GPU it runs on.

// global is a module global as the function sees it: one address (canon, its address on the GPU the function
// first asked on) translated to the module's global on the GPU the function runs on. Its bytes follow the
// function when it moves to another GPU (read back from the GPU it left, written to the new one).
type global struct {
	mod   *module
	name  string
	canon uint64
	size  uint64
}

type module struct {
	image  []byte               // shared with every module of the node with the same bytes: never written
	ref    imageRef             // its hold in the node's module images
	loaded map[int]loadedModule // by GPU
	funcs  map[string]uint64    // kernel name -> handle, so that a kernel has one handle
	data   uint64               // GPU bytes of its globals, charged to the function's quota (moduleDataBytes)
}

// loadedModule is a module loaded in the function's context on one GPU. A fault tears that context down, and with
// it the module: ctx says which context it was loaded in (loadOn loads it again in the current one).
type loadedModule struct {
	ctx device.Context
	mod device.Module
}

type function struct {
	mod    *module
	name   string
	params []device.Param
	// sets are the attributes the function set (cuFuncSetAttribute), applied to the kernel on every GPU it is
	// launched on; applied records the GPUs whose kernel has them.
	sets    map[device.FuncAttr]int32
	applied map[int]bool
}

// globalOn is the address of global g on GPU gpu (its module loaded there if needed).
func (h *deviceHandler) globalOn(g *global, gpu int) (device.Ptr, error) {
	l, err := h.loadOn(g.mod, gpu)
	if err != nil {
		return 0, err
	}
	p, _, err := l.Global(g.name)
	return p, err
}

// translate maps an address the function sees to the address on its current GPU: unchanged for its blocks (fixed
// addresses), the module's own global on this GPU for a global.
func (h *deviceHandler) translate(p uint64) (device.Ptr, error) {
	i := h.findAllocation(p)
	if i < 0 || h.allocs[i].global == nil {
		return device.Ptr(p), nil
	}
	g := h.allocs[i].global
	base, err := h.globalOn(g, h.gpu)
	if err != nil {
		return 0, err
	}
	return base + device.Ptr(p-g.canon), nil
}

// context is the device context the function's work runs in on gpu (its tenant's: package executor). Every
// module, event and stream the session creates belongs there; calls added to the handler must use it too.
func (h *deviceHandler) context(gpu int) (device.Context, error) {
	return h.node.Context(h.info.Function, gpu)
}

func (h *deviceHandler) loadOn(m *module, gpu int) (device.Module, error) {
	dc, err := h.context(gpu)
	if err != nil {
		return nil, err
	}
	l, ok := m.loaded[gpu]
	if ok && l.ctx == dc {
		return l.mod, nil
	}
	if ok && h.usesGlobals(m) {
		// Its context was torn down by a fault, and with it the module's globals, which the function uses: a new
		// load has their initial values, not what the function wrote, and no image holds those.
		return nil, h.node.Lose(h.info.Function, fmt.Errorf("a fault on gpu %d tore down the module globals the "+
			"function uses", gpu))
	}
	mod, err := dc.LoadModule(m.image) // first use on gpu, or its context was torn down by a fault
	if err != nil {
		return nil, err
	}
	m.loaded[gpu] = loadedModule{ctx: dc, mod: mod}
	return mod, nil
}

// usesGlobals reports whether the function asked for a global of m (cuModuleGetGlobal: the way host code reads
// and writes one).
func (h *deviceHandler) usesGlobals(m *module) bool {
	for _, g := range h.globals {
		if g.mod == m {
			return true
		}
	}
	return false
}

// unload unloads a module everywhere it is loaded in a live context (a context torn down took its modules along).
func (h *deviceHandler) unload(m *module) error {
	var errs []error
	for gpu, l := range m.loaded {
		if dc, err := h.context(gpu); err == nil && dc == l.ctx && dc.Err() == nil {
			errs = append(errs, l.mod.Unload())
		}
	}
	return errors.Join(errs...)
}

// ModuleImageChunk appends a chunk of a module image too large for one record; the next load call completes it.
// The chunk's bytes count against the function's and the node's bounds on module images (Config.MaxModuleBytes*)
// before they are kept: beyond them the image being received is dropped and the call fails with
// CUDA_ERROR_OUT_OF_MEMORY (as does the load that would complete it).
func (h *deviceHandler) ModuleImageChunk(_ context.Context, data []byte, _ uint64) Result {
	if h.imageRefused { // the rest of an image refused already
		return ResultOutOfMemory
	}
	if err := h.images.reserve(h.info.Function, uint64(len(data))); err != nil {
		h.dropPendingImage()
		h.imageRefused = true
		h.log.Warn("remoting: module image refused", "err", err)
		return ResultOutOfMemory
	}
	h.pendingImage = append(h.pendingImage, data...)
	return ResultSuccess
}

func (h *deviceHandler) dropPendingImage() {
	h.images.unreserve(h.info.Function, uint64(len(h.pendingImage)))
	h.pendingImage = nil
}

func (h *deviceHandler) CuModuleLoadData(ctx context.Context, last []byte, _ uint64) (uint64, Result) {
	if h.imageRefused { // it completes an image whose chunks were refused: the image is incomplete
		h.imageRefused = false
		return 0, ResultOutOfMemory
	}
	image, reserved, inRing := last, uint64(len(h.pendingImage)), h.pendingImage == nil
	if !inRing {
		image = append(h.pendingImage, last...)
	}
	h.pendingImage = nil
	ref, err := h.images.hold(h.info.Function, image, reserved, inRing)
	if err != nil {
		h.log.Warn("remoting: module image refused", "err", err)
		return 0, ResultOutOfMemory
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		h.images.release(h.info.Function, ref)
		return 0, r
	}
	if len(h.modules) >= maxModules {
		h.images.release(h.info.Function, ref)
		h.log.Warn("remoting: module load refused: the session holds as many modules as it may", "max", maxModules)
		return 0, ResultOutOfMemory
	}
	data, err := moduleDataBytes(ref.bytes, h.gpuInfo().ComputeCapability)
	if err != nil { // the device says whether it loads the image; what the parser cannot read counts as its size
		data = uint64(len(ref.bytes))
	}
	if data > 0 {
		c := h.node.ChunkSize()
		data = (data + c - 1) / c * c
	}
	if !h.chargeDevice(data) {
		h.images.release(h.info.Function, ref)
		h.log.Warn("remoting: module load refused: its globals do not fit the function's GPU memory quota",
			"data_bytes", data, "quota", h.info.Spec.MemoryBytes)
		return 0, ResultOutOfMemory
	}
	m := &module{image: ref.bytes, ref: ref, loaded: map[int]loadedModule{}, funcs: map[string]uint64{}, data: data}
	if _, err := h.loadOn(m, h.gpu); err != nil {
		h.unchargeDevice(data)
		h.images.release(h.info.Function, ref)
		return 0, result(err)
	}
	id := h.handle()
	h.modules[id] = m
	return id, ResultSuccess
}

func (h *deviceHandler) CuLibraryLoadData(ctx context.Context, code []byte, size uint64) (uint64, Result) {
	return h.CuModuleLoadData(ctx, code, size)
}

func (h *deviceHandler) CuLibraryGetModule(_ context.Context, lib uint64) (uint64, Result) {
	if _, ok := h.modules[lib]; !ok {
		return 0, ResultInvalidHandle
	}
	return lib, ResultSuccess
}

func (h *deviceHandler) CuModuleUnload(_ context.Context, hmod uint64) Result {
	m, ok := h.modules[hmod]
	if !ok {
		return ResultInvalidHandle
	}
	delete(h.modules, hmod)
	err := h.unload(m)
	h.images.release(h.info.Function, m.ref)
	h.unchargeDevice(m.data)
	return result(err)
}

func (h *deviceHandler) CuLibraryUnload(ctx context.Context, lib uint64) Result {
	return h.CuModuleUnload(ctx, lib)
}

func (h *deviceHandler) CuModuleGetGlobal_v2(ctx context.Context, hmod uint64, name string) (uint64, uint64, Result) {
	m, ok := h.modules[hmod]
	if !ok {
		return 0, 0, ResultInvalidHandle
	}
	for _, g := range h.globals {
		if g.mod == m && g.name == name {
			return g.canon, g.size, ResultSuccess
		}
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, 0, r
	}
	l, err := h.loadOn(m, h.gpu)
	if err != nil {
		return 0, 0, result(err)
	}
	p, size, err := l.Global(name)
	if err != nil {
		return 0, 0, result(err)
	}
	g := &global{mod: m, name: name, canon: uint64(p), size: size}
	h.globals = append(h.globals, g)
	h.addAllocation(allocation{ptr: g.canon, size: size, global: g})
	return g.canon, size, ResultSuccess
}

func (h *deviceHandler) CuLibraryGetGlobal(ctx context.Context, lib uint64, name string) (uint64, uint64, Result) {
	return h.CuModuleGetGlobal_v2(ctx, lib, name)
}

// putLayout writes a parameter layout: u32 count, then u32 offset and u32 size per parameter.
func putLayout(dst []byte, params []device.Param) Result {
	if len(params) > wireParamMax || len(dst) < 4+8*len(params) {
		return ResultNotSupported
	}
	binary.LittleEndian.PutUint32(dst, uint32(len(params)))
	for i, p := range params {
		binary.LittleEndian.PutUint32(dst[4+8*i:], p.Offset)
		binary.LittleEndian.PutUint32(dst[8+8*i:], p.Size)
	}
	return ResultSuccess
}

func (h *deviceHandler) getFunction(ctx context.Context, hmod uint64, name string) (uint64, *function, Result) {
	m, ok := h.modules[hmod]
	if !ok {
		return 0, nil, ResultInvalidHandle
	}
	if id, ok := m.funcs[name]; ok {
		return id, h.funcs[id], ResultSuccess
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, nil, r
	}
	l, err := h.loadOn(m, h.gpu)
	if err != nil {
		return 0, nil, result(err)
	}
	f, err := l.Function(name)
	if err != nil {
		return 0, nil, result(err)
	}
	fn := &function{mod: m, name: name, params: f.Params()}
	id := h.handle()
	h.funcs[id] = fn
	m.funcs[name] = id
	return id, fn, ResultSuccess
}

func (h *deviceHandler) CuModuleGetFunction(ctx context.Context, params []byte, hmod uint64, name string) (uint64, Result) {
	id, fn, r := h.getFunction(ctx, hmod, name)
	if r != ResultSuccess {
		return 0, r
	}
	return id, putLayout(params, fn.params)
}

func (h *deviceHandler) CuLibraryGetKernel(ctx context.Context, lib uint64, name string) (uint64, Result) {
	id, _, r := h.getFunction(ctx, lib, name)
	return id, r
}

// CuKernelGetFunction: kernels and functions share one handle space, so a kernel is its own function.
func (h *deviceHandler) CuKernelGetFunction(_ context.Context, params []byte, kernel uint64) (uint64, Result) {
	fn, ok := h.funcs[kernel]
	if !ok {
		return 0, ResultInvalidHandle
	}
	return kernel, putLayout(params, fn.params)
}
