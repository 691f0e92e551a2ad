package remoting

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// deviceHandler executes one session's calls on the node's executors (package executor). It is used by the
// session's goroutine only.
//
// Memory: every block comes from the executor node (Node.AllocSegment): model blocks before the function's
// initialisation ends, scratch after; the node backs them on the GPU the function is active on, at addresses that
// are the same on every GPU. Copies, memsets, launches and event records go through the function's executor
// stream (Node.Stream), which waits per segment for a swap still landing. When the binding names another GPU the
// node swaps the function there (from a GPU holding a copy, else from the host image); the handler moves nothing
// itself except module globals, which live at a different address on each GPU (see global).
// All of the session's CUDA streams run in order on the function's one stream of the bound GPU.
type deviceHandler struct {
	UnimplementedHandler
	cfg  Config
	info SessionInfo
	log  *slog.Logger
	node *executor.Node

	gpu      int // bound GPU whose stream is open; -1 before the first GPU call
	stream   device.Stream
	release  func()    // releases the implicit binding, when held
	implicit int       // GPU of the implicit binding
	boundAt  time.Time // when the implicit binding was taken
	explicit bool      // a request has bound the function: its initialisation has ended
	used     uint64    // bytes of the session's segments (the quota's measure)

	allocs  []allocation // sorted by ptr
	handles uint64
	modules map[uint64]*module
	funcs   map[uint64]*function
	streams map[uint64]bool
	events  map[uint64]*event
	globals []*global

	images       *moduleImages // the node's module images (Config.images)
	pendingImage []byte        // chunks of a module image whose load call has not come yet (reserved in images)

	g graphs // stream captures and graphs (graph.go)

	vmmRanges   map[uint64]uint64 // reservations: start -> size
	vmmHandles  map[uint64]*vmmHandle
	vmmMappings map[uint64]*vmmMapping // by address
}

// allocation is a block the session allocated (or a module global it may copy to).
type allocation struct {
	ptr, size  uint64
	global     *global // set for a module global: the address is the one on the GPU it was first asked on
	ownSegment bool    // the block has a segment of its own (never shared with later blocks)
	segSize    uint64  // bytes of the segment it created, if any (counted in used)
	mapped     bool    // a mapping of a physical allocation (cuMemMap): freed by cuMemUnmap only
}

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

type event struct {
	ev     device.Event
	gpu    int
	ctx    device.Context // the function's context on gpu it was created in
	timing bool
}

func newDeviceHandler(ctx context.Context, cfg Config, info SessionInfo, log *slog.Logger) (*deviceHandler, error) {
	if err := cfg.Node.Register(info.Function); err != nil {
		return nil, err
	}
	if err := cfg.Node.SetTenant(ctx, info.Function, info.Spec.Tenant()); err != nil { // its namespace, or itself
		return nil, err
	}
	if err := cfg.Node.SetScratchPerRequest(info.Function, info.Spec.Scratch == pool.ScratchRequest); err != nil {
		return nil, err
	}
	if err := cfg.Node.SetScratchLimit(info.Function, info.Spec.MemoryBytes); err != nil { // its host copies' bound
		return nil, err
	}
	if err := cfg.Node.SetModelShared(info.Function, info.Spec.Model == pool.ModelShared); err != nil {
		return nil, err
	}
	images := cfg.images
	if images == nil { // a handler built without a server (tests)
		images = newModuleImages(DefaultMaxModuleBytesPerFunction, DefaultMaxModuleBytes)
	}
	h := &deviceHandler{
		cfg: cfg, info: info, log: log, node: cfg.Node, images: images,
		gpu:     -1,
		handles: 0x1000,
		modules: map[uint64]*module{},
		funcs:   map[uint64]*function{},
		streams: map[uint64]bool{},
		events:  map[uint64]*event{},
	}
	h.g.init()
	return h, nil
}

func (h *deviceHandler) handle() uint64 {
	h.handles += 0x10
	return h.handles
}

