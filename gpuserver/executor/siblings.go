package executor

import (
	"context"
	"slices"

	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// Sibling instances as swap sources (docs/design.md, decision 10).
//
// A function's instances (pool.InstanceKey: each a function of its own here) initialise their own memory at their
// own addresses, so their copies are not byte for byte the same: a block holding device pointers differs. Their
// weights are, and the repository holds each image as content-addressed chunks. A swap-in of an instance that has
// no copy on the source GPU the controller chose reads each model segment whose chunks all have the same keys as
// the same segment of a sibling's complete copy there from that copy (peer to peer: NVLink where the node has it),
// and every other segment from its own host image. A second copy of a hot model thus comes from the first, as in
// Torpor, and never carries another instance's pointers.
//
// Only functions that say they never write their model memory after initialisation (SetModelShared; annotation
// com.openfaas.gpu.model: shared) read from a sibling: another function's live copy may hold what its requests wrote
// into its model blocks since (PyTorch's caching allocator puts temporaries in their free space), which its image,
// and so the chunk keys, do not show.

// siblingSource is a sibling instance's copy a swap-in reads matching segments from.
type siblingSource struct {
	f     *function
	res   *residency
	image *repository.Image
	segs  []memory.Segment
	used  bool // a segment was copied from it: the copy is pinned until the swap's copies completed
}

// siblingLocked finds a complete copy of a sibling instance of f (same function, same tenant, captured) on GPU
// source, peer-accessible from gpu; nil when there is none.
func (n *Node) siblingLocked(ctx context.Context, f *function, source, gpu int) *siblingSource {
	if !f.modelShared || n.validGPU(source) != nil || source == gpu || !n.execs[source].healthy ||
		!n.dev.CanAccessPeer(gpu, source) {
		return nil
	}
	family, inst := pool.SplitInstance(f.name)
	names := make([]string, 0, len(n.fns))
	for name := range n.fns {
		names = append(names, name)
	}
	slices.Sort(names) // the same sibling for the same node state
	for _, name := range names {
		g := n.fns[name]
		if fam, i := pool.SplitInstance(name); g == f || fam != family || i == inst || g.tenant != f.tenant ||
			!g.captured || !g.modelShared {
			continue
		}
		r := g.res[source]
		if r == nil {
			continue
		}
		im, err := n.repo.Get(ctx, g.name)
		if err != nil {
			continue
		}
		return &siblingSource{f: g, res: r, image: im, segs: g.space.Segments()}
	}
	return nil
}

// segment returns the sibling's segment to read seg's bytes from: the segment of the same ID, size and kind whose
// copy is complete on the source GPU and whose image chunks have the keys of seg's in mine (f's image); ok is false
// when seg must come from the host image.
func (s *siblingSource) segment(mine *repository.Image, seg memory.Segment) (memory.Segment, bool) {
	if seg.ID >= len(s.segs) || s.f.dead[seg.ID] {
		return memory.Segment{}, false
	}
	theirs := s.segs[seg.ID]
	if theirs.Size != seg.Size || theirs.Kind != memory.KindModel || s.res.chunks[theirs.ID] == nil {
		return memory.Segment{}, false
	}
	if _, loading := s.res.ready[theirs.ID]; loading {
		return memory.Segment{}, false
	}
	mi, ti := imageSegment(mine, seg.ID), imageSegment(s.image, theirs.ID)
	if mi < 0 || ti < 0 {
		return memory.Segment{}, false
	}
	a, b := mine.ChunkKeys(mi), s.image.ChunkKeys(ti)
	if len(a) == 0 || !slices.Equal(a, b) {
		return memory.Segment{}, false
	}
	return theirs, true
}

// release gives the sibling's image back (its copy's pin, when used, is the swap job's).
func (s *siblingSource) release() {
	if s != nil && s.image != nil {
		_ = s.image.Release()
		s.image = nil
	}
}
