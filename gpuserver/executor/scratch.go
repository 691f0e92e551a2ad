package executor

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// Scratch of the request (a KV cache, activations).
//
// Blocks a function allocates after its initialisation are scratch: never in its image. (Blocks a later process of
// the function allocates in its own initialisation, memory.KindInit, are not a request's: they are kept as below
// whatever the scratch mode, see keeps.) By default a function's
// scratch is its own: it stays with the function's copy while it is resident, and it is written back and restored
// when the copy leaves a GPU (see "Scratch the function keeps" below), so that a function may keep state in it
// between requests. A function whose scratch is its requests' own (SetScratchPerRequest: an LLM's KV cache,
// rewritten by every request) gives the physical memory of its scratch segments back to the pool when its last
// binding ends, and gets fresh zeroed chunks at the same fixed addresses at its next binding: no copy at swap-in or
// eviction, nothing held while idle, and the quota still counts the scratch while bound (the session counts every
// segment against it). Pointers into scratch stay valid across requests (a captured CUDA graph keeps working); its
// bytes do not: a function that declares per-request scratch and reads there what an earlier request wrote reads
// zeros.

// SetScratchPerRequest makes a registered function's scratch segments the request's (see above), or, with on
// false, the function's own, kept across evictions and moves (the default).
func (n *Node) SetScratchPerRequest(name string, on bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	f.scratchPerRequest = on
	return nil
}

// ScratchDropped is the bytes of scratch segments given back at the end of a function's requests.
func (n *Node) ScratchDropped() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.scratchDropped
}

// dropScratchLocked gives the chunks of f's mapped scratch segments on its active GPU back to the pool, once its
// work there has completed. The segments stay f's (their addresses are reserved); the next swap-in maps them again.
// It waits for the device and unmaps with mu released (f is moving meanwhile).
func (n *Node) dropScratchLocked(ctx context.Context, f *function) error {
	gpu := f.active
	if gpu < 0 || !f.captured {
		return nil
	}
	defer n.moving(f)()
	r := f.res[gpu]
	if s, ok := f.streams[gpu]; ok {
		if err := n.unlocked(func() error { return s.Synchronize(ctx) }); err != nil {
			if ctx.Err() == nil {
				err = n.faultLocked(f, gpu, err)
			}
			return fmt.Errorf("function %s gpu %d: %w", f.name, gpu, err)
		}
	}
	if err := n.waitReadyLocked(ctx, f, r); err != nil {
		return err
	}
	for _, seg := range f.space.Segments() {
		chunks, ok := r.chunks[seg.ID]
		if seg.Kind != memory.KindScratch || !ok {
			continue
		}
		if r.mapped[seg.ID] {
			if err := n.unlocked(func() error { return n.mem.Unmap(seg.Ptr, seg.Size) }); err != nil {
				return fmt.Errorf("function %s gpu %d: %w", f.name, gpu, err)
			}
			delete(r.mapped, seg.ID)
		}
		if err := n.putChunksLocked(gpu, chunks); err != nil {
			return fmt.Errorf("function %s segment %d: %w", f.name, seg.ID, err)
		}
		delete(r.chunks, seg.ID)
		n.scratchDropped += seg.Size
	}
	return nil
}

// Scratch the function keeps (the default).
//
// A function that keeps state in memory it allocates after its initialisation (a model loaded lazily by its first
// request, tensors PyTorch creates on the GPU the first time they are needed, a cache) must find that state again
// after its copy left a GPU. So when the copy of a function whose scratch is its own stops being active on a GPU
// (it is evicted, moved to another GPU, or its GPU goes to another tenant), the bytes of its scratch segments that
// hold a block are written back to page-locked host memory of the node (one buffer per segment, reused at every
// write-back), and its next swap-in copies them in again on the GPU's host-to-device stream, segment by segment
// with a readiness event each, as it copies its model: work waits only for the segments it touches. Only scratch
// moves this way: the host image of the model stays authoritative and model segments are never copied back.
//
// Where the bytes are, while the function is not active: in the host copy, and in a parked copy on the GPU it left
// (the same bytes, re-mapped without a copy when it comes back there). Becoming active on another GPU makes every
// other parked copy's scratch stale: those chunks go back to the pool at once. A scratch segment without a host
// copy holds nothing the function wrote before it was last written back (it was allocated since): it is mapped
// zeroed.
//
// Bounds and costs. The host copies of a function never exceed its GPU memory quota (SetScratchLimit): a function
// whose scratch would exceed it at a write-back is not written back, and its work is refused (ErrLost: its process
// must start again) rather than answered from zeros. Every eviction or move of a function with scratch copies the
// scratch across PCIe twice (out, then in at the next swap-in): Status counts the bytes per GPU
// (ScratchWrittenBack, ScratchRestored), docs/bench/scratch.md measures the time.
//
// Lost scratch. When the active copy is destroyed without a write-back (a fault of its tenant's work tore its
// context down, its GPU failed, a binding held too long was stopped) after the function's work ran on it, its
// scratch cannot be vouched for: unless every scratch block it had then was freed before its next binding (the
// temporaries of the request that was running), its work is refused with ErrLost from that binding on, until its
// processes start again (Reset); never answered from zeros or from an older write-back. A function whose scratch is
// its requests' (SetScratchPerRequest) is exempt from all of this: its scratch is mapped zeroed at every binding,
// by declaration.

