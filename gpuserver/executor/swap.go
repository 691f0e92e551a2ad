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

// function is a registered function's node-wide state; guarded by Node.mu.
type function struct {
	name     string
	space    *memory.AddressSpace
	captured bool
	active   int                   // GPU mapped at the fixed addresses, -1 none
	res      map[int]*residency    // by GPU
	users    int                   // bindings on the active GPU
	streams  map[int]device.Stream // the function's compute stream per GPU
	own      map[int]bool          // segments holding one block each (their chunks go back when it is freed)
	dead     map[int]bool          // own segments whose block was freed: never mapped, copied or captured again
	plan     *restorePlan          // its image from before a restart, while its initialisation matches it
	saved    map[int]bool          // segments of the image written back while it initialised (saveLocked)
	broken   error                 // why its bindings broke when it was reset under them (Reset)
	tenant   string                // its isolation domain on a GPU (fault.go)
	lost     error                 // a fault destroyed its memory before it had an image (fault.go)
	epoch    uint64                // counts the kernel faults that restored its memory (fault.go)
	fault    error                 // the last such fault
	fenced   int                   // bindings expired and not yet released: its work is refused (Expire)
	moving   int                   // operations changing its memory now: its Stream's work waits (locking.go)

	initialising int  // processes of it in their own initialisation (BeginInit): its capture waits for them
	deferred     bool // an EndInit found one: the capture also waits for a moment without requests (lifecycle.go)

	scratchPerRequest bool // its scratch is dropped when its last binding ends (scratch.go)
	modelShared       bool // it never writes its model after initialisation: its chunks may be shared (share.go)

	scratch scratchState // the host copies of the scratch it keeps, and whether its work ran since (scratch.go)

	// admitting counts the requests being bound (Acquire, EndInit): a fence refuses the work of a function without
	// a live binding, never a new request of it (usableLocked)
	admitting int
}

// residency is a function's physical copy on one GPU.
type residency struct {
	gpu      int
	chunks   map[int][]memory.Chunk // segment ID -> chunks
	ready    map[int]device.Event   // segment ID -> event of its last copy; absent when ready
	mapped   map[int]bool           // segment ID -> mapped at its fixed address (only on the active GPU)
	pinned   int                    // swaps reading from this copy
	lastUsed time.Time
}

// Source says where a swap-in copies a model from: Host, or the index of a GPU holding a copy.
type Source = int

// SwapIn makes function run on GPU gpu, copying its model from source (Host or a GPU with a copy) unless gpu
// already holds one. It returns once the copies are enqueued; work submitted through the function's Stream waits
// per segment. It fails with ErrBusy while the function has bindings on another GPU. It is the controller's
// actuator for a swap decision.
func (n *Node) SwapIn(ctx context.Context, name string, gpu int, source Source) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	defer n.moving(f)()
	return n.swapInLocked(ctx, f, gpu, source)
}

func (n *Node) swapInLocked(ctx context.Context, f *function, gpu int, source Source) error {
	if err := n.validGPU(gpu); err != nil {
		return err
	}
	if !n.execs[gpu].healthy {
		return fmt.Errorf("%w: gpu %d", ErrUnhealthy, gpu)
	}
	if f.active == gpu {
		if r := f.res[gpu]; r != nil {
			r.lastUsed = n.cfg.Now()
		}
		return n.completeLocked(ctx, f, gpu, source) // segments allocated since, if any
	}
	if err := f.usableLocked(); err != nil {
		return err
	}
	if f.active >= 0 {
		if f.users > 0 {
			return fmt.Errorf("%w: %s has %d bindings on gpu %d", ErrBusy, f.name, f.users, f.active)
		}
		old := f.active
		if err := n.deactivateLocked(ctx, f); err != nil && n.execs[old].healthy && !errors.Is(err, ErrContextFault) {
			return err
		} // a GPU that failed (or a context that faulted) on the way out lost its copy: the host image is authoritative
		if err := f.usableLocked(); err != nil { // unless the function had none yet
			return err
		}
	}
	if err := n.claimLocked(ctx, f, gpu); err != nil { // one tenant's memory accessible on a GPU at a time
		return err
	}
	if err := n.dropStaleScratchLocked(ctx, f, gpu); err != nil { // what it writes on gpu makes them stale
		return err
	}
	if _, ok := f.res[gpu]; !ok {
		f.res[gpu] = &residency{gpu: gpu, chunks: map[int][]memory.Chunk{}, ready: map[int]device.Event{},
			mapped: map[int]bool{}}
	}
	f.active = gpu
	f.res[gpu].lastUsed = n.cfg.Now()
	if err := n.completeLocked(ctx, f, gpu, source); err != nil {
		_ = n.evictLocked(ctx, f, gpu)
		return err
	}
	return nil
}

