// Package cuda is the real device backend: the NVIDIA driver (libcuda.so.1) loaded at run time through package
// cu, so that everything builds and runs on machines without a GPU (Open then fails with device.ErrUnavailable).
// It uses the driver's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap, cuMemRelease) on every GPU's primary context, non-blocking streams for asynchronous copies, memsets
// and launches, events, and modules loaded per GPU. Kernel parameter layouts come from cuFuncGetParamInfo (CUDA
// 12.4 and later) or, for PTX images, from the module's `.entry` lines.
package cuda

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

// DefaultLibrary is the driver library Open loads.
const DefaultLibrary = "libcuda.so.1"

// Backend drives the node's NVIDIA GPUs; it implements device.Backend.
type Backend struct {
	gpus []gpu

	mu        sync.Mutex
	regs      map[uintptr]uint64    // registered host ranges
	maps      map[device.Ptr]uint64 // mapping start -> size, so that Unmap and SetAccess work per mapping
	shareable bool                  // physical memory is created shareable (share.go)
}

type gpu struct {
	info device.GPUInfo
	dev  int
	ctx  cu.Context
}

var _ device.Backend = (*Backend)(nil)

// Open loads the driver from library (DefaultLibrary when empty) and retains every GPU's primary context.
func Open(library string) (*Backend, error) {
	if library == "" {
		library = DefaultLibrary
	}
	if err := cu.Load(library); err != nil {
		return nil, fmt.Errorf("cuda: %w: %w", device.ErrUnavailable, err)
	}
	if err := cu.LoadContexts(library); err != nil {
		return nil, fmt.Errorf("cuda: %w: %w", device.ErrUnavailable, err)
	}
	n, err := cu.DeviceCount()
	if err != nil || n == 0 {
		return nil, fmt.Errorf("cuda: %w: no GPU (%v)", device.ErrUnavailable, err)
	}
	b := &Backend{regs: map[uintptr]uint64{}, maps: map[device.Ptr]uint64{}}
	for i := range n {
		dev, ctx, err := cu.Open(i)
		if err != nil {
			_ = b.Close(context.Background())
			return nil, fmt.Errorf("cuda: gpu %d: %w", i, wrap(err))
		}
		info, err := cu.DeviceInfo(ctx, dev)
		if err != nil {
			_ = b.Close(context.Background())
			return nil, fmt.Errorf("cuda: gpu %d: %w", i, wrap(err))
		}
		uuid, err := cu.DeviceUUID(dev)
		var vals []int32
		if err == nil {
			vals, err = cu.DeviceAttributes(dev, attrs.Count)
		}
		if err != nil {
			_ = b.Close(context.Background())
			return nil, fmt.Errorf("cuda: gpu %d: %w", i, wrap(err))
		}
		g := gpu{dev: dev, ctx: ctx, info: device.GPUInfo{Index: i, Name: info.Name, UUID: device.FormatUUID(uuid),
			PCIBusID: info.BusID, MemoryBytes: info.Total, Granularity: info.Granularity,
			ComputeCapability: info.Major*10 + info.Minor}}
		copy(g.info.Attributes[:], vals)
		b.gpus = append(b.gpus, g)
	}
	return b, nil
}

// wrap maps driver errors onto the device sentinels.
func wrap(err error) error {
	var ce *cu.Error
	if !errors.As(err, &ce) {
		return err
	}
	switch ce.Code {
	case cu.ErrorInvalidValue:
		return fmt.Errorf("%w: %w", device.ErrInvalidValue, err)
	case cu.ErrorOutOfMemory:
		return fmt.Errorf("%w: %w", device.ErrOutOfMemory, err)
	case cu.ErrorNotFound:
		return fmt.Errorf("%w: %w", device.ErrNotFound, err)
	case cu.ErrorIllegalAddress:
		return fmt.Errorf("%w: %w", device.ErrIllegalAddress, err)
	case cu.ErrorLaunchTimeout, cu.ErrorAssert, cu.ErrorHardwareStackError, cu.ErrorIllegalInstruction,
		cu.ErrorMisalignedAddress, cu.ErrorInvalidAddressSpace, cu.ErrorInvalidPC, cu.ErrorLaunchFailed:
		return fmt.Errorf("%w: %w", device.ErrKernelFault, err)
	case cu.ErrorInvalidImage:
		return fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
	case cu.ErrorNotReady:
		return fmt.Errorf("%w: %w", device.ErrNotReady, err)
	case cu.ErrorNotSupported, cu.ErrorPeerAccessUnsupp:
		return fmt.Errorf("%w: %w", device.ErrNotSupported, err)
	case cu.ErrorNoDevice, cu.ErrorNotInitialized:
		return fmt.Errorf("%w: %w", device.ErrUnavailable, err)
	}
	return err
}

