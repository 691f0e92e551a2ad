package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
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

// EndInit ends function's initialisation once: the model segments are captured from its active GPU (Capture);
// a function without model segments only starts allocating scratch. It is a no-op for a captured function. The
// node also ends a function's initialisation itself before a swap moves it or an eviction drops its active copy,
// so an image is never lost.
func (n *Node) EndInit(ctx context.Context, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	return n.endInitLocked(ctx, f)
}

func (n *Node) endInitLocked(ctx context.Context, f *function) error {
	if f.captured {
		return nil
	}
	if f.plan != nil && n.reuseLocked(f) {
		return nil // its image from before a restart is its capture
	}
	if f.active < 0 {
		for _, s := range f.space.Segments() {
			if s.Kind == memory.KindModel && !f.dead[s.ID] {
				return fmt.Errorf("%w: %s has model blocks but is active on no gpu", ErrInvalid, f.name)
			}
		}
		f.captured = true
		return nil
	}
	return n.captureLocked(ctx, f)
}

// Reset forgets function's memory (its processes ended): its copies are dropped everywhere, its addresses freed,
// its image deleted, and its next allocations start a new initialisation. Bindings still held (a request whose
// process died before it released) break: Binding.Err says so, and nothing of the forgotten state is ever served
// through them (issue 11 item 6).
func (n *Node) Reset(ctx context.Context, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	if f.users > 0 {
		f.broken = fmt.Errorf("the function's memory was reset while %d bindings were held: every process of the "+
			"function ended", f.users)
		n.log.Warn("function reset under held bindings: they are broken", "function", name, "bindings", f.users)
		f.users = 0
	}
	f.captured = true // nothing to keep
	for gpu := range f.res {
		if err := n.evictLocked(ctx, f, gpu); err != nil {
			return err
		}
	}
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
			n.waitReadyLocked(ctx, r) == nil {
			return g
		}
	}
	return Host
}