// result maps a device error to a CUDA result.
func result(err error) Result {
	switch {
	case err == nil:
		return ResultSuccess
	case errors.Is(err, executor.ErrUnhealthy):
		return ResultDeviceUnavailable
	case errors.Is(err, executor.ErrBroken):
		return ResultContextIsDestroyed
	case errors.Is(err, device.ErrKernelFault):
		return ResultLaunchFailed
	case errors.Is(err, device.ErrIllegalAddress):
		return ResultIllegalAddress
	case errors.Is(err, device.ErrInvalidValue), errors.Is(err, memory.ErrInvalid), errors.Is(err, executor.ErrInvalid):
		return ResultInvalidValue
	case errors.Is(err, device.ErrOutOfMemory), errors.Is(err, memory.ErrNoSpace), errors.Is(err, executor.ErrNoMemory):
		return ResultOutOfMemory
	case errors.Is(err, device.ErrNotFound):
		return ResultNotFound
	case errors.Is(err, device.ErrNotSupported):
		return ResultNotSupported
	case errors.Is(err, device.ErrInvalidImage):
		return ResultInvalidImage
	case errors.Is(err, device.ErrNotReady):
		return ResultNotReady
	case errors.Is(err, device.ErrNoBinaryForGPU):
		return ResultNoBinaryForGPU
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ResultSystemNotReady
	}
	return ResultUnknown
}

// Bound reports whether the function holds a binding: the session's implicit one, or a request's.
func (h *deviceHandler) Bound() bool {
	if h.release != nil {
		return true
	}
	_, ok := h.cfg.Binder.CurrentGPU(h.info.Function)
	return ok
}

// Idle releases the implicit binding (called by the session when no call arrived for Config.IdleRelease).
func (h *deviceHandler) Idle() {
	if h.release != nil {
		h.syncStream(context.Background())
		h.release()
		h.release = nil
	}
}

func (h *deviceHandler) syncStream(ctx context.Context) Result {
	if h.stream == nil {
		return ResultSuccess
	}
	err := h.stream.Synchronize(ctx)
	if errors.Is(err, executor.ErrContextFault) {
		h.stream = nil // torn down with the tenant's context: the next call binds afresh
	}
	return result(err)
}

// bind returns the function's executor stream on the GPU its calls run on now, swapping it there if needed.
func (h *deviceHandler) bind(ctx context.Context) (device.Stream, Result) {
	if h.g.devCapture != nil { // a graph's nodes being captured on the device (graph.go)
		return h.g.devCapture, ResultSuccess
	}
	var gpu int
	if g, ok := h.cfg.Binder.CurrentGPU(h.info.Function); ok {
		if !h.explicit {
			// The function's first request: its initialisation is over (a no-op when the binder ended it).
			if err := h.node.EndInit(ctx, h.info.Function); err != nil {
				h.log.Error("remoting: end of initialisation", "gpu", g, "err", err)
				return nil, result(err)
			}
			h.explicit = true
		}
		if h.release != nil {
			h.syncStream(ctx)
			h.release()
			h.release = nil
		}
		gpu = g
	} else {
		if h.release != nil && h.cfg.MaxImplicitHold > 0 && time.Since(h.boundAt) > h.cfg.MaxImplicitHold {
			// Calls outside a request kept the GPU this long: give it up and queue again behind the requests
			// waiting for one.
			h.syncStream(ctx)
			h.release()
			h.release = nil
		}
		if h.release == nil {
			g, rel, err := h.cfg.Binder.BindImplicit(ctx, h.info.Function)
			if err != nil {
				h.log.Warn("remoting: implicit binding", "err", err)
				if errors.Is(err, executor.ErrBroken) {
					return nil, result(err)
				}
				return nil, ResultSystemNotReady
			}
			h.implicit, h.release, h.boundAt = g, rel, time.Now()
		}
		gpu = h.implicit
	}
	if gpu == h.gpu && h.stream != nil && h.node.Active(h.info.Function) == gpu {
		return h.stream, ResultSuccess
	}
	if r := h.moveTo(ctx, gpu); r != ResultSuccess {
		return nil, r
	}
	return h.stream, ResultSuccess
}

