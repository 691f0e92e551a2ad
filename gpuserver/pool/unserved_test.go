package pool

import (
	"context"
	"testing"
)

// TestFCFSUnservedReleaseCountsNothing: a binding released with WithUnserved (its acquire failed after the pool
// bound it) frees its GPU but counts in no request served or on time; a plain release counts one.
func TestFCFSUnservedReleaseCountsNothing(t *testing.T) {
	ctx := context.Background()
	p := newTestPool(t, 4*gib)
	register(t, p, "a", gib)
	for _, unserved := range []bool{true, false} {
		b, err := p.Acquire(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		rctx := ctx
		if unserved {
			rctx = WithUnserved(ctx)
		}
		if err := p.Release(rctx, b.ID); err != nil {
			t.Fatal(err)
		}
		st := p.Status(ctx)
		want := int64(1)
		if unserved {
			want = 0
		}
		if f := st.Functions[0]; f.Served != want || f.OnTime != want || f.Running != 0 || st.GPUs[0].Busy {
			t.Fatalf("after a release (unserved %v): %+v %+v", unserved, f, st.GPUs[0])
		}
	}
}
