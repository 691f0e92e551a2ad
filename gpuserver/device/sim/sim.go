package sim

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// DefaultGranularity is the simulated allocation granularity, as on current NVIDIA GPUs.
const DefaultGranularity = 2 << 20

// addressBase is where the simulated address space starts (so addresses look like device pointers).
const addressBase = device.Ptr(0x7f00_0000_0000)

// Options configure a simulated node.
type Options struct {
	// Node is the node to model (GPUs, memory, links); required.
	Node topology.Node
	// Clock for delays; WallClock when nil.
	Clock Clock
	// TimeScale multiplies every modelled duration; 0 runs without delays (tests), 1 in real time.
	TimeScale float64
	// Granularity of physical allocations and mappings; DefaultGranularity when 0.
	Granularity uint64
	// MemoryBytesPerSec is each GPU's device memory bandwidth for kernels, memsets and local copies
	// (900 GB/s when 0).
	MemoryBytesPerSec float64
	// FLOPS is each GPU's float32 rate for kernels (15 TFLOPS when 0).
	FLOPS float64
	// LaunchLatency is the fixed time of a kernel launch (5us when 0).
	LaunchLatency time.Duration
	// LaunchCPU is the CPU a real driver spends in cuLaunchKernel on the calling thread: each launch spins for it
	// on the caller's goroutine before it is queued (wall-clock time, not scaled; 0: none). It is what a
	// gpuserver's session thread pays per launch on a GPU host, which the sim's own launch path (a few map
	// operations) does not; the replay bench sets it (-server-launch-cpu).
	LaunchCPU time.Duration
	// Kernels says what happens to a launch of a kernel the sim cannot compute: refused (KernelsReference, the
	// default) or accepted and not executed (KernelsDry, for protocol tests only).
	Kernels KernelMode
	// MaxKernelOps bounds the element operations (multiply-adds of a matrix product, elements of an elementwise
	// kernel) of one launch of a reference kernel, which the sim computes on the host's CPU: a launch above it is
	// refused with ErrKernelTooLarge. DefaultMaxKernelOps when 0.
	MaxKernelOps uint64
	// ProcessWide models what the GPU suite measured on an H100 about one process (processwide.go): module globals
	// are reachable from every context of the backend, registered host memory is readable and writable by kernels
	// at its host address, and a context fault poisons every context of the backend and its own streams. Without
	// it each context is the isolation domain docs/security.md once assumed.
	ProcessWide bool
	// Profile gives kernels the GPU time recorded for them on a real GPU (timed mode: TimeScale > 0).
	Profile Profile
	// AddressBase is where the simulated address space starts (granularity-aligned; 0: the default). A tenant
	// executor starts it in its tenant's address window, so that even the memory the sim places itself (module
	// globals) lies at addresses no other tenant's process uses.
	AddressBase device.Ptr
}

// Profile gives kernels their GPU time in the timed mode, as recorded on a real GPU (see the package
// documentation).
type Profile struct {
	// Kernels is the GPU time of one launch of a kernel, by its name in the module (mangled for C++ kernels).
	// It replaces what the sim would model for a reference kernel.
	Kernels map[string]time.Duration
	// Launch is the GPU time of a launch of a kernel that is neither in Kernels nor computed by the sim (a dry
	// kernel): a pass's GPU time spread over its launches, say. LaunchLatency when 0.
	Launch time.Duration
}

// engine is a GPU's compute engine in the timed mode: kernels, memsets and local copies of all its streams run
// on it one at a time.
type engine struct {
	mu   sync.Mutex
	free time.Time // when its last reserved work ends
}

// reserve queues work of duration d that may start at ready and returns when it starts.
func (e *engine) reserve(ready time.Time, d time.Duration) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	start := ready
	if e.free.After(start) {
		start = e.free
	}
	e.free = start.Add(d)
	return start
}

// DefaultMaxKernelOps is Options.MaxKernelOps when none is set: about ten seconds of one core computing a matrix
// product (2^33 multiply-adds; the mlp example's forward pass of 64 rows takes 2^31).
const DefaultMaxKernelOps = 1 << 33

// ErrKernelTooLarge is wrapped by the error of launching a reference kernel whose work exceeds
// Options.MaxKernelOps.
var ErrKernelTooLarge = fmt.Errorf("%w: kernel too large for the simulated GPU", device.ErrNotSupported)

// KernelMode is what the sim does with kernels it cannot compute (see the package documentation).
type KernelMode int