func (b *Backend) gpu(i int) (*gpu, error) {
	if i < 0 || i >= len(b.gpus) {
		return nil, fmt.Errorf("%w: gpu %d (node has %d)", device.ErrInvalidValue, i, len(b.gpus))
	}
	return &b.gpus[i], nil
}

// Kind is "cuda".
func (b *Backend) Kind() string { return "cuda" }

// GPUs describes the GPUs.
func (b *Backend) GPUs() []device.GPUInfo {
	out := make([]device.GPUInfo, len(b.gpus))
	for i, g := range b.gpus {
		out[i] = g.info
	}
	return out
}

// CanAccessPeer asks the driver.
func (b *Backend) CanAccessPeer(g, peer int) bool {
	a, err1 := b.gpu(g)
	p, err2 := b.gpu(peer)
	if err1 != nil || err2 != nil || g == peer {
		return false
	}
	ok, err := cu.CanAccessPeer(a.dev, p.dev)
	return err == nil && ok
}

func (b *Backend) maxGranularity() uint64 {
	var m uint64
	for _, g := range b.gpus {
		m = max(m, g.info.Granularity)
	}
	return m
}

// ReserveAddress reserves address space (valid on every GPU: the address space is the process's).
func (b *Backend) ReserveAddress(size, alignment uint64) (device.Ptr, error) {
	if alignment == 0 {
		alignment = b.maxGranularity()
	}
	if size == 0 || size%b.maxGranularity() != 0 {
		return 0, fmt.Errorf("%w: reserve %d bytes (granularity %d)", device.ErrInvalidValue, size,
			b.maxGranularity())
	}
	p, err := cu.Reserve(b.gpus[0].ctx, size, alignment)
	return device.Ptr(p), wrap(err)
}

// ReserveAddressAt reserves [ptr, ptr+size) exactly: cuMemAddressReserve with ptr as its address hint, and an
// error wrapping device.ErrOutOfMemory (the range released again) when the driver placed it elsewhere.
func (b *Backend) ReserveAddressAt(ptr device.Ptr, size uint64) (device.Ptr, error) {
	g := b.maxGranularity()
	if ptr == 0 || size == 0 || size%g != 0 || uint64(ptr)%g != 0 {
		return 0, fmt.Errorf("%w: reserve %d bytes at %#x (granularity %d)", device.ErrInvalidValue, size,
			uint64(ptr), g)
	}
	p, err := cu.ReserveAt(b.gpus[0].ctx, size, g, uint64(ptr))
	if err != nil {
		return 0, wrap(err)
	}
	if device.Ptr(p) != ptr {
		ferr := cu.AddressFree(b.gpus[0].ctx, p, size)
		return 0, errors.Join(fmt.Errorf("%w: %d bytes at %#x: the driver reserved %#x instead",
			device.ErrOutOfMemory, size, uint64(ptr), p), wrap(ferr))
	}
	return ptr, nil
}

// FreeAddress releases a reservation.
func (b *Backend) FreeAddress(ptr device.Ptr, size uint64) error {
	return wrap(cu.AddressFree(b.gpus[0].ctx, uint64(ptr), size))
}

type physical struct {
	b      *Backend
	gpu    int
	size   uint64
	handle uint64
}

func (p *physical) GPU() int     { return p.gpu }
func (p *physical) Size() uint64 { return p.size }
func (p *physical) Release() error {
	return wrap(cu.Release(p.b.gpus[p.gpu].ctx, p.handle))
}

// CreatePhysical allocates physical memory on a GPU.
func (b *Backend) CreatePhysical(i int, size uint64) (device.Physical, error) {
	g, err := b.gpu(i)
	if err != nil {
		return nil, err
	}
	if size == 0 || size%g.info.Granularity != 0 {
		return nil, fmt.Errorf("%w: physical size %d is not a multiple of %d", device.ErrInvalidValue, size,
			g.info.Granularity)
	}
	b.mu.Lock()
	shareable := b.shareable
	b.mu.Unlock()
	var h uint64
	if shareable {
		h, err = cu.CreateShareable(g.ctx, g.dev, size)
	} else {
		h, err = cu.Create(g.ctx, g.dev, size)
	}
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", i, wrap(err))
	}
	return &physical{b: b, gpu: i, size: size, handle: h}, nil
}

