package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// Binding is one request's hold on the GPU its function is active on.
type Binding struct {
	n        *Node
	f        *function // the state it binds; replaced by a new one when the function is reset
	function string
	gpu      int
	epoch    uint64 // the function's fault epoch when bound (see fault.go)
	// guarded by Node.mu:
	released bool
	expired  error // set by Expire: the binding was held too long and ended
}

// GPU the binding runs on.
func (b *Binding) GPU() int { return b.gpu }

// Function bound.
func (b *Binding) Function() string { return b.function }

// Err reports a binding that broke, so that the work of its request may not have completed and its device state
// must not be trusted: its GPU was marked unhealthy while it was held (wraps ErrUnhealthy and the GPU's
// failure), the function's memory was reset under it because every process of the function ended (wraps
// ErrBroken), or a kernel fault tore down the function's context and restored its memory from the host image
// (wraps ErrBroken and ErrContextFault).
func (b *Binding) Err() error {
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	if e := b.n.execs[b.gpu]; !e.healthy {
		return fmt.Errorf("%w: %s was bound to gpu %d, which failed: %w", ErrUnhealthy, b.function, b.gpu, e.lastErr)
	}
	if b.f.broken != nil {
		return fmt.Errorf("%w: %s: %w", ErrBroken, b.function, b.f.broken)
	}
	if b.f.epoch != b.epoch {
		return fmt.Errorf("%w: %s: %w", ErrBroken, b.function, b.f.fault)
	}
	if b.expired != nil {
		return fmt.Errorf("%w: %s: %w", ErrBroken, b.function, b.expired)
	}
	return nil
}

// Orphaned reports whether the function was reset under the binding (every process of the function ended while
// it was held): nothing may run under it any more, unlike a binding broken by a fault, whose request goes on (and
// fails at release).
func (b *Binding) Orphaned() bool {
	b.n.mu.Lock()
	defer b.n.mu.Unlock()
	return b.f.broken != nil
}

// Release ends the binding; the function's copy stays resident (parked or active) until evicted. The last binding
// of a function whose scratch is per request drops that scratch (an operation: it waits for the function's work).
func (b *Binding) Release() {
	n := b.n
	n.mu.Lock()
	perRequest := b.f.scratchPerRequest
	n.mu.Unlock()
	if perRequest {
		defer n.operate()()
	} else {
		n.mu.Lock()
		defer n.mu.Unlock()
	}
	if b.released {
		return
	}
	b.released = true
	switch {
	case b.expired != nil:
		b.f.fenced-- // it stopped counting as a user when it expired
		return
	case b.f.users > 0:
		b.f.users--
	}
	if perRequest && b.f.users == 0 && b.f.scratchPerRequest && b.f.active == b.gpu {
		defer n.moving(b.f)()
		if err := n.dropScratchLocked(n.ctx, b.f); err != nil {
			n.log.Warn("executor: dropping the scratch of a request", "function", b.function, "gpu", b.gpu,
				"err", err)
		}
	}
}

// ErrHoldExpired: a binding was held longer than its function may hold a GPU (Expire).
var ErrHoldExpired = errors.New("binding held longer than the most a request may hold a GPU")

