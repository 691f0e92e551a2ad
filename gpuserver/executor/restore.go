package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// Restart reuse: the repository keeps each function's model image across a gpuserver restart, with the
// fixed addresses of its segments. A Node given Addresses reserves those ranges again at start
// (Backend.ReserveAddressAt) and, when the function registers, restores it from its image instead of capturing a
// new one:
//
//   - as the function's process (a new one: the shim does not yet resume a session across a restart) allocates
//     its model again, each new segment whose ID the image has gets the image's address (same size required), so
//     the function's blocks land where the image says and pointers inside the image stay valid;
//   - a restored segment is filled from the host image when it is mapped (as a swap-in does), and the process's
//     own initialisation copies into it are compared with the image on the host and skipped when equal
//     (ImageStats.SkippedBytes), so its model does not cross PCIe a second time;
//   - at the end of its initialisation the image is taken as its capture (ImageStats.Reused) without copying
//     anything back.
//
// Anything that breaks the match falls back to a normal initialisation and capture (ImageStats.Fallbacks, and a
// log line saying why): a range that cannot be reserved again, an allocation of another size or at another
// address, bytes that differ from the image, a memset, device-to-device copy or kernel writing a restored
// segment during initialisation (its result cannot be checked on the host), or a model segment the image lacks.

// Addresses wraps the device the memory manager reserves address ranges through, so that a Node can hand a
// function's address space the fixed range of its image. Build the memory manager on it and pass it as
// Config.Addresses.
type Addresses struct {
	device.Backend

	mu     sync.Mutex
	parked map[device.Ptr]uint64 // ranges reserved for images, not yet handed out
	hint   device.Ptr            // the range the next ReserveAddress of hintSz bytes returns
	hintSz uint64
}

// NewAddresses wraps dev.
func NewAddresses(dev device.Backend) *Addresses {
	return &Addresses{Backend: dev, parked: map[device.Ptr]uint64{}}
}

// MapRange maps part of a physical allocation when the wrapped device can (device.RangeMapper), so that a memory
// manager built on the Addresses maps runs of chunks with one call.
func (a *Addresses) MapRange(ptr device.Ptr, phys device.Physical, offset, size uint64) error {
	r, ok := a.Backend.(device.RangeMapper)
	if !ok {
		return fmt.Errorf("%w: the device maps whole physical allocations only", device.ErrNotSupported)
	}
	return r.MapRange(ptr, phys, offset, size)
}

// ReserveAddress returns the hinted parked range when one of that size is hinted, else a new reservation.
func (a *Addresses) ReserveAddress(size, alignment uint64) (device.Ptr, error) {
	a.mu.Lock()
	p, sz := a.hint, a.hintSz
	a.hint, a.hintSz = 0, 0
	if p != 0 && sz == size && a.parked[p] == size {
		delete(a.parked, p)
		a.mu.Unlock()
		return p, nil
	}
	a.mu.Unlock()
	return a.Backend.ReserveAddress(size, alignment)
}

func (a *Addresses) park(p device.Ptr, size uint64) error {
	if _, err := a.Backend.ReserveAddressAt(p, size); err != nil {
		return err
	}
	a.mu.Lock()
	a.parked[p] = size
	a.mu.Unlock()
	return nil
}

func (a *Addresses) setHint(p device.Ptr, size uint64) {
	a.mu.Lock()
	a.hint, a.hintSz = p, size
	a.mu.Unlock()
}

// unpark frees a parked range that was not handed out.
func (a *Addresses) unpark(p device.Ptr) error {
	a.mu.Lock()
	size, ok := a.parked[p]
	delete(a.parked, p)
	a.mu.Unlock()
	if !ok {
		return nil
	}
	return a.Backend.FreeAddress(p, size)
}

// ImageStats counts how functions' initialisations ended.
type ImageStats struct {
	// Captures: images captured from a GPU (a function's initialisation ran and its bytes were copied back).
	Captures int64 `json:"captures"`
	// Reused: functions whose image from before a restart was taken as their capture.
	Reused int64 `json:"reused"`
	// Fallbacks: restorable images given up for a new initialisation (the log says why).
	Fallbacks int64 `json:"fallbacks"`
	// SkippedBytes: initialisation copies not sent to the GPU because the image held the same bytes.
	SkippedBytes uint64 `json:"skipped_bytes"`
	// Saves: bytes of functions still initialising written back to the host because they were evicted or moved
	// before their first request (restored at their next swap-in).
	Saves int64 `json:"saves"`
}

// Images returns the counters of captures and restores.
func (n *Node) Images() ImageStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.images
}

// restorePlan is a function's image from before a restart, while its new initialisation may still match it.
type restorePlan struct {
	segs     map[int]repository.Segment // by segment ID
	restored map[int]bool               // segments allocated again at the image's address
	image    *repository.Image          // held while the plan lives
	stale    string                     // why the plan no longer holds; "" while it does
}

// parkImages reserves the ranges of every image in the repository (New).
func (n *Node) parkImages(ctx context.Context) {
	for _, name := range n.repo.Functions() {
		im, err := n.repo.Get(ctx, name)
		if err != nil {
			n.log.Warn("restart: image cannot be read; the function initialises again", "function", name, "err", err)
			continue
		}
		plan := &restorePlan{segs: map[int]repository.Segment{}, restored: map[int]bool{}, image: im}
		var parked []device.Ptr
		for _, s := range im.Segments() {
			if err := n.addrs.park(s.Ptr, s.Size); err != nil {
				plan.stale = fmt.Sprintf("segment %d's range of %d bytes at %#x cannot be reserved again: %v", s.ID,
					s.Size, uint64(s.Ptr), err)
				break
			}
			parked = append(parked, s.Ptr)
			plan.segs[s.ID] = s
		}
		if plan.stale != "" {
			for _, p := range parked {
				_ = n.addrs.unpark(p)
			}
			_ = im.Release()
			n.images.Fallbacks++
			n.log.Warn("restart: the image's addresses cannot be reserved again; the function initialises again",
				"function", name, "reason", plan.stale)
			continue
		}
		n.plans[name] = plan
	}
}