// Map maps phys at ptr.
func (b *Backend) Map(ptr device.Ptr, phys device.Physical) error {
	p, ok := phys.(*physical)
	if !ok || p.b != b {
		return fmt.Errorf("%w: physical memory of another backend", device.ErrInvalidValue)
	}
	return b.MapRange(ptr, phys, 0, p.size)
}

var _ device.RangeMapper = (*Backend)(nil)

// MapRange maps [offset, offset+size) of phys at ptr (one cuMemMap).
func (b *Backend) MapRange(ptr device.Ptr, phys device.Physical, offset, size uint64) error {
	p, ok := phys.(*physical)
	if !ok || p.b != b {
		return fmt.Errorf("%w: physical memory of another backend", device.ErrInvalidValue)
	}
	if size == 0 || offset > p.size || size > p.size-offset {
		return fmt.Errorf("%w: map [%d,+%d) of a physical allocation of %d bytes", device.ErrInvalidValue, offset,
			size, p.size)
	}
	if err := cu.Map(b.gpus[p.gpu].ctx, uint64(ptr), size, offset, p.handle); err != nil {
		return wrap(err)
	}
	b.mu.Lock()
	b.maps[ptr] = size
	b.mu.Unlock()
	return nil
}

// mappings returns the mappings inside [ptr, ptr+size), in address order; they must cover it exactly.
func (b *Backend) mappings(ptr device.Ptr, size uint64) ([][2]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][2]uint64
	for p := uint64(ptr); p < uint64(ptr)+size; {
		n, ok := b.maps[device.Ptr(p)]
		if !ok {
			return nil, fmt.Errorf("%w: no mapping starts at %#x", device.ErrInvalidValue, p)
		}
		out = append(out, [2]uint64{p, n})
		p += n
	}
	return out, nil
}

// SetAccess grants GPUs access to a mapped range: one cuMemSetAccess over the whole range (the driver accepts a
// range spanning several mappings, as PyTorch's expandable segments use it), else one per mapping.
func (b *Backend) SetAccess(ptr device.Ptr, size uint64, gpus []int) error {
	return b.setAccess(ptr, size, gpus, false)
}

func (b *Backend) setAccess(ptr device.Ptr, size uint64, gpus []int, readOnly bool) error {
	devs := make([]int, len(gpus))
	for i, g := range gpus {
		gg, err := b.gpu(g)
		if err != nil {
			return err
		}
		devs[i] = gg.dev
	}
	ms, err := b.mappings(ptr, size)
	if err != nil {
		return err
	}
	if len(ms) > 1 && cu.SetAccess(b.gpus[0].ctx, uint64(ptr), size, devs) == nil {
		return nil
	}
	for _, m := range ms {
		set := cu.SetAccess
		if readOnly {
			set = cu.SetAccessReadOnly
		}
		if err := set(b.gpus[0].ctx, m[0], m[1], devs); err != nil {
			return wrap(err)
		}
	}
	return nil
}

// SetAccessReadOnly grants GPUs read access to a mapped range; writes fault (device.ReadOnlyAccess).
func (b *Backend) SetAccessReadOnly(ptr device.Ptr, size uint64, gpus []int) error {
	return b.setAccess(ptr, size, gpus, true)
}

// Unmap unmaps a range.
func (b *Backend) Unmap(ptr device.Ptr, size uint64) error {
	ms, err := b.mappings(ptr, size)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := cu.Unmap(b.gpus[0].ctx, m[0], m[1]); err != nil {
			return wrap(err)
		}
		b.mu.Lock()
		delete(b.maps, device.Ptr(m[0]))
		b.mu.Unlock()
	}
	return nil
}

// RegisterHost page-locks host memory for every context.
func (b *Backend) RegisterHost(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("%w: empty host buffer", device.ErrInvalidValue)
	}
	p := unsafe.Pointer(&buf[0])
	if err := cu.HostRegister(b.gpus[0].ctx, p, uint64(len(buf))); err != nil {
		return wrap(err)
	}
	b.mu.Lock()
	b.regs[uintptr(p)] = uint64(len(buf))
	b.mu.Unlock()
	return nil
}

// UnregisterHost undoes RegisterHost.
func (b *Backend) UnregisterHost(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("%w: empty host buffer", device.ErrInvalidValue)
	}
	p := unsafe.Pointer(&buf[0])
	b.mu.Lock()
	delete(b.regs, uintptr(p))
	b.mu.Unlock()
	return wrap(cu.HostUnregister(b.gpus[0].ctx, p))
}