const (
	// KernelsReference: the sim computes its reference kernels and refuses to launch any other kernel.
	KernelsReference KernelMode = iota
	// KernelsDry: kernels the sim cannot compute are accepted and not executed (their outputs are left as they
	// were). Only for protocol tests: results are wrong.
	KernelsDry
)

func (k KernelMode) String() string {
	if k == KernelsDry {
		return "dry"
	}
	return "reference"
}

// ParseKernelMode reads "reference" or "dry" (the gpuserver's --sim-kernels flag).
func ParseKernelMode(s string) (KernelMode, error) {
	switch s {
	case "reference":
		return KernelsReference, nil
	case "dry":
		return KernelsDry, nil
	}
	return 0, fmt.Errorf("%w: sim kernels %q: want reference or dry", device.ErrInvalidValue, s)
}

// ErrKernelNotSimulated is wrapped by the error of launching a kernel the sim cannot compute outside dry mode: it is
// device.ErrKernelNotSimulated, which wraps device.ErrNotSupported (CUDA_ERROR_NOT_SUPPORTED through the shim).
var ErrKernelNotSimulated = device.ErrKernelNotSimulated

// defaultComputeCapability is a simulated GPU's when its topology does not say (a V100's, as before topologies
// carried one).
const defaultComputeCapability = 70

// Backend is a simulated node; it implements device.Backend.
type Backend struct {
	opts    Options
	node    topology.Node
	clock   Clock
	gran    uint64
	gpus    []device.GPUInfo
	engines []engine // per GPU: the timed mode's compute timeline

	ctx    context.Context // ends at Close: stops every stream's delays
	cancel context.CancelFunc

	mu        sync.RWMutex
	nextAddr  device.Ptr
	reserved  map[device.Ptr]uint64 // reservation start -> size
	pages     map[uint64]*mapping   // page index (addr / gran) -> mapping
	used      []uint64              // physical bytes allocated per GPU
	streams   map[*stream]struct{}  // live streams, for Close
	hostRegs  map[*byte]int         // registered host buffers (start -> len)
	transfers map[*transfer]topology.Path
	failed    map[int]error // GPUs failed by FailGPU: the error their streams' work returns
	nextCtx   uint64        // ids of contexts (NewContext), from 1
	closed    bool

	dryLaunches atomic.Uint64         // launches accepted and not executed (KernelsDry)
	poisoned    atomic.Pointer[error] // the process-wide fault (ProcessWide)
	workers     sync.WaitGroup
}

// mapping is one physical allocation mapped at start.
type mapping struct {
	start    device.Ptr
	phys     *physical
	offset   uint64 // of the mapped part in phys (MapRange)
	size     uint64 // of the mapped part
	access   uint64 // bit i: GPU i may access
	ctx      uint64 // the context owning it (module memory), 0: the process's (Map)
	readOnly bool   // SetAccessReadOnly: copies, memsets and reference kernels' writes into it fault
}

type transfer struct{}

var _ device.Backend = (*Backend)(nil)