// deactivateLocked unmaps the function's fixed addresses from its active GPU, after its work there completed;
// the copy stays parked. A function still initialising keeps no parked copy: its bytes are written back to the
// host first (saveLocked) and its chunks go back to the pool, so that its one authoritative copy is the saved
// image until it is active again. It waits for the device with mu released (f is moving meanwhile).
func (n *Node) deactivateLocked(ctx context.Context, f *function) error {
	defer n.moving(f)()
	gpu := f.active
	if s, ok := f.streams[gpu]; ok {
		if err := n.unlocked(func() error { return s.Synchronize(ctx) }); err != nil {
			if ctx.Err() == nil {
				err = n.faultLocked(f, gpu, err)
			}
			return fmt.Errorf("function %s gpu %d: %w", f.name, gpu, err)
		}
	}
	r := f.res[gpu]
	if err := n.waitReadyLocked(ctx, f, r); err != nil {
		if ctx.Err() == nil {
			err = n.failLocked(gpu, err)
		}
		return err
	}
	if !f.captured {
		if err := n.saveLocked(ctx, f); err != nil {
			return err
		}
	}
	if err := n.writeBackScratchLocked(ctx, f); err != nil {
		return err
	}
	if err := n.unmapLocked(f, r); err != nil {
		return err
	}
	f.active = -1
	if !f.captured {
		return n.dropCopyLocked(f, gpu)
	}
	return nil
}

// unmapLocked unmaps f's segments that are mapped in r (the driver's calls, with mu released; f is moving) and
// forgets them.
func (n *Node) unmapLocked(f *function, r *residency) error {
	var segs []memory.Segment
	for _, seg := range f.space.Segments() {
		if r.mapped[seg.ID] {
			segs = append(segs, seg)
		}
	}
	if len(segs) == 0 {
		return nil
	}
	defer n.moving(f)()
	unmapped := make([]bool, len(segs))
	err := n.unlocked(func() error {
		var errs []error
		for i, seg := range segs {
			if err := n.mem.Unmap(seg.Ptr, seg.Size); err != nil {
				errs = append(errs, fmt.Errorf("function %s gpu %d segment %d: %w", f.name, r.gpu, seg.ID, err))
				continue
			}
			unmapped[i] = true
		}
		return errors.Join(errs...)
	})
	for i, seg := range segs {
		if unmapped[i] {
			delete(r.mapped, seg.ID)
		}
	}
	return err
}

// dropCopyLocked gives the chunks of f's copy on gpu back to the pool (its work there has completed).
func (n *Node) dropCopyLocked(f *function, gpu int) error {
	r := f.res[gpu]
	for id, chunks := range r.chunks {
		if err := n.putChunksLocked(gpu, chunks); err != nil {
			return fmt.Errorf("function %s segment %d: %w", f.name, id, err)
		}
	}
	delete(f.res, gpu)
	return nil
}

// waitReadyLocked waits, with mu released (f is moving meanwhile), until the copies into r (f's residency on a
// GPU) have completed, and forgets their events.
func (n *Node) waitReadyLocked(ctx context.Context, f *function, r *residency) error {
	if len(r.ready) == 0 {
		return nil
	}
	defer n.moving(f)()
	type pending struct {
		id int
		ev device.Event
	}
	evs := make([]pending, 0, len(r.ready))
	for id, ev := range r.ready {
		evs = append(evs, pending{id, ev})
	}
	for _, p := range evs {
		if err := n.unlocked(func() error { return p.ev.Synchronize(ctx) }); err != nil {
			return fmt.Errorf("gpu %d segment %d: %w", r.gpu, p.id, err)
		}
		if r.ready[p.id] == p.ev {
			_ = p.ev.Destroy()
			delete(r.ready, p.id)
		}
	}
	return nil
}

