package executor

import (
	"slices"
	"testing"
)

// TestPlanSegment: a parked copy needs nothing, kept scratch is restored from its host copy, a segment with no bytes
// to bring is zeroed, and a model block with bytes is copied.
func TestPlanSegment(t *testing.T) {
	for _, c := range []struct {
		f    segmentFacts
		want segmentWork
	}{
		{segmentFacts{Parked: true, ScratchHost: true, Fill: true}, workNone},
		{segmentFacts{ScratchHost: true}, workRestoreScratch},
		{segmentFacts{}, workZero},
		{segmentFacts{Fill: true}, workCopy},
	} {
		if got := planSegment(c.f); got != c.want {
			t.Errorf("%+v: %d, want %d", c.f, got, c.want)
		}
	}
	if copyFrom(true, true) != fromPeer || copyFrom(false, true) != fromSibling || copyFrom(false, false) != fromHost {
		t.Error("copy source preference: own copy, then a sibling's, then the host image")
	}
}

// TestCopySpans: the chunks not on the GPU are copied in runs of consecutive chunks, each run in groups, in address
// order, the last chunk of a segment cut at its size; the reused bytes are counted.
func TestCopySpans(t *testing.T) {
	const chunk = 4
	// 5 chunks of a 18-byte segment: chunks 1 and 2 are on the GPU; 0 and 3-4 (the last one 2 bytes) are copied.
	spans, shared := copySpans([]bool{false, true, true, false, false}, chunk, 18, 3)
	want := []span{{0, 3}, {3, 1}, {12, 3}, {15, 3}}
	if !slices.Equal(spans, want) || shared != 8 {
		t.Fatalf("spans %v shared %d, want %v shared 8", spans, shared, want)
	}
	if spans, shared := copySpans([]bool{true, true}, chunk, 8, 3); len(spans) != 0 || shared != 8 {
		t.Fatalf("every chunk on the gpu: %v %d", spans, shared)
	}
	// No chunk reused: one run, cut only by the group size.
	spans, _ = copySpans([]bool{false, false, false}, chunk, 12, 8)
	if want := []span{{0, 8}, {8, 4}}; !slices.Equal(spans, want) {
		t.Fatalf("spans %v, want %v", spans, want)
	}
}
