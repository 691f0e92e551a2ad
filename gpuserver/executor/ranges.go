package executor

import (
	"context"
	"errors"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// Virtual memory management of a function (PyTorch's expandable segments): a range of the function's fixed address
// space reserved once, in which it places blocks at addresses it chooses. A placed block is a segment of its own
// like any large block: backed on the GPU the function is active on, swapped with it, its chunks returned when
// freed.

// ReserveRange reserves size bytes (a multiple of ChunkSize) of address space for function.
func (n *Node) ReserveRange(name string, size, alignment uint64) (device.Ptr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return 0, err
	}
	return f.space.ReserveRange(size, alignment)
}

// AllocAt places a block of size bytes (whole chunks) at ptr inside one of function's ranges for a process in
// phase: part of the model before Capture, scratch or init after (blockKind); backed and mapped at once when the
// function is active.
func (n *Node) AllocAt(ctx context.Context, name string, ptr device.Ptr, size uint64, phase Phase) (memory.Segment, error) {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return memory.Segment{}, err
	}
	defer n.moving(f)()
	seg, err := f.space.AllocAt(ptr, size, blockKind(f, phase))
	if err != nil {
		return memory.Segment{}, err
	}
	n.matchLocked(f, seg)
	f.own[seg.ID] = true
	if f.active >= 0 {
		if err := n.completeLocked(ctx, f, f.active, Host); err != nil {
			return memory.Segment{}, errors.Join(err, n.freeLocked(ctx, f, ptr))
		}
	}
	return seg, nil
}

// FreeRange releases a range of function whose blocks have all been freed.
func (n *Node) FreeRange(name string, ptr device.Ptr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	return f.space.FreeRange(ptr)
}