// swapJob is what a finisher releases once a swap's copies completed.
type swapJob struct {
	gpu     int
	done    device.Event
	image   *repository.Image
	source  *residency
	sibling *siblingSource // a sibling instance's copy source was read from (siblings.go): its image is released
	staging []staging
}

type staging struct {
	ptr  device.Ptr
	size uint64
}

// completeLocked maps every segment of f on its active GPU gpu: parked chunks again, new chunks for segments
// without, and enqueues the copies of model segments from source. The decisions are swapplan.go's; this carries
// them out: the source (swapSourceLocked), then each segment in scratchFirst's order (swapSegmentLocked), then the
// swap's completion event and its finisher (enqueuedLocked).
func (n *Node) completeLocked(ctx context.Context, f *function, gpu int, source Source) error {
	sw, err := n.swapSourceLocked(ctx, f, gpu, source)
	if err != nil {
		return err
	}
	defer func() {
		if sw.sib != nil && sw.job.sibling != sw.sib { // the job did not take it (nothing read from it, or a failure)
			sw.sib.release()
		}
	}()
	for _, seg := range scratchFirst(f.space.Segments()) {
		if err := n.swapSegmentLocked(ctx, sw, seg); err != nil {
			return err
		}
	}
	if !sw.enqueued {
		if sw.job.image != nil {
			_ = sw.job.image.Release()
		}
		return nil
	}
	return n.enqueuedLocked(ctx, sw)
}

// swapRun is one swap-in being carried out (completeLocked).
type swapRun struct {
	f        *function
	gpu      int
	r        *residency
	e        *Executor
	src      *residency     // the function's own copy read from; nil: none usable
	sib      *siblingSource // a sibling instance's copy that may hold its weights; nil: none
	stream   device.Stream  // the copy-in stream, or the peer stream when a GPU's copy is read
	job      *swapJob
	enqueued bool // a copy was enqueued
}

// swapSourceLocked resolves a swap's source (Any: the node picks a GPU with a copy, else the host) into the copy it
// reads: the function's own on another GPU where that one is usable, else, for a captured function
// asked to read from a GPU, a sibling instance's copy there.
func (n *Node) swapSourceLocked(ctx context.Context, f *function, gpu int, source Source) (*swapRun, error) {
	sw := &swapRun{f: f, gpu: gpu, r: f.res[gpu], e: n.execs[gpu], job: &swapJob{gpu: gpu}}
	if source == Any {
		source = n.sourceLocked(ctx, f, gpu)
	}
	if source != Host {
		if err := n.validGPU(source); err != nil {
			return nil, err
		}
		// A copy that is not the target itself, readable from it (peer access) and healthy; otherwise the host
		// image is authoritative.
		if src := f.res[source]; src != nil && source != gpu && n.dev.CanAccessPeer(gpu, source) &&
			n.execs[source].healthy {
			sw.src = src
		}
	}
	if sw.src == nil && source != Host && f.captured { // no copy of its own there: a sibling's may hold its weights
		sw.sib = n.siblingLocked(ctx, f, source, gpu)
	}
	sw.stream = sw.e.copyIn
	if sw.src != nil || sw.sib != nil {
		sw.stream = sw.e.copyPeer
	}
	return sw, nil
}

// imageLocked is the function's image, held by the swap's job from its first use on.
func (n *Node) imageLocked(ctx context.Context, sw *swapRun) (*repository.Image, error) {
	if sw.job.image == nil {
		im, err := n.repo.Get(ctx, sw.f.name)
		if err != nil {
			return nil, fmt.Errorf("function %s: %w: %w", sw.f.name, ErrNotCaptured, err)
		}
		sw.job.image = im
	}
	return sw.job.image, nil
}