// Expire ends a binding held longer than its function may hold a GPU (cause says how long): the binding breaks
// (Err wraps ErrBroken and ErrHoldExpired), it stops counting as a user of the GPU (other functions may be placed
// there), and the function's device work is refused (ErrBroken, ErrHoldExpired) until the binding is released
// whenever the function holds no other binding, so that its request cannot go on using the GPU on its own; the
// function's other requests are bound and served meanwhile (their work and any late work of the expired request
// share their bindings, as concurrent requests of one function do). Work the function had queued there gets grace to finish; what has
// not finished by then is stopped: the function's tenant context on the GPU is torn down as after a fault (the
// tenant's functions active there come back from their images). Expire returns once that is done; it is a no-op
// for a binding released or expired already.
func (n *Node) Expire(ctx context.Context, b *Binding, grace time.Duration, cause error) error {
	n.mu.Lock()
	if b.released || b.expired != nil {
		n.mu.Unlock()
		return nil
	}
	f := b.f
	b.expired = fmt.Errorf("%w: %w", ErrHoldExpired, cause)
	if f.users > 0 {
		f.users--
	}
	f.fenced++
	var ev device.Event
	if s, ok := f.streams[b.gpu]; ok && f.active == b.gpu {
		if c, err := n.contextLocked(f.tenant, b.gpu); err == nil {
			if ev, err = c.NewEvent(); err == nil && s.Record(ev) != nil {
				_ = ev.Destroy()
				ev = nil
			}
		}
	}
	n.log.Warn("binding held too long: it is broken and the function's work refused until its request releases it",
		"function", b.function, "gpu", b.gpu, "err", cause)
	n.mu.Unlock()
	if ev != nil {
		defer ev.Destroy()
	}
	wctx, cancel := context.WithTimeout(ctx, grace)
	err := error(nil)
	if ev != nil {
		err = ev.Synchronize(wctx)
	}
	cancel()
	defer n.operate()()
	// Re-checked now that the operation holds the node: the function may have been moved, restored after a fault
	// or reset while its work was waited for.
	if err == nil || ctx.Err() != nil {
		// Its work finished (or failed, which its next synchronisation reports): its memory leaves the GPU's
		// mappings, so that the GPU may serve another tenant while the request has not released the binding.
		if f.active == b.gpu && f.users == 0 {
			if err := n.deactivateLocked(ctx, f); err != nil && !errors.Is(err, ErrContextFault) {
				return err
			}
		}
		return nil
	}
	// Stop it: the context goes out of service first (new work gets a new one), its queued work is dropped when
	// it is destroyed (with mu released: a kernel running on it finishes first), and only then does the memory it
	// could write go back to the pools.
	why := fmt.Errorf("%w: its queued work was stopped: %w", ErrHoldExpired, cause)
	defer n.movingTenantLocked(f.tenant)()
	dead := n.detachLocked(f.tenant, b.gpu, why)
	if dead == nil {
		return nil // torn down meanwhile (a fault), with its memory
	}
	if derr := n.unlocked(dead.Destroy); derr != nil {
		n.log.Warn("destroying the context of an expired binding", "gpu", b.gpu, "err", derr)
	}
	n.dropTenantLocked(f, b.gpu, why)
	return nil
}

// Acquire binds a request of function to GPU gpu, swapping the model in from source (see SwapIn). With gpu < 0
// the node picks: the GPU the function is active on, else a healthy GPU holding a parked copy, else the healthy
// GPU with the most free memory, copying from a GPU with a copy when peer access allows, else from host. Several
// bindings of one function share its active GPU.
func (n *Node) Acquire(ctx context.Context, name string, gpu int, source Source) (*Binding, error) {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return nil, err
	}
	f.admitting++ // a new request: an expired binding of the function does not refuse it (usableLocked)
	defer func() { f.admitting-- }()
	defer n.moving(f)()
	if err := n.checkScratchLocked(f); err != nil { // usableLocked, and scratch a destroyed copy held (scratch.go)
		return nil, err
	}
	if gpu < 0 {
		gpu, source = n.placeLocked(f)
		if gpu < 0 {
			return nil, fmt.Errorf("%w: no healthy gpu for %s", ErrUnhealthy, name)
		}
	}
	if err := n.swapInLocked(ctx, f, gpu, source); err != nil {
		return nil, err
	}
	f.users++
	return &Binding{n: n, f: f, function: name, gpu: gpu, epoch: f.epoch}, nil
}

func (n *Node) placeLocked(f *function) (gpu int, source Source) {
	if f.active >= 0 && n.execs[f.active].healthy {
		return f.active, Host
	}
	for g, e := range n.execs {
		if _, ok := f.res[g]; ok && e.healthy {
			return g, Host
		}
	}
	best, free := -1, -1
	for g, e := range n.execs {
		if fr := n.mem.Pool(g).Free(); e.healthy && fr > free {
			best, free = g, fr
		}
	}
	if best < 0 {
		return -1, Host
	}
	for g := range f.res {
		if n.execs[g].healthy && n.dev.CanAccessPeer(best, g) {
			return best, g
		}
	}
	return best, Host
}

