package executor

// The plan of a swap-in (completeLocked, swap.go), the decisions that need no device: what is done with each
// segment once its chunks are mapped (planSegment), where a copied segment is read from (copyFrom), and which
// chunks are copied in which order (copySpans); the segments go in scratchFirst's order. The execution gathers the facts of a segment when it reaches it, not all up
// front: each segment's mapping runs with the node's lock released, during which a sibling's copy or the chunks
// already on the GPU may change, so a plan made of the state before the first segment could copy from memory that
// is gone by the time it is read.

// segmentWork is what a swap-in does with a segment whose chunks it mapped.
type segmentWork int

const (
	workNone           segmentWork = iota // a parked copy already holds its bytes
	workRestoreScratch                    // scratch the function keeps: copied back from its host copy (scratch.go)
	workZero                              // nothing to bring: its fresh chunks are zeroed (they may hold another function's bytes)
	workCopy                              // model bytes: copied in from the swap's source (copyFrom)
)

// segmentFacts are what decides a segment's work.
type segmentFacts struct {
	// Parked: the chunks were on the GPU already (a parked copy).
	Parked bool
	// ScratchHost: the function keeps a host copy of this scratch segment.
	ScratchHost bool
	// Fill: a model block with bytes to bring (its image, a restore during initialisation, bytes written back);
	// scratch, or a model block the function's own calls fill during initialisation, has none.
	Fill bool
}

// planSegment is the work of one mapped segment.
func planSegment(f segmentFacts) segmentWork {
	switch {
	case f.Parked:
		return workNone
	case f.ScratchHost:
		return workRestoreScratch
	case !f.Fill:
		return workZero
	}
	return workCopy
}

// copySource is where a segment's copy reads from.
type copySource int

const (
	fromPeer    copySource = iota + 1 // the function's own copy on another GPU
	fromSibling                       // a sibling instance's copy of the same weights (siblings.go)
	fromHost                          // the function's image in host memory
)

// copyFrom picks a segment's source: the function's own copy where the peer holds the segment, else a sibling's
// matching copy, else the host image.
func copyFrom(peerHasSegment, siblingMatches bool) copySource {
	switch {
	case peerHasSegment:
		return fromPeer
	case siblingMatches:
		return fromSibling
	}
	return fromHost
}

// span is one copy of a swap-in: size bytes at offset off of a segment.
type span struct{ off, size uint64 }

// copySpans is the copies of a segment of size bytes whose chunks of chunk bytes each are reused[j] (on the GPU
// already: not copied) or not: the chunks to copy in runs of consecutive ones, each run cut into groups of at most
// group bytes, in address order. shared is the bytes reused.
func copySpans(reused []bool, chunk, size, group uint64) (spans []span, shared uint64) {
	var runs []span
	for j, r := range reused {
		off := uint64(j) * chunk
		n := min(chunk, size-off)
		if r {
			shared += n
			continue
		}
		if k := len(runs) - 1; k >= 0 && runs[k].off+runs[k].size == off {
			runs[k].size += n
		} else {
			runs = append(runs, span{off, n})
		}
	}
	for _, run := range runs {
		for off := run.off; off < run.off+run.size; off += group {
			spans = append(spans, span{off, min(group, run.off+run.size-off)})
		}
	}
	return spans, shared
}