// swapSegmentLocked brings one segment onto the swap's GPU: its chunks (parked ones, chunks of its image already on
// the GPU, or new ones) are mapped at its address, then its work (planSegment) is enqueued.
func (n *Node) swapSegmentLocked(ctx context.Context, sw *swapRun, seg memory.Segment) error {
	f, r, gpu := sw.f, sw.r, sw.gpu
	if r.mapped[seg.ID] || f.dead[seg.ID] {
		return nil
	}
	fill := seg.Kind == memory.KindModel && (f.captured || n.restoringLocked(f, seg.ID) || f.saved[seg.ID])
	chunks, parked, plan, err := n.mapSegmentLocked(ctx, sw, seg, fill)
	if err != nil {
		return err
	}
	host := n.scratchHostLocked(f, seg)
	switch planSegment(segmentFacts{Parked: parked, ScratchHost: host != nil, Fill: fill}) {
	case workNone:
		return nil
	case workRestoreScratch:
		if err := n.restoreScratchLocked(sw.e, r, seg, host); err != nil {
			return n.failLocked(gpu, err)
		}
		return nil
	case workZero: // ordered before the function's work on the segment like a copy
		if err := n.zeroLocked(sw.e, r, seg); err != nil {
			return n.failLocked(gpu, err)
		}
		return nil
	}
	reused := make([]bool, len(plan.reused))
	for j, c := range plan.reused {
		reused[j] = c != nil
	}
	spans, shared := copySpans(reused, n.mem.ChunkSize(), seg.Size, sw.e.groupBytes)
	n.sharedBytes += shared
	if len(spans) == 0 {
		return nil // every chunk was on the gpu already
	}
	return n.copySegmentLocked(ctx, sw, seg, chunks, spans)
}

// mapSegmentLocked maps a segment's chunks at its address on the swap's GPU: its parked chunks (parked), or new
// ones, with a segment to fill reusing the chunks of its image already on the GPU (plan).
func (n *Node) mapSegmentLocked(ctx context.Context, sw *swapRun, seg memory.Segment, fill bool) (
	chunks []memory.Chunk, parked bool, plan chunkPlan, err error) {
	f, r, gpu := sw.f, sw.r, sw.gpu
	chunks, parked = r.chunks[seg.ID]
	plan = chunkPlan{reused: make([]*sharedChunk, seg.Chunks(n.mem.ChunkSize()))}
	if !parked {
		if fill && f.captured && f.modelShared { // some of its image's chunks may be on the gpu already
			im, err := n.imageLocked(ctx, sw)
			if err != nil {
				return nil, false, plan, err
			}
			if idx := imageSegment(im, seg.ID); idx >= 0 {
				plan = n.planChunksLocked(gpu, im, idx, len(plan.reused))
			}
		}
		if chunks, err = n.takePlannedLocked(ctx, f, r, seg.ID, plan); err != nil {
			return nil, false, plan, err
		}
		r.chunks[seg.ID] = chunks
	}
	if err := n.unlocked(func() error { return n.mem.MapSegment(seg, chunks, []int{gpu}) }); err != nil {
		return nil, false, plan, n.failLocked(gpu, fmt.Errorf("function %s segment %d: %w", f.name, seg.ID, err))
	}
	r.mapped[seg.ID] = true
	if err := n.protectLocked(f, gpu, seg); err != nil {
		return nil, false, plan, n.failLocked(gpu, err)
	}
	return chunks, parked, plan, nil
}