// Alloc gives function a block of size bytes at a fixed address: part of the model before Capture, scratch after.
// When the function is active, the block is backed and mapped at once.
func (n *Node) Alloc(ctx context.Context, name string, size uint64) (device.Ptr, error) {
	ptr, _, _, err := n.AllocSegment(ctx, name, size, Serving)
	return ptr, err
}

// Phase is where the process of a function that allocates a block is in its life: the kind of a block allocated
// after the function's image was captured depends on it (blockKind).
type Phase bool

const (
	// Serving: the process's own initialisation has ended (its first request bound it): a block it allocates
	// after the capture is scratch.
	Serving Phase = false
	// Initialising: the process is still in its own initialisation: after the capture (a replica started after
	// the function's first request, or a rolling update's new process), a block it allocates is memory.KindInit,
	// the function's own whatever its scratch mode (scratch.go): its initialisation's bytes are never given back
	// or mapped zeroed.
	Initialising Phase = true
)

// blockKind is the kind of a block f's process in phase allocates now.
func blockKind(f *function, phase Phase) memory.Kind {
	switch {
	case !f.captured:
		return memory.KindModel
	case phase == Initialising:
		return memory.KindInit
	}
	return memory.KindScratch
}

// AllocSegment is Alloc for a process in phase that also returns the segment the block lies in and whether this
// call created it (a block of at least half a chunk gets a segment of its own, whose chunks go back to the pools
// when it is freed).
func (n *Node) AllocSegment(ctx context.Context, name string, size uint64,
	phase Phase) (device.Ptr, memory.Segment, bool, error) {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return 0, memory.Segment{}, false, err
	}
	defer n.moving(f)()
	if err := f.usableLocked(); err != nil {
		return 0, memory.Segment{}, false, err
	}
	n.hintLocked(f)
	ptr, seg, created, err := f.space.Alloc(size, blockKind(f, phase))
	if n.addrs != nil {
		n.addrs.setHint(0, 0)
	}
	if err != nil {
		return 0, memory.Segment{}, false, err
	}
	if created {
		n.matchLocked(f, seg)
	}
	if created && seg.Ptr == ptr && size >= n.mem.ChunkSize()/2 {
		f.own[seg.ID] = true
	}
	if created && f.active >= 0 {
		if err := n.completeLocked(ctx, f, f.active, Host); err != nil {
			return 0, memory.Segment{}, false, errors.Join(err, n.freeLocked(ctx, f, ptr))
		}
	}
	return ptr, seg, created, nil
}

// Free releases a block of function. A block with a segment of its own gives its chunks back on every GPU (its
// work must have completed); its address range stays reserved for the function.
func (n *Node) Free(name string, ptr device.Ptr) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	defer n.moving(f)()
	return n.freeLocked(context.Background(), f, ptr)
}

func (n *Node) freeLocked(ctx context.Context, f *function, ptr device.Ptr) error {
	seg, ok := f.space.Lookup(ptr)
	if err := f.space.Free(ptr); err != nil {
		return err
	}
	if !ok || !f.own[seg.ID] || seg.Ptr != ptr {
		return nil
	}
	delete(f.own, seg.ID)
	f.dead[seg.ID] = true
	var errs []error
	for gpu, r := range f.res { // the waits and unmaps with mu released (f is moving: the caller's operation's)
		if ev, ok := r.ready[seg.ID]; ok {
			errs = append(errs, n.unlocked(func() error { return ev.Synchronize(ctx) }), ev.Destroy())
			delete(r.ready, seg.ID)
		}
		if r.mapped[seg.ID] {
			errs = append(errs, n.unlocked(func() error { return n.mem.Unmap(seg.Ptr, seg.Size) }))
			delete(r.mapped, seg.ID)
		}
		if chunks, ok := r.chunks[seg.ID]; ok {
			errs = append(errs, n.putChunksLocked(gpu, chunks))
			delete(r.chunks, seg.ID)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("function %s: free segment %d: %w", f.name, seg.ID, err)
	}
	return nil
}

// Segments returns function's segments (fixed addresses, sizes, kinds), freed ones included.
func (n *Node) Segments(name string) ([]memory.Segment, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return nil, err
	}
	return f.space.Segments(), nil
}