// New builds a simulated node.
func New(opts Options) (*Backend, error) {
	if err := opts.Node.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if len(opts.Node.GPUs) > 64 {
		return nil, fmt.Errorf("sim: %w: at most 64 GPUs", device.ErrInvalidValue)
	}
	if opts.Kernels != KernelsReference && opts.Kernels != KernelsDry {
		return nil, fmt.Errorf("sim: %w: kernel mode %d", device.ErrInvalidValue, opts.Kernels)
	}
	if opts.LaunchCPU < 0 {
		return nil, fmt.Errorf("%w: sim: LaunchCPU %v is negative", device.ErrInvalidValue, opts.LaunchCPU)
	}
	if opts.TimeScale < 0 {
		return nil, fmt.Errorf("sim: %w: time scale must be >= 0", device.ErrInvalidValue)
	}
	if opts.Clock == nil {
		opts.Clock = WallClock{}
	}
	if opts.Granularity == 0 {
		opts.Granularity = DefaultGranularity
	}
	if opts.Granularity&(opts.Granularity-1) != 0 || opts.Granularity < 4096 {
		return nil, fmt.Errorf("sim: %w: granularity must be a power of two >= 4096", device.ErrInvalidValue)
	}
	if opts.MemoryBytesPerSec == 0 {
		opts.MemoryBytesPerSec = 900e9
	}
	if opts.MaxKernelOps == 0 {
		opts.MaxKernelOps = DefaultMaxKernelOps
	}
	if opts.FLOPS == 0 {
		opts.FLOPS = 15e12
	}
	if opts.LaunchLatency == 0 {
		opts.LaunchLatency = 5 * time.Microsecond
	}
	if opts.Profile.Launch < 0 {
		return nil, fmt.Errorf("sim: %w: profile launch time %v", device.ErrInvalidValue, opts.Profile.Launch)
	}
	for name, d := range opts.Profile.Kernels {
		if d < 0 {
			return nil, fmt.Errorf("sim: %w: profile time %v of kernel %s", device.ErrInvalidValue, d, name)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		opts: opts, node: opts.Node.Clone(), clock: opts.Clock, gran: opts.Granularity,
		ctx: ctx, cancel: cancel,
		nextAddr: cmp.Or(opts.AddressBase, addressBase), reserved: map[device.Ptr]uint64{}, pages: map[uint64]*mapping{},
		used: make([]uint64, len(opts.Node.GPUs)), streams: map[*stream]struct{}{},
		hostRegs: map[*byte]int{}, transfers: map[*transfer]topology.Path{}, failed: map[int]error{},
		engines: make([]engine, len(opts.Node.GPUs)),
	}
	for i, g := range b.node.GPUs {
		b.gpus = append(b.gpus, simulatedGPU(b.node.Name, i, g, b.gran))
	}
	return b, nil
}

// spinLaunchCPU spins on the calling goroutine, its OS thread locked, until that thread has spent
// Options.LaunchCPU of CPU (the thread's CPU clock, so that a thread the machine's other work preempts still
// spends the driver's CPU, and takes longer for it, as a driver call would).
func (b *Backend) spinLaunchCPU() {
	if b.opts.LaunchCPU <= 0 {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		for end := time.Now().Add(b.opts.LaunchCPU); time.Now().Before(end); {
		}
		return
	}
	end := ts.Nano() + int64(b.opts.LaunchCPU)
	for ts.Nano() < end {
		if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
			return
		}
	}
}

// timed reports whether modelled time is kept (TimeScale > 0).
func (b *Backend) timed() bool { return b.opts.TimeScale > 0 }

// waitUntil returns once the modelled time at has passed, or ctx ended. On the wall clock it waits as the
// real backend waits for the driver (device.Wait: it polls, or blocks when ctx cannot end), the GPU's
// completion itself being exact; another clock is slept on.
func (b *Backend) waitUntil(ctx context.Context, at time.Time) error {
	if !b.timed() || !b.clock.Now().Before(at) {
		return nil
	}
	if _, ok := b.clock.(WallClock); !ok {
		return b.clock.SleepUntil(ctx, at)
	}
	return device.Wait(ctx, func() (bool, error) { return !time.Now().Before(at), nil },
		func() error { return sleepPrecisely(ctx, at) })
}

// ComputeEnd is when the work queued so far on GPU gpu's compute engine ends in modelled time (the timed mode; the
// zero time before any): benchmarks read how late a synchronize returned after the GPU finished.
func (b *Backend) ComputeEnd(gpu int) time.Time {
	if gpu < 0 || gpu >= len(b.engines) {
		return time.Time{}
	}
	e := &b.engines[gpu]
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.free
}

// Node returns the modelled node.
func (b *Backend) Node() topology.Node { return b.node.Clone() }

// TimeScale is the factor applied to every modelled duration (Options.TimeScale).
func (b *Backend) TimeScale() float64 { return b.opts.TimeScale }

// ProcessWide reports whether the backend models what one process shares on a real GPU (Options.ProcessWide).
func (b *Backend) ProcessWide() bool { return b.opts.ProcessWide }

// KernelMode is what the sim does with kernels it cannot compute.
func (b *Backend) KernelMode() KernelMode { return b.opts.Kernels }

// DryLaunches counts the launches accepted and not executed in KernelsDry mode.
func (b *Backend) DryLaunches() uint64 { return b.dryLaunches.Load() }

// Kind is "sim".
func (b *Backend) Kind() string { return "sim" }

// GPUs describes the simulated GPUs.
func (b *Backend) GPUs() []device.GPUInfo { return append([]device.GPUInfo(nil), b.gpus...) }

// CanAccessPeer is true between distinct GPUs (peer copies without NVLink are modelled as staged through host).
func (b *Backend) CanAccessPeer(gpu, peer int) bool {
	return gpu != peer && b.validGPU(gpu) == nil && b.validGPU(peer) == nil
}