// copySegmentLocked enqueues a model segment's copies (spans) from the swap's source (copyFrom) and the event that
// work on the segment waits for.
func (n *Node) copySegmentLocked(ctx context.Context, sw *swapRun, seg memory.Segment, chunks []memory.Chunk,
	spans []span) error {
	f, gpu, e, job := sw.f, sw.gpu, sw.e, sw.job
	// A read-only segment's chunks are filled through a staging address of their own, writable from gpu for the
	// swap's copies only (share.go).
	dst := seg.Ptr
	if f.readOnly(seg) {
		st, err := n.stageChunksLocked(seg, chunks, gpu)
		if err != nil {
			return err
		}
		job.staging = append(job.staging, st)
		dst = st.ptr
	}
	var theirs memory.Segment
	siblingMatches := false
	if sw.sib != nil {
		im, err := n.imageLocked(ctx, sw)
		if err != nil {
			return err
		}
		theirs, siblingMatches = sw.sib.segment(im, seg)
	}
	var enqueue func(s span) error
	from := copyFrom(sw.src != nil && sw.src.chunks[seg.ID] != nil, siblingMatches)
	switch from {
	case fromPeer:
		st, err := n.stageLocked(seg, sw.src, gpu)
		if err != nil {
			return err
		}
		job.staging = append(job.staging, st)
		enqueue = func(s span) error {
			return sw.stream.CopyDtoD(dst+device.Ptr(s.off), st.ptr+device.Ptr(s.off), s.size)
		}
	case fromSibling:
		st, err := n.stageLocked(theirs, sw.sib.res, gpu)
		if err != nil {
			return err
		}
		job.staging = append(job.staging, st)
		sw.sib.used = true
		enqueue = func(s span) error {
			return sw.stream.CopyDtoD(dst+device.Ptr(s.off), st.ptr+device.Ptr(s.off), s.size)
		}
	default:
		im, err := n.imageLocked(ctx, sw)
		if err != nil {
			return err
		}
		idx := imageSegment(im, seg.ID)
		if idx < 0 {
			return fmt.Errorf("%w: function %s: segment %d is not in its image", ErrNotCaptured, f.name, seg.ID)
		}
		host := im.Bytes(idx)
		enqueue = func(s span) error { return sw.stream.CopyHtoD(dst+device.Ptr(s.off), host[s.off:s.off+s.size]) }
	}
	copied := uint64(0)
	for _, s := range spans {
		if err := enqueue(s); err != nil {
			return n.failLocked(gpu, err)
		}
		copied += s.size
	}
	if from == fromSibling {
		e.siblingBytes += seg.Size
	}
	ev, err := n.dev.NewEvent(gpu)
	if err == nil {
		err = sw.stream.Record(ev)
	}
	if err != nil {
		return n.failLocked(gpu, err)
	}
	sw.r.ready[seg.ID] = ev
	e.swapBytes += copied
	sw.enqueued = true
	return nil
}

// enqueuedLocked ends a swap whose copies were enqueued: its sources are pinned until they completed, a completion
// event is recorded after them, and its finisher releases the job (at once for a function still initialising,
// which waits here so that its image is not held when its initialisation ends).
func (n *Node) enqueuedLocked(ctx context.Context, sw *swapRun) error {
	job, src, sib := sw.job, sw.src, sw.sib
	sw.e.swaps++
	if src != nil {
		src.pinned++
		job.source = src
	}
	if sib != nil && sib.used { // its copy is read until the swap's copies completed: pinned, its image held
		sib.res.pinned++
		job.source, job.sibling = sib.res, sib
	}
	done, err := n.dev.NewEvent(sw.gpu)
	if err == nil {
		err = sw.stream.Record(done)
	}
	if err != nil {
		return n.failLocked(sw.gpu, err)
	}
	job.done = done
	if !sw.f.captured {
		// Restoring from the image during initialisation: wait here (mu released, f moving), so that the image is
		// not held when the initialisation ends (a new capture replaces it).
		err := n.unlocked(func() error {
			err := done.Synchronize(ctx)
			if err != nil && ctx.Err() != nil {
				// The copies read the image's host pages: they stay mapped until the copies have passed.
				err = errors.Join(err, done.Synchronize(context.WithoutCancel(ctx)))
			}
			return err
		})
		n.finishLocked(job, err)
		return nil
	}
	n.bg.Add(1)
	go n.finish(job)
	return nil
}

// scratchFirst orders a swap-in's segments with scratch before the model, each in address order: the copies go
// out in this order on one host-to-device stream, and a kept scratch segment (the activations, restored from its
// host copy) is what the first kernel reads, while the model's layers are read one after another. Restored behind
// the model, it made every kernel wait for the whole model (pipelined/serial 1.0, TestPipelinedSwapAndExecuteBeatsSerial).
func scratchFirst(segs []memory.Segment) []memory.Segment {
	out := make([]memory.Segment, 0, len(segs))
	for _, seg := range segs {
		if seg.Kind == memory.KindScratch {
			out = append(out, seg)
		}
	}
	for _, seg := range segs {
		if seg.Kind != memory.KindScratch {
			out = append(out, seg)
		}
	}
	return out
}