// Capture ends function's initialisation: the bytes of its model segments on its active GPU become its image in
// the repository, and later blocks are scratch. The function's work must be submitted before (it is waited for).
// Its own work waits while it copies; other functions' work goes on.
func (n *Node) Capture(ctx context.Context, name string) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	defer n.moving(f)()
	if f.plan != nil && n.reuseLocked(f) {
		return nil // its image from before a restart is its capture
	}
	return n.captureLocked(ctx, f)
}

func (n *Node) captureLocked(ctx context.Context, f *function) error {
	if f.active < 0 {
		return fmt.Errorf("%w: %s is not active on any gpu", ErrInvalid, f.name)
	}
	written, err := n.writeImageLocked(ctx, f, "capture")
	if err != nil {
		return err
	}
	if written {
		n.images.Captures++
	}
	f.captured, f.saved = true, nil
	return n.protectActiveLocked(f) // a shared model is read-only from its capture on (share.go)
}

// modelSegments lists f's live model segments as an image lists them.
func modelSegments(f *function) []repository.Segment {
	var segs []repository.Segment
	for _, s := range f.space.Segments() {
		if s.Kind == memory.KindModel && !f.dead[s.ID] {
			segs = append(segs, repository.Segment{ID: s.ID, Ptr: s.Ptr, Size: s.Size})
		}
	}
	return segs
}

// writeImageLocked copies f's live model segments from its active GPU into a new image in the repository, which
// replaces the function's image; it reports false when f has no model segment (nothing written). It waits for the
// device and writes the image with mu released (f is moving meanwhile).
func (n *Node) writeImageLocked(ctx context.Context, f *function, what string) (bool, error) {
	defer n.moving(f)()
	gpu := f.active
	segs := modelSegments(f)
	if len(segs) == 0 {
		return false, nil
	}
	s, err := n.streamLocked(f, gpu)
	if err != nil {
		return false, err
	}
	if err := n.waitReadyLocked(ctx, f, f.res[gpu]); err != nil {
		return false, err
	}
	tenant := f.tenant
	err = n.unlocked(func() error {
		im, err := n.repo.CreateIn(ctx, f.name, "tenant "+tenant, segs) // chunks shared within the tenant
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, f.name, err)
		}
		defer im.Release()
		for i, seg := range im.Segments() {
			if err := s.CopyDtoH(im.Bytes(i), seg.Ptr); err != nil {
				return fmt.Errorf("%s %s: %w", what, f.name, err)
			}
		}
		if err := s.Synchronize(ctx); err != nil {
			// The image's host pages are the copies' destination: they stay mapped until the stream has passed
			// the copies, even when ctx ended first (releasing them under a queued copy faults the whole process).
			if ctx.Err() != nil {
				_ = s.Synchronize(context.WithoutCancel(ctx))
			}
			return fmt.Errorf("%s %s: %w", what, f.name, err)
		}
		if err := im.Commit(); err != nil {
			return fmt.Errorf("%s %s: %w", what, f.name, err)
		}
		return nil
	})
	return err == nil, err
}

func (n *Node) streamLocked(f *function, gpu int) (device.Stream, error) {
	if s, ok := f.streams[gpu]; ok {
		return s, nil
	}
	c, err := n.contextLocked(f.tenant, gpu)
	if err != nil {
		return nil, err
	}
	s, err := c.NewStream()
	if err != nil {
		return nil, fmt.Errorf("function %s gpu %d: %w", f.name, gpu, err)
	}
	f.streams[gpu] = s
	return s, nil
}

// Stream returns the function's compute stream on its active GPU, wrapped so that each operation first waits
// for the segments it touches (per-block readiness of a running swap). Use it while holding a Binding.
func (n *Node) Stream(name string) (device.Stream, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.settledFnLocked(name)
	if err != nil {
		return nil, err
	}
	if err := f.usableLocked(); err != nil {
		return nil, err
	}
	if f.active < 0 {
		return nil, fmt.Errorf("%w: %s is not active on any gpu", ErrInvalid, name)
	}
	s, err := n.streamLocked(f, f.active)
	if err != nil {
		return nil, err
	}
	return n.computeGated(name, &Stream{n: n, f: f, gpu: f.active, s: s, epoch: f.epoch})
}