// registered reports whether buf lies in registered host memory.
func (b *Backend) registered(buf []byte) bool {
	p := uintptr(unsafe.Pointer(&buf[0]))
	b.mu.Lock()
	defer b.mu.Unlock()
	for start, size := range b.regs {
		if p >= start && p+uintptr(len(buf)) <= start+uintptr(size) {
			return true
		}
	}
	return false
}

// MemoryInfo asks the driver.
func (b *Backend) MemoryInfo(i int) (uint64, uint64, error) {
	g, err := b.gpu(i)
	if err != nil {
		return 0, 0, err
	}
	free, total, err := cu.MemInfo(g.ctx)
	return free, total, wrap(err)
}

// Close releases the primary contexts.
func (b *Backend) Close(context.Context) error {
	var errs []error
	for _, g := range b.gpus {
		errs = append(errs, wrap(cu.Close(g.dev)))
	}
	b.gpus = nil
	return errors.Join(errs...)
}

// wait waits with the device package's algorithm (device.Wait), mapping the driver's errors.
func wait(ctx context.Context, done func() (bool, error), block func() error) error {
	return wrap(device.Wait(ctx, done, block))
}

type stream struct {
	b   *Backend
	gpu int
	ctx cu.Context
	s   cu.Stream
}

// NewStream creates a non-blocking stream on a GPU.
func (b *Backend) NewStream(i int) (device.Stream, error) {
	g, err := b.gpu(i)
	if err != nil {
		return nil, err
	}
	s, err := cu.StreamCreate(g.ctx)
	if err != nil {
		return nil, wrap(err)
	}
	return &stream{b: b, gpu: i, ctx: g.ctx, s: s}, nil
}

func (s *stream) GPU() int { return s.gpu }

func (s *stream) CopyHtoD(dst device.Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return wrap(cu.HtoD(s.ctx, uint64(dst), src, s.s, !s.b.registered(src)))
}

func (s *stream) CopyDtoH(dst []byte, src device.Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	return wrap(cu.DtoH(s.ctx, dst, uint64(src), s.s, !s.b.registered(dst)))
}

func (s *stream) CopyDtoD(dst, src device.Ptr, size uint64) error {
	return wrap(cu.DtoD(s.ctx, uint64(dst), uint64(src), size, s.s))
}

func (s *stream) Memset8(dst device.Ptr, v uint8, n uint64) error {
	return wrap(cu.Memset8(s.ctx, uint64(dst), v, n, s.s))
}

func (s *stream) Memset32(dst device.Ptr, v uint32, n uint64) error {
	return wrap(cu.Memset32(s.ctx, uint64(dst), v, n, s.s))
}

func (s *stream) Launch(f device.Function, grid, block device.Dim3, sharedMem uint32, args []byte) error {
	fn, ok := f.(*function)
	if !ok || fn.mod.b != s.b || fn.mod.gpu != s.gpu || fn.mod.ctx != s.ctx {
		return fmt.Errorf("%w: kernel not loaded on gpu %d in the stream's context", device.ErrInvalidValue, s.gpu)
	}
	if uint32(len(args)) < device.ArgsSize(fn.params) {
		return fmt.Errorf("%w: kernel %s needs %d argument bytes, got %d", device.ErrInvalidValue, fn.name,
			device.ArgsSize(fn.params), len(args))
	}
	n := func(d device.Dim3) [3]uint32 {
		return [3]uint32{max(d.X, 1), max(d.Y, 1), max(d.Z, 1)}
	}
	return wrap(cu.Launch(s.ctx, fn.f, n(grid), n(block), sharedMem, s.s, args))
}

func (s *stream) Record(e device.Event) error {
	ev, ok := e.(*event)
	if !ok {
		return fmt.Errorf("%w: event of another backend", device.ErrInvalidValue)
	}
	if err := cu.EventRecord(s.ctx, ev.e, s.s); err != nil {
		return wrap(err)
	}
	ev.recorded.Store(true)
	return nil
}

func (s *stream) Wait(e device.Event) error {
	ev, ok := e.(*event)
	if !ok {
		return fmt.Errorf("%w: event of another backend", device.ErrInvalidValue)
	}
	return wrap(cu.StreamWaitEvent(s.ctx, s.s, ev.e))
}

func (s *stream) Synchronize(ctx context.Context) error {
	return wait(ctx, func() (bool, error) { return cu.StreamQuery(s.ctx, s.s) },
		func() error { return cu.StreamSynchronize(s.ctx, s.s) })
}

func (s *stream) Destroy() error { return wrap(cu.StreamDestroy(s.ctx, s.s)) }