func imageSegment(im *repository.Image, id int) int {
	for i, s := range im.Segments() {
		if s.ID == id {
			return i
		}
	}
	return -1
}

// copyGroups enqueues a segment's copy in groups of at most group bytes.
func (n *Node) copyGroups(s device.Stream, seg memory.Segment, group uint64, copyFn func(off, size uint64) error) error {
	for off := uint64(0); off < seg.Size; off += group {
		if err := copyFn(off, min(group, seg.Size-off)); err != nil {
			return err
		}
	}
	return nil
}

// stageLocked maps the source copy of seg at a staging address readable from gpu (the driver's calls, with mu
// released: the source copy is the moving function's, and no other operation runs).
func (n *Node) stageLocked(seg memory.Segment, src *residency, gpu int) (staging, error) {
	return n.stageChunksLocked(seg, src.chunks[seg.ID], gpu)
}

// stageChunksLocked maps chunks of seg at a staging address accessible from gpu only (the driver's calls, with mu
// released): the source of a peer copy, or the destination of the copies that fill a read-only segment.
func (n *Node) stageChunksLocked(seg memory.Segment, chunks []memory.Chunk, gpu int) (staging, error) {
	var st staging
	err := n.unlocked(func() error {
		ptr, err := n.dev.ReserveAddress(seg.Size, 0)
		if err != nil {
			return fmt.Errorf("staging for segment %d: %w", seg.ID, err)
		}
		// Accessible from the target GPU only: the copy runs there, and no work of the source GPU (another
		// tenant's, perhaps) may reach the bytes through this address.
		if err := n.mem.MapAt(ptr, chunks, []int{gpu}); err != nil {
			_ = n.dev.FreeAddress(ptr, seg.Size)
			return fmt.Errorf("staging for segment %d: %w", seg.ID, err)
		}
		st = staging{ptr: ptr, size: seg.Size}
		return nil
	})
	return st, err
}

// finish waits for a swap's copies and releases what they read from. It is owned by the Node (Close waits).
func (n *Node) finish(job *swapJob) {
	defer n.bg.Done()
	err := job.done.Synchronize(n.ctx)
	defer n.operate()()
	n.finishLocked(job, err)
}

// finishLocked releases what a swap's copies read from once they completed (or failed: err): the staging
// mappings and the image (with mu released: nothing else refers to them), then the source copy's pin.
func (n *Node) finishLocked(job *swapJob, err error) {
	err = errors.Join(err, n.unlocked(func() error {
		var errs []error
		for _, st := range job.staging {
			errs = append(errs, n.mem.Unmap(st.ptr, st.size), n.dev.FreeAddress(st.ptr, st.size))
		}
		if job.image != nil {
			_ = job.image.Release()
		}
		job.sibling.release()
		_ = job.done.Destroy()
		return errors.Join(errs...)
	}))
	if job.source != nil {
		job.source.pinned--
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		n.markUnhealthyLocked(job.gpu, err)
	}
}

// zeroLocked zeroes a freshly mapped segment on the executor's zero stream and makes the function's work on it
// wait for that (a readiness event, as for a swap's copy). The zero stream is not the copy streams: a kernel that
// touches scratch (every kernel of a model does) waits for its zeroing, never for the model's copies queued
// before it.
func (n *Node) zeroLocked(e *Executor, r *residency, seg memory.Segment) error {
	if err := e.zero.Memset8(seg.Ptr, 0, seg.Size); err != nil {
		return fmt.Errorf("zero segment %d: %w", seg.ID, err)
	}
	ev, err := n.dev.NewEvent(e.gpu)
	if err == nil {
		err = e.zero.Record(ev)
	}
	if err != nil {
		return fmt.Errorf("zero segment %d: %w", seg.ID, err)
	}
	if old, ok := r.ready[seg.ID]; ok {
		_ = old.Destroy()
	}
	r.ready[seg.ID] = ev
	return nil
}

