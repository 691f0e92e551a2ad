package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// Any is the Source of a swap that lets the node choose: a healthy GPU holding a copy the target can read as a
// peer, else the host image.
const Any Source = -2

// ChunkSize is the allocation granularity of every GPU's pool.
func (n *Node) ChunkSize() uint64 { return n.mem.ChunkSize() }

// Active returns the GPU function is active on, -1 if none (or if the function is unknown).
func (n *Node) Active(name string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f, ok := n.fns[name]; ok {
		return f.active
	}
	return -1
}

// Captured reports whether function's initialisation has ended (its model image is in the repository).
func (n *Node) Captured(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, ok := n.fns[name]
	return ok && f.captured
}

// EndInit ends function's initialisation once: the model segments are captured from its active GPU (Capture),
// or, when it is active on no GPU, taken from the bytes written back when it left its last one (saveLocked); a
// function without model segments only starts allocating scratch. It is a no-op for a captured function. Before
// its initialisation ends, a function that is moved or evicted has its bytes written back to the host and
// restored at its next swap-in, so a placement decision never ends an initialisation early (which would turn the
// blocks it allocates afterwards into scratch). A function whose memory a fault or a GPU failure destroyed before
// its initialisation ended fails with ErrBroken and ErrLost: its process must start again.
func (n *Node) EndInit(ctx context.Context, name string) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	f.admitting++ // a new request's: an expired binding of the function does not refuse it (usableLocked)
	defer func() { f.admitting-- }()
	defer n.moving(f)()
	return n.endInitLocked(ctx, f)
}

func (n *Node) endInitLocked(ctx context.Context, f *function) error {
	if err := f.usableLocked(); err != nil {
		return err
	}
	if f.captured {
		return nil
	}
	if f.initialising > 0 || (f.deferred && f.users > 0) {
		// A process of it is still in its own initialisation (BeginInit): a capture now would miss what it writes
		// afterwards into the blocks it has. The function stays initialising (its copy is written back when it
		// leaves a GPU) until an EndInit finds none, and, once deferred, no request of it in flight either: the
		// blocks its requests allocated meanwhile are model too, and a request may still be filling them.
		f.deferred = true
		return nil
	}
	if f.plan != nil && n.reuseLocked(f) {
		return nil // its image from before a restart is its capture
	}
	if f.active < 0 {
		return n.captureSavedLocked(ctx, f)
	}
	return n.captureLocked(ctx, f)
}

// BeginInit records that a process of function begins its own initialisation (it said so: remoting's call
// processPhase): until the matching FinishInit, EndInit does not capture the function's image, and the blocks the
// process allocates after a capture are its initialisation's (Initialising). Several processes may initialise at
// once.
func (n *Node) BeginInit(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	f.initialising++
	return nil
}

// FinishInit records that a process that began its initialisation (BeginInit) ended it, or ended. The function's
// image is captured at its next EndInit once no process is initialising.
func (n *Node) FinishInit(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f, ok := n.fns[name]; ok && f.initialising > 0 {
		f.initialising-- // a function reset since starts at 0: its processes ended
	}
}

// saveLocked writes the model bytes of a function that is still initialising back from its active GPU, before its
// copy there is dropped (it is evicted, moved, or its GPU goes to another tenant): until the initialisation ends
// that copy is the only one, and the function's next swap-in restores the saved bytes (completeLocked). An image
// from before a restart is given up first: the bytes written back replace it.
func (n *Node) saveLocked(ctx context.Context, f *function) error {
	if f.plan != nil {
		reason := "the function was evicted or moved before its initialisation ended"
		if f.plan.stale != "" {
			reason = f.plan.stale
		}
		if err := n.dropPlanLocked(f); err != nil {
			return err
		}
		n.images.Fallbacks++
		n.log.Warn("restart: the image from before the restart is not reused; writing the function's bytes back",
			"function", f.name, "reason", reason)
	}
	written, err := n.writeImageLocked(ctx, f, "write back initialising")
	if err != nil {
		return err
	}
	f.saved = map[int]bool{}
	if written {
		for _, s := range modelSegments(f) {
			f.saved[s.ID] = true
		}
		n.images.Saves++
	}
	return nil
}

// captureSavedLocked ends the initialisation of a function active on no GPU: its image is the one written back
// when it left its last GPU (saveLocked). Model segments allocated since hold zeros (their chunks are zeroed when
// first mapped, and nothing writes a segment of a function that is active nowhere), so they are added as zeros.
func (n *Node) captureSavedLocked(ctx context.Context, f *function) error {
	segs := modelSegments(f)
	if len(segs) == 0 {
		f.captured, f.saved = true, nil
		return nil
	}
	complete := true
	for _, s := range segs {
		complete = complete && f.saved[s.ID]
	}
	if !complete {
		tenant, saved := f.tenant, f.saved
		err := n.unlocked(func() error { // the image is written with mu released (f is moving)
			var old *repository.Image
			if len(saved) > 0 {
				var err error
				if old, err = n.repo.Get(ctx, f.name); err != nil {
					return fmt.Errorf("capture %s from its written-back image: %w", f.name, err)
				}
			}
			im, err := n.repo.CreateIn(ctx, f.name, "tenant "+tenant, segs) // chunks shared within the tenant
			if err != nil {
				if old != nil {
					_ = old.Release()
				}
				return fmt.Errorf("capture %s: %w", f.name, err)
			}
			if old != nil {
				for i, s := range im.Segments() {
					if j := imageSegment(old, s.ID); j >= 0 && saved[s.ID] {
						copy(im.Bytes(i), old.Bytes(j))
					}
				}
				_ = old.Release()
			}
			err = im.Commit()
			_ = im.Release()
			if err != nil {
				return fmt.Errorf("capture %s: %w", f.name, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	n.images.Captures++
	f.captured, f.saved = true, nil
	return nil
}

// Reset forgets function's memory (its processes ended): its copies are dropped everywhere, its addresses freed,
// its image deleted, and its next allocations start a new initialisation. Bindings still held (a request whose
// process died before it released) break: Binding.Err says so, and nothing of the forgotten state is ever served
// through them.
func (n *Node) Reset(ctx context.Context, name string) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	defer n.moving(f)()
	if f.users > 0 {
		f.broken = fmt.Errorf("the function's memory was reset while %d bindings were held: every process of the "+
			"function ended", f.users)
		n.log.Warn("function reset under held bindings: they are broken", "function", name, "bindings", f.users)
		f.users = 0
	}
	f.captured = true // nothing to keep
	f.scratch.discard = true
	for gpu := range f.res {
		if err := n.evictLocked(ctx, f, gpu); err != nil {
			return err
		}
	}
	n.freeScratchHostLocked(f, nil)
	errs := []error{n.dropPlanLocked(f)}
	for _, s := range f.streams {
		errs = append(errs, s.Destroy())
	}
	errs = append(errs, f.space.Close())
	if n.repo.Has(name) {
		errs = append(errs, n.repo.Delete(name))
	}
	n.fns[name] = n.newFunctionLocked(name, nil)
	return errors.Join(errs...)
}

// sourceLocked picks the source of a swap of f into gpu: a healthy GPU with a copy and peer access, else Host.
// A source still being filled by its own swap is waited for.
func (n *Node) sourceLocked(ctx context.Context, f *function, gpu int) Source {
	for g, r := range f.res {
		if g != gpu && r != nil && n.execs[g].healthy && n.dev.CanAccessPeer(gpu, g) &&
			n.waitReadyLocked(ctx, f, r) == nil {
			return g
		}
	}
	return Host
}