// moveTo makes gpu the function's GPU: the node swaps it there (a no-op when the binder already did) and its
// globals follow it.
func (h *deviceHandler) moveTo(ctx context.Context, gpu int) Result {
	left := h.gpu >= 0 && !h.node.Healthy(h.gpu) // the GPU it leaves failed: nothing there to wait for or read
	if !left {
		if r := h.syncStream(ctx); r != ResultSuccess {
			return r
		}
	}
	if h.node.Active(h.info.Function) != gpu {
		if err := h.node.SwapIn(ctx, h.info.Function, gpu, executor.Any); err != nil {
			h.log.Error("remoting: swap in", "gpu", gpu, "err", err)
			return result(err)
		}
	}
	st, err := h.node.Stream(h.info.Function)
	if err != nil {
		return result(err)
	}
	if left && len(h.globals) > 0 {
		// Module globals live on one GPU only: those written on the failed GPU are lost (DESIGN.md's trap), and
		// no image holds them; going on with their initial values would compute wrong answers.
		return result(h.node.Lose(h.info.Function, fmt.Errorf("gpu %d failed holding the module globals the "+
			"function uses (%d)", h.gpu, len(h.globals))))
	}
	if h.gpu >= 0 && h.gpu != gpu && !left {
		if err := h.moveGlobals(ctx, h.gpu, gpu); err != nil {
			h.log.Error("remoting: move module globals", "gpu", gpu, "err", err)
			return result(err)
		}
	}
	h.gpu, h.stream = gpu, st
	return ResultSuccess
}