func (b *Backend) validGPU(gpu int) error {
	if gpu < 0 || gpu >= len(b.gpus) {
		return fmt.Errorf("%w: gpu %d (node has %d)", device.ErrInvalidValue, gpu, len(b.gpus))
	}
	return nil
}

// ReserveAddress reserves address space valid on every GPU.
func (b *Backend) ReserveAddress(size, alignment uint64) (device.Ptr, error) {
	if alignment == 0 {
		alignment = b.gran
	}
	if size == 0 || size%b.gran != 0 || alignment&(alignment-1) != 0 {
		return 0, fmt.Errorf("%w: reserve size %d alignment %d (granularity %d)", device.ErrInvalidValue, size,
			alignment, b.gran)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
	a := alignUp(uint64(b.nextAddr), alignment)
	// leave one unmapped granule between reservations so overruns fault
	b.nextAddr = device.Ptr(a + size + b.gran)
	b.reserved[device.Ptr(a)] = size
	return device.Ptr(a), nil
}

// ReserveAddressAt reserves exactly [ptr, ptr+size); it fails with device.ErrOutOfMemory when the range overlaps
// a reservation. Later ReserveAddress calls allocate above it.
func (b *Backend) ReserveAddressAt(ptr device.Ptr, size uint64) (device.Ptr, error) {
	if ptr == 0 || size == 0 || size%b.gran != 0 || uint64(ptr)%b.gran != 0 {
		return 0, fmt.Errorf("%w: reserve %d bytes at %#x (granularity %d)", device.ErrInvalidValue, size,
			uint64(ptr), b.gran)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, fmt.Errorf("sim: %w: closed", device.ErrUnavailable)
	}
	end := uint64(ptr) + size
	for start, s := range b.reserved {
		if uint64(ptr) < uint64(start)+s && uint64(start) < end {
			return 0, fmt.Errorf("%w: %d bytes at %#x overlap the reservation of %d bytes at %#x",
				device.ErrOutOfMemory, size, uint64(ptr), s, uint64(start))
		}
	}
	b.reserved[ptr] = size
	if next := device.Ptr(end + b.gran); next > b.nextAddr {
		b.nextAddr = next
	}
	return ptr, nil
}

// FailGPU injects a device failure: from now on every operation that runs on a stream of GPU gpu fails with err
// (reported, as by a real driver, at the stream's next synchronisation or event). A nil err repairs the GPU.
func (b *Backend) FailGPU(gpu int, err error) error {
	if verr := b.validGPU(gpu); verr != nil {
		return verr
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		delete(b.failed, gpu)
	} else {
		b.failed[gpu] = err
	}
	return nil
}

func (b *Backend) failure(gpu int) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.failed[gpu]
}

// FreeAddress releases a reservation.
func (b *Backend) FreeAddress(ptr device.Ptr, size uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.reserved[ptr]; !ok || s != size {
		return fmt.Errorf("%w: no reservation of %d bytes at %#x", device.ErrInvalidValue, size, uint64(ptr))
	}
	for p := uint64(ptr) / b.gran; p < (uint64(ptr)+size)/b.gran; p++ {
		if _, ok := b.pages[p]; ok {
			return fmt.Errorf("%w: reservation at %#x still has mappings", device.ErrInvalidValue, uint64(ptr))
		}
	}
	delete(b.reserved, ptr)
	return nil
}

func (b *Backend) inReservation(ptr device.Ptr, size uint64) bool {
	for start, s := range b.reserved {
		if ptr >= start && uint64(ptr)+size <= uint64(start)+s {
			return true
		}
	}
	return false
}