// Stream is a function's compute stream with per-segment readiness; it implements device.Stream.
type Stream struct {
	n     *Node
	f     *function
	gpu   int
	s     device.Stream
	epoch uint64 // the function's fault epoch when the stream was handed out (fault.go)
}

var _ device.Stream = (*Stream)(nil)

// gate makes the stream wait for the segments that ptrs point into and runs op, under mu, once the function is not
// moving (locking.go): another function's operation does not hold it up.
func (s *Stream) gate(op func() error, ptrs ...device.Ptr) error {
	n := s.n
	n.mu.Lock()
	for {
		n.settleLocked(s.f)
		c, ok := n.domains[domainKey{s.f.tenant, s.gpu}]
		if !ok || c.Err() == nil || s.f.active != s.gpu || !n.execs[s.gpu].healthy || s.f.usableLocked() != nil {
			break
		}
		// Another stream of the tenant faulted: tear its context down first (an operation).
		n.mu.Unlock()
		err, done := n.fault(s.f, s.gpu, c)
		if done {
			return err
		}
		n.mu.Lock()
	}
	defer n.mu.Unlock()
	if e := n.execs[s.gpu]; !e.healthy {
		return fmt.Errorf("%w: gpu %d: %w", ErrUnhealthy, s.gpu, e.lastErr)
	}
	if err := s.f.usableLocked(); err != nil {
		return err
	}
	if s.f.active != s.gpu {
		return fmt.Errorf("%w: %s is no longer active on gpu %d", ErrInvalid, s.f.name, s.gpu)
	}
	if cur, ok := s.f.streams[s.gpu]; (!ok || cur != s.s) && s.epoch == s.f.epoch {
		// Its stream went with its tenant's context, torn down by a neighbour's fault while none of its own work
		// ran there (detachLocked changes the epoch of those it had): go on with its current stream. Before, the
		// destroyed stream answered every later call of the function's idle sessions with an error.
		cur, err := s.n.streamLocked(s.f, s.gpu)
		if err != nil {
			return err
		}
		s.s = cur
	}
	r := s.f.res[s.gpu]
	for _, seg := range s.n.gatedSegmentsLocked(s.f, r != nil && len(r.ready) > 0, ptrs) {
		ev, pending := r.ready[seg.ID]
		if !pending {
			continue
		}
		if done, err := ev.Query(); done && err == nil {
			_ = ev.Destroy()
			delete(r.ready, seg.ID)
			continue
		}
		if err := s.s.Wait(ev); err != nil {
			return err
		}
	}
	s.f.scratch.touched = true // its work may write its scratch: the host copy is no longer current (scratch.go)
	return op()
}

func (s *Stream) GPU() int { return s.gpu }

func (s *Stream) CopyHtoD(dst device.Ptr, src []byte) error {
	return s.gate(func() error {
		if err := s.n.refuseReadOnlyLocked(s.f, "host-to-device copy", dst); err != nil {
			return err
		}
		if s.n.skipCopyLocked(s.f, dst, src) { // the restored image already holds these bytes
			return nil
		}
		return s.s.CopyHtoD(dst, src)
	}, dst)
}

func (s *Stream) CopyDtoH(dst []byte, src device.Ptr) error {
	return s.gate(func() error { return s.s.CopyDtoH(dst, src) }, src)
}

func (s *Stream) CopyDtoD(dst, src device.Ptr, size uint64) error {
	return s.gate(func() error {
		if err := s.n.refuseReadOnlyLocked(s.f, "device-to-device copy", dst); err != nil {
			return err
		}
		s.n.writesLocked(s.f, "device-to-device copy", dst)
		return s.s.CopyDtoD(dst, src, size)
	}, dst, src)
}

func (s *Stream) Memset8(dst device.Ptr, v uint8, n uint64) error {
	return s.gate(func() error {
		if err := s.n.refuseReadOnlyLocked(s.f, "memset", dst); err != nil {
			return err
		}
		s.n.writesLocked(s.f, "memset", dst)
		return s.s.Memset8(dst, v, n)
	}, dst)
}