// moveGlobals copies the bytes of the module globals the function asked for from GPU from to GPU to.
func (h *deviceHandler) moveGlobals(ctx context.Context, from, to int) error {
	for _, g := range h.globals {
		src, err := h.globalOn(g, from)
		if err != nil {
			return err
		}
		dst, err := h.globalOn(g, to)
		if err != nil {
			return err
		}
		buf := make([]byte, g.size)
		if err := h.copyOnce(ctx, from, func(s device.Stream) error { return s.CopyDtoH(buf, src) }); err != nil {
			return fmt.Errorf("global %s from gpu %d: %w", g.name, from, err)
		}
		if err := h.copyOnce(ctx, to, func(s device.Stream) error { return s.CopyHtoD(dst, buf) }); err != nil {
			return fmt.Errorf("global %s to gpu %d: %w", g.name, to, err)
		}
	}
	return nil
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

func (h *deviceHandler) copyOnce(ctx context.Context, gpu int, f func(device.Stream) error) error {
	dc, err := h.context(gpu)
	if err != nil {
		return err
	}
	s, err := dc.NewStream()
	if err != nil {
		return err
	}
	err = f(s)
	if err == nil {
		err = s.Synchronize(ctx)
	}
	return errors.Join(err, s.Destroy())
}

// Close returns the session's memory and objects to the node.
func (h *deviceHandler) Close() error {
	ctx := context.Background()
	var errs []error
	if h.stream != nil {
		errs = append(errs, h.stream.Synchronize(ctx))
	}
	for _, e := range h.events {
		errs = append(errs, e.ev.Destroy())
	}
	for _, m := range h.modules {
		errs = append(errs, h.unload(m))
		h.images.release(h.info.Function, m.ref)
	}
	h.images.unreserve(h.info.Function, uint64(len(h.pendingImage)))
	h.pendingImage = nil
	for _, a := range h.allocs {
		if a.global == nil {
			errs = append(errs, h.node.Free(h.info.Function, device.Ptr(a.ptr)))
		}
	}
	if h.release != nil {
		h.release()
	}
	return errors.Join(errs...)
}

// --- memory

func (h *deviceHandler) CuMemAlloc_v2(ctx context.Context, size uint64) (uint64, Result) {
	if size == 0 {
		return 0, ResultInvalidValue
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, r
	}
	ptr, seg, created, err := h.node.AllocSegment(ctx, h.info.Function, size)
	if err != nil {
		return 0, result(err)
	}
	a := allocation{ptr: uint64(ptr), size: size, ownSegment: created && seg.Ptr == ptr &&
		size >= h.node.ChunkSize()/2}
	if created {
		if h.used+seg.Size > h.info.Spec.MemoryBytes {
			_ = h.node.Free(h.info.Function, ptr)
			return 0, ResultOutOfMemory
		}
		h.used += seg.Size
		a.segSize = seg.Size
	}
	h.addAllocation(a)
	return uint64(ptr), ResultSuccess
}

func (h *deviceHandler) CuMemAllocAsync(ctx context.Context, size, _ uint64) (uint64, Result) {
	return h.CuMemAlloc_v2(ctx, size)
}

func (h *deviceHandler) CuMemFree_v2(ctx context.Context, dptr uint64) Result {
	i := h.findAllocation(dptr)
	if i < 0 || h.allocs[i].ptr != dptr || h.allocs[i].global != nil || h.allocs[i].mapped {
		return ResultInvalidValue
	}
	if r := h.syncStream(ctx); r != ResultSuccess {
		return r
	}
	a := h.allocs[i]
	if err := h.node.Free(h.info.Function, device.Ptr(dptr)); err != nil {
		return result(err)
	}
	h.allocs = append(h.allocs[:i], h.allocs[i+1:]...)
	if a.ownSegment { // its chunks went back to the pools; its address stays reserved for the function
		h.used -= a.segSize
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemFreeAsync(ctx context.Context, dptr, _ uint64) Result {
	return h.CuMemFree_v2(ctx, dptr)
}

func (h *deviceHandler) CuMemGetInfo_v2(context.Context) (uint64, uint64, Result) {
	total := h.info.Spec.MemoryBytes
	return total - min(total, h.used), total, ResultSuccess
}

func (h *deviceHandler) CuMemGetAddressRange_v2(_ context.Context, dptr uint64) (uint64, uint64, Result) {
	i := h.findAllocation(dptr)
	if i < 0 {
		return 0, 0, ResultNotFound
	}
	return h.allocs[i].ptr, h.allocs[i].size, ResultSuccess
}

func (h *deviceHandler) addAllocation(a allocation) {
	i := sort.Search(len(h.allocs), func(i int) bool { return h.allocs[i].ptr >= a.ptr })
	h.allocs = append(h.allocs, allocation{})
	copy(h.allocs[i+1:], h.allocs[i:])
	h.allocs[i] = a
}

// findAllocation returns the index of the allocation containing p, or -1.
func (h *deviceHandler) findAllocation(p uint64) int {
	i := sort.Search(len(h.allocs), func(i int) bool { return h.allocs[i].ptr > p }) - 1
	if i >= 0 && p-h.allocs[i].ptr < h.allocs[i].size {
		return i
	}
	return -1
}

// owns reports whether [p, p+n) lies inside one of the session's own allocations: the isolation check of every
// copy and memset (issue 11). Every call that names device memory by address must pass it before touching the
// device, with n computed without overflow (see memset), and answer h.refuse(...) otherwise; kernels are confined
// by the executors instead (one tenant's memory mapped on a GPU at a time).
func (h *deviceHandler) owns(p, n uint64) bool {
	i := h.findAllocation(p)
	return i >= 0 && n <= h.allocs[i].size-(p-h.allocs[i].ptr)
}

func (h *deviceHandler) refuse(call string, p, n uint64) Result {
	h.log.Warn("remoting: refused access outside the function's memory", "call", call, "ptr", fmt.Sprintf("%#x", p),
		"bytes", n)
	return ResultInvalidValue
}

// --- copies and memsets

func (h *deviceHandler) htod(ctx context.Context, call string, dst uint64, src []byte, wait bool) Result {
	if !h.owns(dst, uint64(len(src))) {
		return h.refuse(call, dst, uint64(len(src)))
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	if !wait {
		src = append([]byte(nil), src...) // the ring slot is reused once the record is consumed
	}
	d, err := h.translate(dst)
	if err != nil {
		return result(err)
	}
	if err := s.CopyHtoD(d, src); err != nil {
		return result(err)
	}
	if wait {
		return result(s.Synchronize(ctx))
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemcpyHtoD_v2(ctx context.Context, dst uint64, src []byte, _ uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyHtoD", 0, true); ok {
		return r
	}
	return h.htod(ctx, "cuMemcpyHtoD", dst, src, true)
}

func (h *deviceHandler) CuMemcpyHtoDAsync_v2(ctx context.Context, dst uint64, src []byte, _, st uint64) Result {
	if h.asyncRefused("cuMemcpyHtoDAsync", st, false) {
		return ResultSuccess
	}
	return h.htod(ctx, "cuMemcpyHtoDAsync", dst, src, false)
}

func (h *deviceHandler) MemcpyHtoDChunk(ctx context.Context, dst uint64, src []byte, _, st uint64) Result {
	if h.asyncRefused("cuMemcpyHtoDAsync", st, false) {
		return ResultSuccess
	}
	return h.htod(ctx, "cuMemcpyHtoD", dst, src, false)
}

func (h *deviceHandler) dtoh(ctx context.Context, call string, dst []byte, src uint64) Result {
	if !h.owns(src, uint64(len(dst))) {
		return h.refuse(call, src, uint64(len(dst)))
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	sp, err := h.translate(src)
	if err != nil {
		return result(err)
	}
	if err := s.CopyDtoH(dst, sp); err != nil {
		return result(err)
	}
	return result(s.Synchronize(ctx))
}

func (h *deviceHandler) CuMemcpyDtoH_v2(ctx context.Context, dst []byte, src, _ uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyDtoH", 0, true); ok {
		return r
	}
	return h.dtoh(ctx, "cuMemcpyDtoH", dst, src)
}

func (h *deviceHandler) CuMemcpyDtoHAsync_v2(ctx context.Context, dst []byte, src, _, st uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyDtoHAsync", st, false); ok {
		return r
	}
	return h.dtoh(ctx, "cuMemcpyDtoHAsync", dst, src)
}

func (h *deviceHandler) dtod(ctx context.Context, dst, src, n uint64, wait bool) Result {
	if !h.owns(dst, n) {
		return h.refuse("cuMemcpyDtoD", dst, n)
	}
	if !h.owns(src, n) {
		return h.refuse("cuMemcpyDtoD", src, n)
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	d, err := h.translate(dst)
	if err != nil {
		return result(err)
	}
	sp, err := h.translate(src)
	if err != nil {
		return result(err)
	}
	if err := s.CopyDtoD(d, sp, n); err != nil {
		return result(err)
	}
	if wait {
		return result(s.Synchronize(ctx))
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemcpyDtoD_v2(ctx context.Context, dst, src, n uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyDtoD", 0, true); ok {
		return r
	}
	return h.dtod(ctx, dst, src, n, true)
}

func (h *deviceHandler) CuMemcpyDtoDAsync_v2(ctx context.Context, dst, src, n, st uint64) Result {
	if r, ok := h.captured(st, graphNode{kind: "copy", run: func(ctx context.Context, s uint64) Result {
		return h.CuMemcpyDtoDAsync_v2(ctx, dst, src, n, s)
	}}); ok {
		return r
	}
	return h.dtod(ctx, dst, src, n, false)
}

func (h *deviceHandler) memset(ctx context.Context, dst uint64, v uint32, n uint64, elem uint64) Result {
	if n > (1<<62)/elem || !h.owns(dst, n*elem) {
		return h.refuse("cuMemset", dst, n*elem)
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	d, err := h.translate(dst)
	if err != nil {
		return result(err)
	}
	switch elem {
	case 1:
		return result(s.Memset8(d, uint8(v), n))
	case 2:
		return result(memset16(s, d, uint16(v), n))
	case 4:
		return result(s.Memset32(d, v, n))
	}
	return ResultNotSupported
}

func (h *deviceHandler) CuMemsetD8_v2(ctx context.Context, dst uint64, v uint32, n uint64) Result {
	if h.asyncRefused("cuMemsetD8", 0, true) {
		return ResultSuccess
	}
	return h.memset(ctx, dst, v, n, 1)
}

func (h *deviceHandler) CuMemsetD32_v2(ctx context.Context, dst uint64, v uint32, n uint64) Result {
	if h.asyncRefused("cuMemsetD32", 0, true) {
		return ResultSuccess
	}
	return h.memset(ctx, dst, v, n, 4)
}

// memsetAsync runs a memset on stream st, or records it when st captures.
func (h *deviceHandler) memsetAsync(ctx context.Context, dst uint64, v uint32, n, elem, st uint64) Result {
	if r, ok := h.captured(st, graphNode{kind: "memset", run: func(ctx context.Context, s uint64) Result {
		return h.memsetAsync(ctx, dst, v, n, elem, s)
	}}); ok {
		return r
	}
	return h.memset(ctx, dst, v, n, elem)
}

func (h *deviceHandler) CuMemsetD8Async(ctx context.Context, dst uint64, v uint32, n, st uint64) Result {
	return h.memsetAsync(ctx, dst, v, n, 1, st)
}

func (h *deviceHandler) CuMemsetD32Async(ctx context.Context, dst uint64, v uint32, n, st uint64) Result {
	return h.memsetAsync(ctx, dst, v, n, 4, st)
}

// --- modules and launches

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
	if err := h.images.reserve(h.info.Function, uint64(len(data))); err != nil {
		h.dropPendingImage()
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
	m := &module{image: ref.bytes, ref: ref, loaded: map[int]loadedModule{}, funcs: map[string]uint64{}}
	if _, err := h.loadOn(m, h.gpu); err != nil {
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

func (h *deviceHandler) CuLaunchKernel(ctx context.Context, f uint64, gx, gy, gz, bx, by, bz, shmem uint32, st uint64,
	args []byte, _ uint64) Result {
	if h.g.capturing(st) != nil {
		if _, ok := h.funcs[f]; !ok {
			return ResultInvalidHandle
		}
		a := append([]byte(nil), args...) // the record's bytes are the ring's until the call returns
		r, _ := h.captured(st, graphNode{kind: "kernel", fn: f, bytes: len(a), run: func(ctx context.Context, s uint64) Result {
			return h.CuLaunchKernel(ctx, f, gx, gy, gz, bx, by, bz, shmem, s, a, uint64(len(a)))
		}})
		return r
	}
	return h.launch(ctx, f, device.Dim3{X: gx, Y: gy, Z: gz}, device.Dim3{X: bx, Y: by, Z: bz}, shmem, nil, args)
}

// launch launches function f on the function's GPU: its attribute sets applied there first, pointers to module
// globals in its arguments translated to this GPU's copies; with attrs through cuLaunchKernelEx.
func (h *deviceHandler) launch(ctx context.Context, f uint64, grid, block device.Dim3, shmem uint32,
	attrs []device.LaunchAttribute, args []byte) Result {
	fn, ok := h.funcs[f]
	if !ok {
		return ResultInvalidHandle
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	df, r := h.deviceFunction(fn)
	if r != ResultSuccess {
		return r
	}
	a := append([]byte(nil), args...)
	if len(h.globals) > 0 { // a pointer to a module global is the only argument translated per GPU
		for _, p := range df.Params() {
			if p.Size != 8 || int(p.Offset)+8 > len(a) {
				continue
			}
			v := binary.LittleEndian.Uint64(a[p.Offset:])
			if i := h.findAllocation(v); i >= 0 && h.allocs[i].global != nil {
				t, err := h.translate(v)
				if err != nil {
					return result(err)
				}
				binary.LittleEndian.PutUint64(a[p.Offset:], uint64(t))
			}
		}
	}
	if attrs == nil {
		return result(s.Launch(df, grid, block, shmem, a))
	}
	xl, ok := s.(device.ExtendedLauncher)
	if !ok {
		return ResultNotSupported
	}
	return result(xl.LaunchEx(df, grid, block, shmem, attrs, a))
}

// --- synchronisation, streams, events

func (h *deviceHandler) CuCtxSynchronize(ctx context.Context) Result {
	if r, ok := h.refuseInCapture("cuCtxSynchronize", 0, true); ok {
		return r
	}
	return h.syncStream(ctx)
}

func (h *deviceHandler) CuStreamCreate(context.Context, uint32) (uint64, Result) {
	id := h.handle()
	h.streams[id] = true
	return id, ResultSuccess
}

func (h *deviceHandler) CuStreamCreateWithPriority(ctx context.Context, flags uint32, _ int32) (uint64, Result) {
	return h.CuStreamCreate(ctx, flags)
}

func (h *deviceHandler) validStream(s uint64) bool { return s == 0 || s == 1 || s == 2 || h.streams[s] }

func (h *deviceHandler) CuStreamDestroy_v2(_ context.Context, s uint64) Result {
	if !h.streams[s] {
		return ResultInvalidHandle
	}
	delete(h.streams, s)
	return ResultSuccess
}

func (h *deviceHandler) CuStreamSynchronize(ctx context.Context, s uint64) Result {
	if !h.validStream(s) {
		return ResultInvalidHandle
	}
	if r, ok := h.refuseInCapture("cuStreamSynchronize", s, false); ok {
		return r
	}
	return h.syncStream(ctx)
}

func (h *deviceHandler) CuStreamQuery(ctx context.Context, s uint64) Result {
	return h.CuStreamSynchronize(ctx, s)
}

func (h *deviceHandler) CuStreamWaitEvent(_ context.Context, s, e uint64, _ uint32) Result {
	if !h.validStream(s) {
		return ResultInvalidHandle
	}
	if _, ok := h.events[e]; !ok {
		return ResultInvalidHandle
	}
	h.waitJoinsCapture(s, e)
	return ResultSuccess // every stream of the session runs in order on one device stream
}

// eventDisableTiming is CU_EVENT_DISABLE_TIMING.
const eventDisableTiming = 0x2

// newEvent creates an event in the function's context on gpu.
func (h *deviceHandler) newEvent(gpu int, timing bool) (device.Event, device.Context, error) {
	dc, err := h.context(gpu)
	if err != nil {
		return nil, nil, err
	}
	var ev device.Event
	if timing {
		ev, err = dc.NewTimedEvent()
	} else {
		ev, err = dc.NewEvent()
	}
	return ev, dc, err
}

func (h *deviceHandler) CuEventCreate(ctx context.Context, flags uint32) (uint64, Result) {
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, r
	}
	timing := flags&eventDisableTiming == 0
	ev, dc, err := h.newEvent(h.gpu, timing)
	if err != nil {
		return 0, result(err)
	}
	id := h.handle()
	h.events[id] = &event{ev: ev, gpu: h.gpu, ctx: dc, timing: timing}
	return id, ResultSuccess
}

// CuEventElapsedTime: both events must have been recorded on the GPU the function runs on (an event recorded
// before the function moved is recreated at its next record).
func (h *deviceHandler) CuEventElapsedTime(_ context.Context, start, end uint64) (float32, Result) {
	s, ok1 := h.events[start]
	e, ok2 := h.events[end]
	if !ok1 || !ok2 {
		return 0, ResultInvalidHandle
	}
	if s.gpu != e.gpu {
		return 0, ResultInvalidHandle
	}
	d, err := e.ev.Elapsed(s.ev)
	if err != nil {
		if errors.Is(err, device.ErrInvalidValue) {
			return 0, ResultInvalidHandle
		}
		return 0, result(err)
	}
	return float32(d.Seconds() * 1e3), ResultSuccess
}

func (h *deviceHandler) CuEventElapsedTime_v2(ctx context.Context, start, end uint64) (float32, Result) {
	return h.CuEventElapsedTime(ctx, start, end)
}

func (h *deviceHandler) CuEventDestroy_v2(_ context.Context, e uint64) Result {
	ev, ok := h.events[e]
	if !ok {
		return ResultInvalidHandle
	}
	delete(h.events, e)
	return result(ev.ev.Destroy())
}

func (h *deviceHandler) CuEventRecord(ctx context.Context, e, s uint64) Result {
	ev, ok := h.events[e]
	if !ok || !h.validStream(s) {
		return ResultInvalidHandle
	}
	if h.eventRecordedInCapture(e, s) {
		return ResultSuccess
	}
	st, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	if r := h.eventOnGPU(ev); r != ResultSuccess { // the function moved, or a fault replaced its context
		return r
	}
	return result(st.Record(ev.ev))
}

func (h *deviceHandler) CuEventRecordWithFlags(ctx context.Context, e, s uint64, _ uint32) Result {
	return h.CuEventRecord(ctx, e, s)
}

func (h *deviceHandler) CuEventSynchronize(ctx context.Context, e uint64) Result {
	ev, ok := h.events[e]
	if !ok {
		return ResultInvalidHandle
	}
	if c, ok := h.g.events[e]; ok {
		return c.invalidate(ResultStreamCaptureUnsupported, "cuEventSynchronize of an event recorded in the capture")
	}
	return result(ev.ev.Synchronize(ctx))
}

func (h *deviceHandler) CuEventQuery(_ context.Context, e uint64) Result {
	ev, ok := h.events[e]
	if !ok {
		return ResultInvalidHandle
	}
	if c, ok := h.g.events[e]; ok {
		return c.invalidate(ResultStreamCaptureUnsupported, "cuEventQuery of an event recorded in the capture")
	}
	done, err := ev.ev.Query()
	if err != nil {
		return result(err)
	}
	if !done {
		return ResultNotReady
	}
	return ResultSuccess
}

// --- pointer attributes

const (
	ptrAttrMemoryType    = 2
	ptrAttrDevicePointer = 3
	ptrAttrSyncMemops    = 6
	ptrAttrBufferID      = 7
	ptrAttrIsManaged     = 8
	ptrAttrDeviceOrdinal = 9
	ptrAttrRangeStart    = 11
	ptrAttrRangeSize     = 12
	ptrAttrMapped        = 13
	memoryTypeDevice     = 2
)

func (h *deviceHandler) CuPointerGetAttribute(_ context.Context, data []byte, attr int32, ptr uint64) Result {
	i := h.findAllocation(ptr)
	if i < 0 {
		return ResultInvalidValue
	}
	a := h.allocs[i]
	var v uint64
	switch attr {
	case 1: // context: answered by the shim
	case ptrAttrMemoryType:
		v = memoryTypeDevice
	case ptrAttrDevicePointer:
		v = ptr
	case ptrAttrSyncMemops, ptrAttrMapped:
		v = 1
	case ptrAttrBufferID:
		v = a.ptr
	case ptrAttrIsManaged, ptrAttrDeviceOrdinal:
		v = 0
	case ptrAttrRangeStart:
		v = a.ptr
	case ptrAttrRangeSize:
		v = a.size
	default:
		return ResultNotSupported
	}
	binary.LittleEndian.PutUint64(data, v)
	return ResultSuccess
}

func (h *deviceHandler) CuMemGetAllocationGranularity(context.Context, []byte, uint32) (uint64, Result) {
	return h.node.ChunkSize(), ResultSuccess
}