// CreatePhysical allocates simulated physical memory (host pages allocated on first touch).
func (b *Backend) CreatePhysical(gpu int, size uint64) (device.Physical, error) {
	if err := b.validGPU(gpu); err != nil {
		return nil, err
	}
	if size == 0 || size%b.gran != 0 {
		return nil, fmt.Errorf("%w: physical size %d is not a multiple of %d", device.ErrInvalidValue, size, b.gran)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used[gpu]+size > b.gpus[gpu].MemoryBytes {
		return nil, fmt.Errorf("%w: gpu %d: %d bytes requested, %d of %d in use", device.ErrOutOfMemory, gpu, size,
			b.used[gpu], b.gpus[gpu].MemoryBytes)
	}
	b.used[gpu] += size
	return &physical{b: b, gpu: gpu, size: size, pages: make([][]byte, size/b.gran)}, nil
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

// MapRange maps [offset, offset+size) of phys at ptr.
func (b *Backend) MapRange(ptr device.Ptr, phys device.Physical, offset, size uint64) error {
	p, ok := phys.(*physical)
	if !ok || p.b != b {
		return fmt.Errorf("%w: physical memory of another backend", device.ErrInvalidValue)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.released {
		return fmt.Errorf("%w: physical memory released", device.ErrInvalidValue)
	}
	if size == 0 || offset%b.gran != 0 || size%b.gran != 0 || offset > p.size || size > p.size-offset {
		return fmt.Errorf("%w: map [%d,+%d) of a physical allocation of %d bytes (granularity %d)",
			device.ErrInvalidValue, offset, size, p.size, b.gran)
	}
	if uint64(ptr)%b.gran != 0 || !b.inReservation(ptr, size) {
		return fmt.Errorf("%w: map %d bytes at %#x: not aligned or not inside a reservation", device.ErrInvalidValue,
			size, uint64(ptr))
	}
	first, n := uint64(ptr)/b.gran, size/b.gran
	for i := range n {
		if _, ok := b.pages[first+i]; ok {
			return fmt.Errorf("%w: %#x is already mapped", device.ErrInvalidValue, (first+i)*b.gran)
		}
	}
	m := &mapping{start: ptr, phys: p, offset: offset, size: size}
	for i := range n {
		b.pages[first+i] = m
	}
	p.maps++
	return nil
}

// SetAccess grants GPUs access to a mapped range.
func (b *Backend) SetAccess(ptr device.Ptr, size uint64, gpus []int) error {
	var mask uint64
	for _, g := range gpus {
		if err := b.validGPU(g); err != nil {
			return err
		}
		mask |= 1 << g
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ms, err := b.mappingsLocked(ptr, size)
	if err != nil {
		return err
	}
	for _, m := range ms {
		for _, g := range gpus {
			if g != m.phys.gpu && !b.CanAccessPeer(g, m.phys.gpu) {
				return fmt.Errorf("%w: gpu %d cannot access gpu %d", device.ErrNotSupported, g, m.phys.gpu)
			}
		}
	}
	for _, m := range ms {
		m.access = mask
		m.readOnly = false
	}
	return nil
}

// SetAccessReadOnly grants GPUs read access to a mapped range: the simulated device refuses copies, memsets and the
// writes of reference kernels into it (ErrIllegalAddress, a fault of the work as on a GPU). A dry launch (a kernel the
// sim does not compute) cannot know what it writes: it is accepted.
func (b *Backend) SetAccessReadOnly(ptr device.Ptr, size uint64, gpus []int) error {
	if err := b.SetAccess(ptr, size, gpus); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ms, err := b.mappingsLocked(ptr, size)
	if err != nil {
		return err
	}
	for _, m := range ms {
		m.readOnly = true
	}
	return nil
}

// ownMemory makes the mapping at ptr memory of context ctx: reachable from that context's work only.
func (b *Backend) ownMemory(ptr device.Ptr, ctx uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m, ok := b.pages[uint64(ptr)/b.gran]; ok {
		m.ctx = ctx
	}
}

// Unmap removes whole mappings in a range.
func (b *Backend) Unmap(ptr device.Ptr, size uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ms, err := b.mappingsLocked(ptr, size)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.start < ptr || uint64(m.start)+m.size > uint64(ptr)+size {
			return fmt.Errorf("%w: unmap [%#x,+%d) cuts the mapping at %#x", device.ErrInvalidValue, uint64(ptr), size,
				uint64(m.start))
		}
	}
	for _, m := range ms {
		first := uint64(m.start) / b.gran
		for i := range m.size / b.gran {
			delete(b.pages, first+i)
		}
		m.phys.maps--
	}
	return nil
}

// mappingsLocked returns the distinct mappings covering [ptr, ptr+size); every page must be mapped.
func (b *Backend) mappingsLocked(ptr device.Ptr, size uint64) ([]*mapping, error) {
	if size == 0 || uint64(ptr)%b.gran != 0 || size%b.gran != 0 {
		return nil, fmt.Errorf("%w: range [%#x,+%d) not aligned to %d", device.ErrInvalidValue, uint64(ptr), size,
			b.gran)
	}
	var out []*mapping
	for p := uint64(ptr) / b.gran; p < (uint64(ptr)+size)/b.gran; p++ {
		m, ok := b.pages[p]
		if !ok {
			return nil, fmt.Errorf("%w: %#x is not mapped", device.ErrInvalidValue, p*b.gran)
		}
		if len(out) == 0 || out[len(out)-1] != m {
			out = append(out, m)
		}
	}
	return out, nil
}

// RegisterHost records a host buffer as page-locked (the sim needs nothing more).
func (b *Backend) RegisterHost(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("%w: empty host buffer", device.ErrInvalidValue)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.hostRegs[&buf[0]]; ok {
		return fmt.Errorf("%w: host buffer already registered", device.ErrInvalidValue)
	}
	b.hostRegs[&buf[0]] = len(buf)
	return nil
}

// UnregisterHost forgets a registered host buffer.
func (b *Backend) UnregisterHost(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("%w: empty host buffer", device.ErrInvalidValue)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.hostRegs[&buf[0]]; !ok {
		return fmt.Errorf("%w: host buffer not registered", device.ErrInvalidValue)
	}
	delete(b.hostRegs, &buf[0])
	return nil
}

// MemoryInfo returns the simulated free and total memory of a GPU.
func (b *Backend) MemoryInfo(gpu int) (uint64, uint64, error) {
	if err := b.validGPU(gpu); err != nil {
		return 0, 0, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.gpus[gpu].MemoryBytes - b.used[gpu], b.gpus[gpu].MemoryBytes, nil
}

// Close stops every stream and releases the node.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	streams := make([]*stream, 0, len(b.streams))
	for s := range b.streams {
		streams = append(streams, s)
	}
	b.mu.Unlock()
	b.cancel()
	for _, s := range streams {
		s.stop()
	}
	done := make(chan struct{})
	go func() { b.workers.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sim: close: %w", ctx.Err())
	}
}

// startTransfer registers a transfer on path p and returns its modelled duration given the transfers already
// running; endTransfer removes it.
func (b *Backend) startTransfer(p topology.Path, bytes uint64) (*transfer, time.Duration) {
	t := &transfer{}
	b.mu.Lock()
	active := make([]topology.Path, 0, len(b.transfers)+1)
	for _, a := range b.transfers {
		active = append(active, a)
	}
	b.transfers[t] = p
	b.mu.Unlock()
	return t, b.node.TransferTime(bytes, p, active)
}

func (b *Backend) endTransfer(t *transfer) {
	b.mu.Lock()
	delete(b.transfers, t)
	b.mu.Unlock()
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// sortedGPUs is a helper for messages.
func sortedGPUs(mask uint64) []int {
	var out []int
	for i := range 64 {
		if mask&(1<<i) != 0 {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return out
}

// simulatedGPU describes GPU i of a simulated node: the complete attribute table of its model (attrs.Models), or
// of its architecture's model when the name is not one (the topology's compute capability,
// defaultComputeCapability when it has none); a PCI slot 0000:<0x10+i>:00.0; a UUID derived from the node and
// index.
func simulatedGPU(node string, i int, g topology.GPU, gran uint64) device.GPUInfo {
	m, err := attrs.ForModel(g.Name)
	if err != nil || g.ComputeCapability != 0 && g.ComputeCapability != m.ComputeCapability() {
		cc := g.ComputeCapability
		if cc == 0 {
			cc = defaultComputeCapability
		}
		m = attrs.ForArch(cc)
	}
	t := m.Table()
	bus := 0x10 + i
	t.SetPCI(m, 0, bus, 0)
	t[attrs.MultiGpuBoardGroupId] = int32(i)
	sum := sha256.Sum256([]byte(fmt.Sprintf("faas-gpu simulated node %s gpu %d", node, i)))
	var uuid [16]byte
	copy(uuid[:], sum[:16])
	uuid[6] = uuid[6]&0x0f | 0x40 // a version 4 (random) UUID, as the driver's are
	uuid[8] = uuid[8]&0x3f | 0x80
	return device.GPUInfo{
		Index: i, Name: g.Name + " (simulated)", UUID: device.FormatUUID(uuid),
		PCIBusID: fmt.Sprintf("0000:%02x:00.0", bus), MemoryBytes: g.MemoryBytes, Granularity: gran,
		ComputeCapability: m.ComputeCapability(), Attributes: t,
	}
}
