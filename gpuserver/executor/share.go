package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
)

// Chunks shared on a GPU (Tangram's reuse of resident tensors).
//
// Only functions that say they never write their model memory after initialisation share on a GPU
// (SetModelShared; annotation com.openfaas.gpu.model: shared): PyTorch's caching allocator, for one, hands out the
// free space of blocks allocated during initialisation for later temporaries, and a temporary written into a
// shared chunk would change another function's weights (read-only, it faults). The repository stores images as content-addressed chunks of the GPU's chunk size, shared within a tenant
// (repository/chunks.go). When a swap-in from the host image needs a chunk whose key another function's copy on
// the same GPU already holds (resident: active or parked, its copy complete), it maps that physical chunk at its own
// fixed address instead of taking a new chunk and copying: the GPU holds the chunk once, and the swap moves only
// the function's own chunks. The model segments of such a function are mapped read-only at every address they
// are mapped at from its capture on, the first copy included (its swap-in's copies fill the chunks through a
// staging address), where the device can (device.ReadOnlyAccess: the CUDA driver's read-only access flag; on the simulated device,
// copies, memsets and reference kernels' writes into it fault, while dry launches, which compute nothing, cannot be
// checked); copies and memsets into them are refused before they reach the device (ErrReadOnly). A shared chunk
// goes back to the pool when the last copy holding it is dropped. Before, a chunk was mapped read-only only once a
// second copy shared it: the first variant to swap in could write its base chunks, and the next variant mapped
// the written bytes as its weights.
//
// Tenants: chunks are keyed within a tenant, and one tenant's memory is accessible on a GPU at a time (fault.go),
// so a shared chunk is only ever mapped into one tenant's functions. When tenants' work moves into executor
// processes of their own, a shared chunk stays within one tenant's process. A fault of the tenant's work drops
// every copy on that GPU holding a chunk shared with a copy the fault exposed.

// SetModelShared says that a registered function never writes its model memory after its initialisation (no
// temporaries in the free space of its model blocks either), so that chunks of it may be shared with the other
// such functions of its tenant on a GPU; the default (false) keeps its model chunks its own. The host repository
// shares identical chunks of every function of a tenant regardless: images are never written.
func (n *Node) SetModelShared(name string, on bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	f.modelShared = on
	return nil
}

// sharedChunk is a physical chunk of a GPU holding the bytes of a content key, and the copies that map it.
type sharedChunk struct {
	key   string
	chunk memory.Chunk
	refs  int        // residencies whose chunk lists hold it
	owner *residency // the copy that filled it, and its segment: ready once owner.ready has no pending event for it
	seg   int
}

// gpuChunks are the shared chunks of one GPU, by key and by chunk index.
type gpuChunks struct {
	byKey   map[string]*sharedChunk
	byIndex map[int]*sharedChunk
}

func (n *Node) chunksOf(gpu int) *gpuChunks {
	if n.shared == nil {
		n.shared = map[int]*gpuChunks{}
	}
	g, ok := n.shared[gpu]
	if !ok {
		g = &gpuChunks{byKey: map[string]*sharedChunk{}, byIndex: map[int]*sharedChunk{}}
		n.shared[gpu] = g
	}
	return g
}

// SharingStats are the figures of chunks shared on the GPUs.
type SharingStats struct {
	// SharedBytes: bytes of model segments that swap-ins mapped from a chunk already on the GPU instead of copying.
	SharedBytes uint64 `json:"shared_bytes"`
	// ResidentShared: bytes of chunks mapped by more than one copy now, counted once.
	ResidentShared uint64 `json:"resident_shared"`
}

// Sharing returns the sharing figures.
func (n *Node) Sharing() SharingStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := SharingStats{SharedBytes: n.sharedBytes}
	for _, g := range n.shared {
		for _, c := range g.byKey {
			if c.refs > 1 {
				st.ResidentShared += n.mem.ChunkSize()
			}
		}
	}
	return st
}

// chunkPlan is how a segment's chunks come to a GPU: reused[j] is a chunk already there (nil: take a new one and
// copy), keys[j] its content key ("" when the image has none).
type chunkPlan struct {
	keys   []string
	reused []*sharedChunk
}

// planChunksLocked looks up which chunks of segment idx of im are on gpu already.
func (n *Node) planChunksLocked(gpu int, im *repository.Image, idx int, count int) chunkPlan {
	p := chunkPlan{reused: make([]*sharedChunk, count)}
	keys := im.ChunkKeys(idx)
	if im.ChunkBytes() != n.mem.ChunkSize() || len(keys) != count {
		return p
	}
	p.keys = keys
	g := n.chunksOf(gpu)
	for j, k := range keys {
		c, ok := g.byKey[k]
		if !ok {
			continue
		}
		if ev, pending := c.owner.ready[c.seg]; pending {
			if done, err := ev.Query(); !done || err != nil {
				continue // its copy has not landed yet: copy afresh
			}
		}
		p.reused[j] = c
	}
	return p
}