// scratchState is what the node keeps of a function's scratch beside its copies; guarded by Node.mu.
type scratchState struct {
	host    map[int][]byte // segment ID -> host copy (page-locked), current while the function is active nowhere
	limit   uint64         // the most scratch bytes written back (the function's quota); 0: unbounded
	discard bool           // the function is forgotten (Reset, Deregister): nothing is written back
	touched bool           // work of it was submitted since its last write-back: its scratch may differ from host
	stale   bool           // the host copies are older than its scratch was when a copy was destroyed

	destroyed   map[device.Ptr]bool // scratch blocks allocated when its active copy was destroyed (loseScratchLocked)
	destroyedBy error               // how
}

// SetScratchLimit bounds the bytes of a registered function's scratch that are written back to the host (its GPU
// memory quota; 0 leaves it unbounded).
func (n *Node) SetScratchLimit(name string, bytes uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	f.scratch.limit = bytes
	return nil
}

// keepsScratch reports whether f's scratch is its own (written back and restored), not its requests'.
func (f *function) keepsScratch() bool {
	return f.captured && !f.scratchPerRequest && !f.scratch.discard
}

// keepsInit reports whether f keeps the blocks its later processes allocated in their initialisations
// (memory.KindInit: a replica started after the capture): always, whatever its scratch mode, unless it is
// forgotten.
func (f *function) keepsInit() bool { return f.captured && !f.scratch.discard }

// keeps reports whether f keeps seg's bytes across its copies (written back and restored): scratch it keeps,
// and the initialisations of its later processes.
func (f *function) keeps(seg memory.Segment) bool {
	switch seg.Kind {
	case memory.KindScratch:
		return f.keepsScratch()
	case memory.KindInit:
		return f.keepsInit()
	}
	return false
}

// heldScratch lists f's segments that hold a block and whose bytes it keeps (keeps), and their bytes.
func (f *function) heldScratch() (segs []memory.Segment, bytes uint64) {
	for _, seg := range f.space.Segments() {
		if f.keeps(seg) && !f.dead[seg.ID] && f.space.Holds(seg.ID) {
			segs = append(segs, seg)
			bytes += seg.Size
		}
	}
	return segs, bytes
}