func (s *Stream) Memset32(dst device.Ptr, v uint32, n uint64) error {
	return s.gate(func() error {
		if err := s.n.refuseReadOnlyLocked(s.f, "memset", dst); err != nil {
			return err
		}
		s.n.writesLocked(s.f, "memset", dst)
		return s.s.Memset32(dst, v, n)
	}, dst)
}

// Launch waits for the segments that the kernel's 8-byte parameters point into, then launches it. Pointers held
// only inside device memory are not seen: a kernel that follows them must be preceded by WaitAll.
func (s *Stream) Launch(f device.Function, grid, block device.Dim3, sharedMem uint32, args []byte) error {
	ptrs := kernelPointers(f, args)
	return s.gate(func() error {
		s.n.writesLocked(s.f, "kernel", ptrs...)
		return s.s.Launch(f, grid, block, sharedMem, args)
	}, ptrs...)
}

// WaitAll makes the stream wait for every segment of the function.
func (s *Stream) WaitAll() error {
	s.n.mu.Lock()
	var ptrs []device.Ptr
	for _, seg := range s.f.space.Segments() {
		ptrs = append(ptrs, seg.Ptr)
	}
	s.n.mu.Unlock()
	return s.gate(func() error { return nil }, ptrs...)
}

func (s *Stream) Record(e device.Event) error { return s.s.Record(e) }
func (s *Stream) Wait(e device.Event) error   { return s.s.Wait(e) }

// Synchronize waits for the stream's work. A fault of the work (device.IsContextFault) tears the tenant's context
// on the GPU down and wraps ErrContextFault (fault.go); another device error (not a cancelled ctx, not a bad
// argument) takes the GPU out of service (MarkUnhealthy) and wraps ErrUnhealthy.
func (s *Stream) Synchronize(ctx context.Context) error {
	s.n.mu.Lock()
	cur, ok := s.f.streams[s.gpu]
	epoch, fault := s.f.epoch, s.f.fault
	s.n.mu.Unlock()
	if !ok || cur != s.s {
		if epoch != s.epoch { // its context was torn down: what it had queued is lost (recorded by detachLocked)
			return fmt.Errorf("%w: gpu %d, %s: its work was lost: %w", ErrContextFault, s.gpu, s.f.name, fault)
		}
		// The function left the GPU (deactivateLocked waited for its work there, and a fault found then changed
		// the epoch) and its stream there went with its context or its tenant: nothing of it was lost.
		return nil
	}
	err := s.s.Synchronize(ctx)
	if err == nil || ctx.Err() != nil || errors.Is(err, device.ErrInvalidValue) {
		return err
	}
	defer s.n.operate()()
	if e := s.n.execs[s.gpu]; !e.healthy {
		return fmt.Errorf("%w: gpu %d: %w", ErrUnhealthy, s.gpu, err)
	}
	if cur, ok := s.f.streams[s.gpu]; !ok || cur != s.s { // its context was torn down (or replaced) meanwhile
		return fmt.Errorf("%w: gpu %d, %s: %w", ErrContextFault, s.gpu, s.f.name, err)
	}
	return s.n.faultLocked(s.f, s.gpu, err)
}

// Destroy is a no-op: the stream belongs to the function and lives until it is deregistered.
func (s *Stream) Destroy() error { return nil }

// LaunchGraph waits for every segment of the function (a graph's kernels may touch any of them) and launches an
// instantiated graph of the stream's GPU and context as one operation (device.GraphCapture).
func (s *Stream) LaunchGraph(g device.GraphExec) error {
	gc, ok := s.s.(device.GraphCapture)
	if !ok {
		return fmt.Errorf("%w: the device's streams launch no graphs", device.ErrNotSupported)
	}
	s.n.mu.Lock()
	var ptrs []device.Ptr
	for _, seg := range s.f.space.Segments() {
		ptrs = append(ptrs, seg.Ptr)
	}
	s.n.mu.Unlock()
	return s.gate(func() error {
		s.n.writesLocked(s.f, "graph", ptrs...)
		return gc.LaunchGraph(g)
	}, ptrs...)
}