// failLocked marks gpu unhealthy after a device error and returns the error. A context fault is no device error:
// it is a tenant's kernel that poisoned the process's contexts (processFaultLocked), and the GPU stays in service.
func (n *Node) failLocked(gpu int, err error) error {
	if errors.Is(err, device.ErrInvalidValue) || errors.Is(err, memory.ErrInvalid) {
		return err // our mistake, not the GPU's
	}
	if device.IsContextFault(err) {
		n.processFaultLocked(gpu, err)
		return fmt.Errorf("%w: gpu %d: %w", ErrContextFault, gpu, err)
	}
	n.markUnhealthyLocked(gpu, err)
	return fmt.Errorf("%w: gpu %d: %w", ErrUnhealthy, gpu, err)
}

// takeChunksLocked takes count chunks on gpu, evicting other functions' idle copies if allowed.
func (n *Node) takeChunksLocked(ctx context.Context, self *function, gpu, count int) ([]memory.Chunk, error) {
	pool := n.mem.Pool(gpu)
	for {
		var chunks []memory.Chunk
		err := n.unlocked(func() (err error) { // a lending pool borrows from another process
			chunks, err = pool.Get(count)
			return err
		})
		if err == nil {
			return chunks, nil
		}
		if !errors.Is(err, memory.ErrNoSpace) {
			return nil, err
		}
		if !n.cfg.EvictUnderPressure {
			return nil, fmt.Errorf("%w: %w", ErrNoMemory, err)
		}
		victim := n.victimLocked(self, gpu)
		if victim == nil {
			return nil, fmt.Errorf("%w: gpu %d: nothing evictable: %w", ErrNoMemory, gpu, err)
		}
		if err := n.evictLocked(ctx, victim, gpu); err != nil {
			return nil, err
		}
		n.evictedLocked(gpu, victim, EvictPressure)
	}
}

// evictedLocked tells Config.OnEvict of a copy the node dropped on its own.
func (n *Node) evictedLocked(gpu int, f *function, reason string) {
	if n.cfg.OnEvict != nil {
		n.cfg.OnEvict(gpu, f.name, reason)
	}
}

// victimLocked is the least recently used copy on gpu that is neither in use nor a swap source.
func (n *Node) victimLocked(self *function, gpu int) *function {
	var best *function
	var bestAt time.Time
	for _, f := range n.fns {
		r, ok := f.res[gpu]
		if !ok || f == self || r.pinned > 0 || (f.active == gpu && f.users > 0) {
			continue
		}
		if best == nil || r.lastUsed.Before(bestAt) {
			best, bestAt = f, r.lastUsed
		}
	}
	return best
}

// Evict drops function's copy on gpu (invalidation: nothing of its model is copied back; scratch it keeps is written
// back, scratch.go). It fails with ErrBusy while the
// function has bindings there and with ErrPinned while the copy is a swap source. It is the controller's actuator
// for an eviction.
func (n *Node) Evict(ctx context.Context, name string, gpu int) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	if err := n.validGPU(gpu); err != nil {
		return err
	}
	if f.res[gpu] == nil {
		return nil
	}
	return n.evictLocked(ctx, f, gpu)
}

func (n *Node) evictLocked(ctx context.Context, f *function, gpu int) error {
	r := f.res[gpu]
	if r == nil {
		return nil
	}
	if r.pinned > 0 {
		return fmt.Errorf("%w: %s on gpu %d", ErrPinned, f.name, gpu)
	}
	defer n.moving(f)()
	if f.active == gpu {
		if f.users > 0 {
			return fmt.Errorf("%w: %s has %d bindings on gpu %d", ErrBusy, f.name, f.users, gpu)
		}
		if err := n.deactivateLocked(ctx, f); err != nil {
			return err
		}
		if f.res[gpu] == nil {
			return nil // a function still initialising: its bytes were written back, its copy dropped
		}
	}
	if err := n.waitReadyLocked(ctx, f, r); err != nil {
		return err
	}
	for id, chunks := range r.chunks {
		if err := n.putChunksLocked(gpu, chunks); err != nil {
			return fmt.Errorf("function %s segment %d: %w", f.name, id, err)
		}
	}
	delete(f.res, gpu)
	return nil
}

// Resident lists the GPUs holding a copy of function (active or parked), and the active one (-1 if none).
func (n *Node) Resident(name string) (gpus []int, active int, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return nil, -1, err
	}
	for g := range n.execs {
		if _, ok := f.res[g]; ok {
			gpus = append(gpus, g)
		}
	}
	return gpus, f.active, nil
}