// writeBackScratchLocked copies the scratch segments of f that hold a block from its active GPU into their host
// copies, once f's work and the copies into its residency there have completed (deactivateLocked). A function
// whose scratch exceeds its limit, or whose host copy cannot be made, loses its scratch (ErrLost) and the
// deactivation goes on.
func (n *Node) writeBackScratchLocked(ctx context.Context, f *function) error {
	if !f.keepsScratch() && !f.keepsInit() {
		return nil
	}
	gpu := f.active
	r := f.res[gpu]
	held, total := f.heldScratch()
	keep := map[int]bool{}
	var segs []memory.Segment
	for _, seg := range held {
		keep[seg.ID] = true
		if r.mapped[seg.ID] {
			segs = append(segs, seg)
		}
	}
	n.freeScratchHostLocked(f, keep) // segments that hold nothing any more
	if len(segs) == 0 || !f.scratch.touched {
		f.scratch.touched = false // no work since the last write-back: the host copies hold its scratch
		return nil
	}
	if f.scratch.limit > 0 && total > f.scratch.limit {
		n.refuseScratchLocked(f, fmt.Errorf("%w: its scratch of %d bytes exceeds its GPU memory quota of %d bytes and "+
			"is not written back", ErrNoMemory, total, f.scratch.limit))
		return nil
	}
	s, err := n.streamLocked(f, gpu)
	if err != nil {
		return err
	}
	var copied uint64
	for _, seg := range segs {
		buf, err := n.scratchBufferLocked(f, seg)
		if err == nil {
			err = s.CopyDtoH(buf, seg.Ptr)
		}
		if err != nil {
			// The copies queued so far write into host copies that stay allocated: wait for them all the same.
			_ = n.unlocked(func() error { return s.Synchronize(context.WithoutCancel(ctx)) })
			n.refuseScratchLocked(f, fmt.Errorf("writing its scratch back: %w", err))
			return nil
		}
		copied += seg.Size
	}
	if err := n.unlocked(func() error { return s.Synchronize(ctx) }); err != nil {
		if ctx.Err() != nil {
			// the host copies are the copies' destination
			_ = n.unlocked(func() error { return s.Synchronize(context.WithoutCancel(ctx)) })
			return fmt.Errorf("function %s gpu %d: write its scratch back: %w", f.name, gpu, err)
		}
		return fmt.Errorf("function %s gpu %d: write its scratch back: %w", f.name, gpu, n.faultLocked(f, gpu, err))
	}
	n.execs[gpu].scratchWrittenBack += copied
	f.scratch.touched, f.scratch.stale = false, false
	return nil
}