// takePlannedLocked returns the segment's chunk list: the reused chunks (referenced once more) and count new ones
// from the pool (registered under their keys, to be filled by the caller's copy).
func (n *Node) takePlannedLocked(ctx context.Context, f *function, r *residency, segID int, p chunkPlan) ([]memory.Chunk, error) {
	gpu := r.gpu
	need := 0
	for _, c := range p.reused {
		if c == nil {
			need++
		}
	}
	var fresh []memory.Chunk
	if need > 0 {
		var err error
		if fresh, err = n.takeChunksLocked(ctx, f, gpu, need); err != nil {
			return nil, err
		}
	}
	out := make([]memory.Chunk, len(p.reused))
	g := n.chunksOf(gpu)
	for j, c := range p.reused {
		if c != nil {
			c.refs++
			out[j] = c.chunk
			continue
		}
		out[j], fresh = fresh[0], fresh[1:]
		if p.keys != nil {
			if _, taken := g.byKey[p.keys[j]]; !taken {
				sc := &sharedChunk{key: p.keys[j], chunk: out[j], refs: 1, owner: r, seg: segID}
				g.byKey[sc.key] = sc
				g.byIndex[out[j].Index] = sc
			}
		}
	}
	return out, nil
}

// putChunksLocked gives chunks of a dropped copy back: a shared chunk goes back to the pool when no other copy
// holds it.
func (n *Node) putChunksLocked(gpu int, chunks []memory.Chunk) error {
	g := n.chunksOf(gpu)
	back := make([]memory.Chunk, 0, len(chunks))
	for _, c := range chunks {
		if sc, ok := g.byIndex[c.Index]; ok {
			sc.refs--
			if sc.refs > 0 {
				continue
			}
			delete(g.byIndex, c.Index)
			if g.byKey[sc.key] == sc {
				delete(g.byKey, sc.key)
			}
		}
		back = append(back, c)
	}
	if len(back) == 0 {
		return nil
	}
	return n.mem.Pool(gpu).Put(back)
}

// forgetChunksLocked forgets gpu's shared chunks (the GPU failed: its chunks are not returned to the pool).
func (n *Node) forgetChunksLocked(gpu int) { delete(n.shared, gpu) }

// sharedWithLocked reports whether any chunk of r is held by another copy too.
func (n *Node) sharedWithLocked(r *residency) bool {
	g := n.chunksOf(r.gpu)
	for _, chunks := range r.chunks {
		for _, c := range chunks {
			if sc, ok := g.byIndex[c.Index]; ok && sc.refs > 1 {
				return true
			}
		}
	}
	return false
}

// readOnly reports whether seg of f is mapped read-only wherever it is mapped: a model segment of a captured
// function that shares its model (SetModelShared). Its chunks are content-addressed and may be, or become, another
// function's weights: they are immutable from the capture on, to every function, the first included.
func (f *function) readOnly(seg memory.Segment) bool {
	return seg.Kind == memory.KindModel && f.captured && f.modelShared && !f.dead[seg.ID]
}

// protectLocked maps seg of f read-only at its address on gpu (readOnly), where the device can (the driver's call,
// with mu released: f is moving). A copy that fills its chunks writes through a staging address (stageChunksLocked).
func (n *Node) protectLocked(f *function, gpu int, seg memory.Segment) error {
	ro, ok := n.dev.(device.ReadOnlyAccess)
	if !ok || !f.readOnly(seg) {
		return nil
	}
	return n.unlocked(func() error {
		if err := ro.SetAccessReadOnly(seg.Ptr, seg.Size, []int{gpu}); err != nil {
			return fmt.Errorf("function %s segment %d: read-only model: %w", f.name, seg.ID, err)
		}
		return nil
	})
}

// protectActiveLocked maps the model segments of f's active copy read-only once its initialisation ended (readOnly).
func (n *Node) protectActiveLocked(f *function) error {
	if f.active < 0 {
		return nil
	}
	r := f.res[f.active]
	for _, seg := range f.space.Segments() {
		if r.mapped[seg.ID] {
			if err := n.protectLocked(f, f.active, seg); err != nil {
				return err
			}
		}
	}
	return nil
}

// ErrReadOnly: a copy or memset into memory mapped read-only (a shared model's weights, readOnly).
var ErrReadOnly = errors.New("write into read-only memory")

// refuseReadOnlyLocked refuses a copy or memset of what into f's memory at dst when it lies in a read-only segment,
// before it reaches the device: the writer gets an error, no other function's weights change.
func (n *Node) refuseReadOnlyLocked(f *function, what string, dst device.Ptr) error {
	if seg, ok := f.space.Lookup(dst); ok && f.readOnly(seg) {
		return fmt.Errorf("%w: function %s: a %s into its model segment %d: the model of a function with "+
			"com.openfaas.gpu.model: shared is read-only after its initialisation (its chunks are shared with other "+
			"functions); write into memory allocated for it (scratch) instead", ErrReadOnly, f.name, what, seg.ID)
	}
	return nil
}