// dropPlanLocked ends f's plan: parked ranges not handed out are freed, the image hold is released.
func (n *Node) dropPlanLocked(f *function) error {
	p := f.plan
	if p == nil {
		return nil
	}
	f.plan = nil
	var errs []error
	for id, s := range p.segs {
		if !p.restored[id] {
			errs = append(errs, n.addrs.unpark(s.Ptr))
		}
	}
	errs = append(errs, p.image.Release())
	return errors.Join(errs...)
}

// staleLocked gives up f's plan (the capture at the end of its initialisation will replace the image).
func (n *Node) staleLocked(f *function, reason string) {
	if f.plan == nil || f.plan.stale != "" {
		return
	}
	f.plan.stale = reason
}

// restoringLocked reports whether seg of f is a restored segment whose bytes still match the image.
func (n *Node) restoringLocked(f *function, segID int) bool {
	return f.plan != nil && f.plan.stale == "" && !f.captured && f.plan.restored[segID]
}

// hintLocked points the next reservation of f's address space at the image's range for the next segment ID.
func (n *Node) hintLocked(f *function) {
	if f.plan == nil || f.plan.stale != "" || f.captured {
		return
	}
	if s, ok := f.plan.segs[len(f.space.Segments())]; ok {
		n.addrs.setHint(s.Ptr, s.Size)
	}
}

// matchLocked checks a segment created under a plan against the image.
func (n *Node) matchLocked(f *function, seg memory.Segment) {
	if f.plan == nil || f.plan.stale != "" || f.captured {
		return
	}
	want, ok := f.plan.segs[seg.ID]
	if !ok {
		return // a segment the image lacks: checked at the end of initialisation (freed by then, or a mismatch)
	}
	if seg.Ptr != want.Ptr || seg.Size != want.Size || seg.Kind != memory.KindModel {
		n.staleLocked(f, fmt.Sprintf("segment %d is %d bytes at %#x, the image has %d bytes at %#x", seg.ID,
			seg.Size, uint64(seg.Ptr), want.Size, uint64(want.Ptr)))
		return
	}
	f.plan.restored[seg.ID] = true
}

// reuseLocked ends f's initialisation from its plan when it still matches; it returns false (after logging why)
// when the function must be captured instead.
func (n *Node) reuseLocked(f *function) bool {
	p := f.plan
	if p == nil {
		return false
	}
	reason := p.stale
	if reason == "" {
		for id := range p.segs {
			if !p.restored[id] {
				reason = fmt.Sprintf("segment %d of the image was not allocated again", id)
				break
			}
		}
	}
	if reason == "" {
		for _, s := range f.space.Segments() {
			if s.Kind == memory.KindModel && !f.dead[s.ID] && !p.restored[s.ID] {
				reason = fmt.Sprintf("model segment %d is not in the image", s.ID)
				break
			}
		}
	}
	if err := n.dropPlanLocked(f); err != nil && reason == "" {
		reason = err.Error()
	}
	if reason != "" {
		n.images.Fallbacks++
		n.log.Warn("restart: the image from before the restart is not reused; capturing a new one", "function",
			f.name, "reason", reason)
		return false
	}
	f.captured = true
	if err := n.protectActiveLocked(f); err != nil { // a shared model is read-only from its capture on (share.go)
		n.log.Warn("restart: the reused model cannot be mapped read-only", "function", f.name, "err", err)
	}
	n.images.Reused++
	n.log.Info("restart: the image from before the restart is the function's model; nothing captured",
		"function", f.name, "segments", len(p.segs))
	return true
}

// skipCopyLocked reports whether a host-to-device copy of src to dst can be skipped because dst lies in a
// restored segment whose image holds the same bytes; a copy with other bytes gives the plan up.
func (n *Node) skipCopyLocked(f *function, dst device.Ptr, src []byte) bool {
	seg, ok := f.space.Lookup(dst)
	if !ok || !n.restoringLocked(f, seg.ID) {
		return false
	}
	off := uint64(dst - seg.Ptr)
	img := f.plan.image
	for i, s := range img.Segments() {
		if s.ID != seg.ID {
			continue
		}
		if off+uint64(len(src)) <= s.Size && bytes.Equal(img.Bytes(i)[off:off+uint64(len(src))], src) {
			n.images.SkippedBytes += uint64(len(src))
			return true
		}
	}
	n.staleLocked(f, fmt.Sprintf("the function wrote other bytes than the image's to segment %d", seg.ID))
	return false
}

// writesLocked gives the plan up when work that cannot be checked on the host writes into a restored segment.
func (n *Node) writesLocked(f *function, what string, ptrs ...device.Ptr) {
	for _, p := range ptrs {
		if seg, ok := f.space.Lookup(p); ok && n.restoringLocked(f, seg.ID) {
			n.staleLocked(f, fmt.Sprintf("a %s wrote segment %d during initialisation", what, seg.ID))
			return
		}
	}
}