// scratchBufferLocked returns the host copy of seg, made (mapped and page-locked) the first time.
func (n *Node) scratchBufferLocked(f *function, seg memory.Segment) ([]byte, error) {
	if b, ok := f.scratch.host[seg.ID]; ok && uint64(len(b)) == seg.Size {
		return b, nil
	}
	n.freeScratchBufferLocked(f, seg.ID)
	var b []byte
	err := n.unlocked(func() (err error) { // page-locking is the driver's (f is moving)
		b, err = syscall.Mmap(-1, 0, int(seg.Size), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("host copy of scratch segment %d (%d bytes): %w", seg.ID, seg.Size, err)
		}
		if err := n.dev.RegisterHost(b); err != nil {
			_ = syscall.Munmap(b)
			return fmt.Errorf("host copy of scratch segment %d: page-lock: %w", seg.ID, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if f.scratch.host == nil {
		f.scratch.host = map[int][]byte{}
	}
	f.scratch.host[seg.ID] = b
	return b, nil
}

// freeScratchHostLocked frees f's host copies of the segments not in keep (all of them with keep nil), in an
// operation that marked f moving. No copy may be reading or writing them: the residencies they were restored into
// have completed their copies.
func (n *Node) freeScratchHostLocked(f *function, keep map[int]bool) {
	for id := range f.scratch.host {
		if !keep[id] {
			n.freeScratchBufferLocked(f, id)
		}
	}
}

func (n *Node) freeScratchBufferLocked(f *function, id int) {
	b, ok := f.scratch.host[id]
	if !ok {
		return
	}
	delete(f.scratch.host, id)
	if err := n.unlocked(func() error { return errors.Join(n.dev.UnregisterHost(b), syscall.Munmap(b)) }); err != nil {
		n.log.Warn("freeing the host copy of a scratch segment", "function", f.name, "segment", id, "err", err)
	}
}

// scratchHostLocked is the host copy to restore scratch segment seg of f from at a swap-in; nil when the segment
// is mapped zeroed (the function's scratch is its requests', the segment holds no block, or it was never mapped).
func (n *Node) scratchHostLocked(f *function, seg memory.Segment) []byte {
	if !f.keeps(seg) || f.scratch.stale || !f.space.Holds(seg.ID) {
		return nil
	}
	if b, ok := f.scratch.host[seg.ID]; ok && uint64(len(b)) == seg.Size {
		return b
	}
	return nil
}

// restoreScratchLocked enqueues the copy of seg's host copy into its freshly mapped chunks on the executor's
// host-to-device stream, in groups, with a readiness event that work on the segment waits for.
func (n *Node) restoreScratchLocked(e *Executor, r *residency, seg memory.Segment, host []byte) error {
	for off := uint64(0); off < seg.Size; off += e.groupBytes {
		size := min(e.groupBytes, seg.Size-off)
		if err := e.copyIn.CopyHtoD(seg.Ptr+device.Ptr(off), host[off:off+size]); err != nil {
			return fmt.Errorf("restore scratch segment %d: %w", seg.ID, err)
		}
	}
	ev, err := n.dev.NewEvent(e.gpu)
	if err == nil {
		err = e.copyIn.Record(ev)
	}
	if err != nil {
		return fmt.Errorf("restore scratch segment %d: %w", seg.ID, err)
	}
	if old, ok := r.ready[seg.ID]; ok {
		_ = old.Destroy()
	}
	r.ready[seg.ID] = ev
	e.swapBytes += seg.Size
	e.scratchRestored += seg.Size
	return nil
}

// dropStaleScratchLocked gives back the scratch chunks of f's parked copies on GPUs other than gpu, where f becomes
// active: what f writes there from now on makes them stale. It runs in an operation that marked f moving.
func (n *Node) dropStaleScratchLocked(ctx context.Context, f *function, gpu int) error {
	var parked []*residency
	for g, r := range f.res {
		if g != gpu {
			parked = append(parked, r)
		}
	}
	for _, r := range parked {
		var segs []memory.Segment
		for _, seg := range f.space.Segments() {
			if _, ok := r.chunks[seg.ID]; ok && seg.Kind != memory.KindModel && !r.mapped[seg.ID] {
				segs = append(segs, seg)
			}
		}
		if len(segs) == 0 {
			continue
		}
		if err := n.waitReadyLocked(ctx, f, r); err != nil { // none pending on a parked copy; to be sure
			return fmt.Errorf("function %s: %w", f.name, err)
		}
		for _, seg := range segs {
			if err := n.putChunksLocked(r.gpu, r.chunks[seg.ID]); err != nil {
				return fmt.Errorf("function %s segment %d: %w", f.name, seg.ID, err)
			}
			delete(r.chunks, seg.ID)
		}
	}
	return nil
}

// loseScratchLocked records that f's active copy was destroyed (by cause) without a write-back. When work of f ran
// since its last write-back, its scratch bytes are gone: its host copies are stale (its segments are mapped zeroed
// until its next write-back), and the scratch blocks allocated now are recorded. Those still allocated at f's next
// binding held state it keeps (a request's temporaries are freed by the request that was running): its work is then
// refused (checkScratchLocked). Without work since, the host copies still hold its scratch and are restored at its
// next swap-in.
func (n *Node) loseScratchLocked(f *function, cause error) {
	if !(f.keepsScratch() || f.keepsInit()) || !f.scratch.touched {
		return
	}
	f.scratch.touched, f.scratch.stale = false, true // the host copies are older than what it wrote
	blocks := f.space.Blocks(memory.KindInit)
	if f.keepsScratch() {
		blocks = append(blocks, f.space.Blocks(memory.KindScratch)...)
	}
	if len(blocks) == 0 {
		return
	}
	if f.scratch.destroyed == nil {
		f.scratch.destroyed = map[device.Ptr]bool{}
	}
	for _, p := range blocks {
		f.scratch.destroyed[p] = true
	}
	f.scratch.destroyedBy = cause
}

// checkScratchLocked is f's usableLocked at the start of a binding: a function with scratch blocks still allocated
// that were on a copy destroyed without a write-back (loseScratchLocked) is refused from now on.
func (n *Node) checkScratchLocked(f *function) error {
	if len(f.scratch.destroyed) > 0 {
		kept := 0
		for p := range f.scratch.destroyed {
			if f.space.Allocated(p) {
				kept++
			}
		}
		if kept > 0 {
			n.refuseScratchLocked(f, fmt.Errorf("%d of its scratch blocks were on a copy destroyed before they were "+
				"written back: %w", kept, f.scratch.destroyedBy))
		}
		f.scratch.destroyed, f.scratch.destroyedBy = nil, nil
	}
	return f.usableLocked()
}

// refuseScratchLocked refuses f's work (ErrLost) until its processes start again: the scratch it keeps cannot be
// vouched for (cause).
func (n *Node) refuseScratchLocked(f *function, cause error) {
	if f.lost != nil {
		return
	}
	_, held := f.heldScratch()
	f.lost = fmt.Errorf("its scratch (%d bytes allocated after its initialisation and kept between requests; "+
		"annotation com.openfaas.gpu.scratch: request declares it per request) is lost: %w", held, cause)
	n.log.Warn("function scratch lost: its process must start again", "function", f.name, "bytes", held,
		"err", cause)
}
