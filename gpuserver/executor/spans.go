package executor

import (
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// gatedSegmentsLocked returns the segments of f that work given pointers ptrs may read or write: the segment each
// points into and, for a segment placed in a range, the segments placed right after it (memory
// AddressSpace.Following). A kernel's pointer argument or a copy's address says where a block starts, not where it
// ends, and under PyTorch's expandable segments a tensor runs across the pages of its range: gated on its first
// page alone, a kernel launched during a pipelined swap-in read the next pages before their copies landed (the bytes
// their chunks held before). None when no segment of f on the GPU has a copy pending (nothing to wait for).
func (n *Node) gatedSegmentsLocked(f *function, pending bool, ptrs []device.Ptr) []memory.Segment {
	if !pending {
		return nil
	}
	var out []memory.Segment
	seen := map[int]bool{}
	for _, p := range ptrs {
		seg, ok := f.space.Lookup(p)
		if !ok || seen[seg.ID] {
			continue
		}
		seen[seg.ID] = true
		out = append(out, seg)
		for _, next := range f.space.Following(seg) {
			if !seen[next.ID] {
				seen[next.ID] = true
				out = append(out, next)
			}
		}
	}
	return out
}
