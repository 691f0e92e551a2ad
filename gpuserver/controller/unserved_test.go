package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// failingSwap is an actuator whose swaps fail.
type failingSwap struct{}

var errSwap = errors.New("swap failed")

func (failingSwap) SwapIn(context.Context, string, int, Source) error { return errSwap }
func (failingSwap) Evict(context.Context, string, int) error          { return nil }

// TestFailedAcquiresCountAsNoneServed: an acquire whose swap fails after the controller bound it, and a binding
// released with pool.WithUnserved (its data plane hold failed or its caller gave up), free the GPU and count in no
// request served or on time; a plain request counts one.
func TestFailedAcquiresCountAsNoneServed(t *testing.T) {
	ctx := context.Background()
	served := func(p *Pool) pool.FunctionStatus {
		t.Helper()
		st := p.Status(ctx)
		for _, g := range st.GPUs {
			if g.Busy {
				t.Fatalf("gpu %d busy: %+v", g.Index, g)
			}
		}
		return st.Functions[0]
	}
	p, err := NewPool(PoolConfig{Controller: Config{Node: smallNode(t)}, Actuator: failingSwap{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(ctx, pool.FunctionSpec{Name: "a", MemoryBytes: 600 << 20, SLO: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Acquire(ctx, "a"); !errors.Is(err, errSwap) {
		t.Fatalf("acquire whose swap fails: %v", err)
	}
	if f := served(p); f.Served != 0 || f.OnTime != 0 {
		t.Fatalf("after an acquire whose swap failed: %+v", f)
	}

	p, err = NewPool(PoolConfig{Controller: Config{Node: smallNode(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(ctx, pool.FunctionSpec{Name: "a", MemoryBytes: 600 << 20, SLO: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for i, unserved := range []bool{true, false} {
		b, err := p.Acquire(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		rctx := ctx
		if unserved {
			rctx = pool.WithUnserved(ctx)
		}
		if err := p.Release(rctx, b.ID); err != nil {
			t.Fatal(err)
		}
		if f := served(p); f.Served != int64(i) || f.OnTime != int64(i) {
			t.Fatalf("after release %d (unserved %v): %+v", i, unserved, f)
		}
	}
}
