package executor_test

import (
	"context"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestSiblingInstanceIsASwapSource: two instances of one function (m@1, m@2, which say they never write their model
// after initialisation: com.openfaas.gpu.model: shared) initialised their own memory at their
// own addresses: two blocks of weights with the same bytes, and a third block each of their own (a table of
// device pointers differs between instances). m@2's swap-in onto GPU 2 from GPU 0, where only m@1 has a copy,
// used to read everything from the host image; now the weights' segments, whose chunks have the keys of m@1's,
// come from m@1's copy over the GPUs' link, and the block of its own from its host image: every byte is m@2's.
func TestSiblingInstanceIsASwapSource(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 1<<30, sim.Options{}, false)
	sizes := []int{3 << 20, 5 << 20, 3 << 20}
	for _, fn := range []string{"m@1", "m@2"} {
		must(t, r.node.Register(fn))
		must(t, r.node.SetModelShared(fn, true))
	}
	initModel(t, r, "m@1", 0, sizes...)
	b := initBlocks(t, r, "m@2", 1, false, sizes...)
	// m@2's third block is its own (initBlocks wrote the pattern m@1 has there too).
	h, err := r.node.Acquire(ctx, "m@2", 1, executor.Host)
	must(t, err)
	s, err := r.node.Stream("m@2")
	must(t, err)
	b.data[2] = pattern(sizes[2], 200)
	must(t, s.CopyHtoD(b.blocks[2], b.data[2]))
	must(t, s.Synchronize(ctx))
	must(t, r.node.Capture(ctx, "m@2"))
	h.Release()
	must(t, r.node.Evict(ctx, "m@2", 1))

	must(t, r.node.SwapIn(ctx, "m@2", 2, 0))
	verify(t, r, b, 2)
	st := r.node.Status()[2]
	if want := uint64(4<<20 + 6<<20); st.SiblingBytes != want {
		t.Errorf("gpu 2 copied %d bytes from the sibling's copy, want %d (the two weight segments)", st.SiblingBytes,
			want)
	}
	// With no sibling copy on the source named, everything comes from the host image.
	must(t, r.node.SwapIn(ctx, "m@2", 3, 1))
	verify(t, r, b, 3)
	if got := r.node.Status()[3].SiblingBytes; got != 0 {
		t.Errorf("gpu 3 copied %d bytes from a sibling, want 0 (none on gpu 1)", got)
	}
	// A function that may write its model memory never reads a sibling's live copy.
	must(t, r.node.SetModelShared("m@2", false))
	must(t, r.node.Evict(ctx, "m@2", 1))
	must(t, r.node.Evict(ctx, "m@2", 2))
	must(t, r.node.SwapIn(ctx, "m@2", 1, 0))
	verify(t, r, b, 1)
	if got := r.node.Status()[1].SiblingBytes; got != 0 {
		t.Errorf("m@2, not model-shared, copied %d bytes from its sibling, want 0", got)
	}
}
