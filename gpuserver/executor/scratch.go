package executor

import (
	"context"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// Scratch of the request (a KV cache, activations).
//
// Blocks a function allocates after its initialisation are scratch: never in its image, mapped without a copy
// (zeroed) on swap-in, dropped on eviction. By default they stay with the function's copy while it is resident, so
// that a function may keep state in them between requests. A function whose scratch is its requests' own
// (SetScratchPerRequest: an LLM's KV cache, rewritten by every request) gives the physical memory of its scratch
// segments back to the pool when its last binding ends, and gets fresh zeroed chunks at the same fixed addresses at
// its next binding: no copy at swap-in, nothing held while idle, and the quota still counts the scratch while bound
// (the session counts every segment against it). Pointers into scratch stay valid across requests (a captured CUDA
// graph keeps working); its bytes do not.

// SetScratchPerRequest makes a registered function's scratch segments the request's (see above), or, with on
// false, the function's own until evicted (the default).
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
