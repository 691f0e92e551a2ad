package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func smallNode(t *testing.T) topology.Node {
	t.Helper()
	n, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	n, err = n.WithGPUMemory(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPoolAcquireRelease(t *testing.T) {
	p, err := NewPool(PoolConfig{Controller: Config{Node: smallNode(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 600 << 20, SLO: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Register(ctx, pool.FunctionSpec{Name: "huge", MemoryBytes: 2 << 30}); !errors.Is(err, pool.ErrTooLarge) {
		t.Fatalf("huge: %v", err)
	}
	if err := p.Register(ctx, pool.FunctionSpec{Name: "", MemoryBytes: 1}); !errors.Is(err, pool.ErrInvalidSpec) {
		t.Fatalf("bad spec: %v", err)
	}
	b1, err := p.Acquire(ctx, "a")
	if err != nil || b1.GPU != 0 || b1.Swap != SwapPCIe {
		t.Fatalf("first acquire: %+v %v", b1, err)
	}
	// The only GPU is bound: a second acquire waits; cancelling it returns the context's error.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := p.Acquire(cctx, "b"); done <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for p.Status(ctx).Queued != 1 {
		if time.Now().After(deadline) {
			t.Fatal("second acquire never queued")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled acquire: %v", err)
	}
	// A waiting acquire of b is bound once a is released, evicting a (both do not fit).
	got := make(chan pool.Binding, 1)
	go func() {
		b, err := p.Acquire(ctx, "b")
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	for p.Status(ctx).Queued != 1 {
		if time.Now().After(deadline) {
			t.Fatal("acquire of b never queued")
		}
		time.Sleep(time.Millisecond)
	}
	if err := p.Release(ctx, b1.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, b1.ID); !errors.Is(err, pool.ErrUnknownBinding) {
		t.Fatalf("double release: %v", err)
	}
	b2 := <-got
	if b2.Function != "b" || b2.Swap != SwapPCIe {
		t.Fatalf("b binding %+v", b2)
	}
	st := p.Status(ctx)
	if st.GPUs[0].UsedBytes > st.GPUs[0].MemoryBytes || len(st.GPUs[0].Resident) != 1 || st.GPUs[0].Resident[0] != "b" {
		t.Fatalf("status %+v", st.GPUs[0])
	}
	if err := p.Release(ctx, b2.ID); err != nil {
		t.Fatal(err)
	}
	// b again: resident, no swap.
	b3, err := p.Acquire(ctx, "b")
	if err != nil || b3.Swap != SwapNone {
		t.Fatalf("resident acquire: %+v %v", b3, err)
	}
	_ = p.Release(ctx, b3.ID)
	if _, err := p.Acquire(ctx, "nope"); !errors.Is(err, pool.ErrUnknownFunction) {
		t.Fatalf("unknown: %v", err)
	}
	if err := p.Deregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := p.Deregister(ctx, "a"); !errors.Is(err, pool.ErrUnknownFunction) {
		t.Fatalf("deregister twice: %v", err)
	}
	if s := p.Status(ctx); len(s.Functions) != 1 || s.Functions[0].Served != 2 {
		t.Fatalf("functions %+v", s.Functions)
	}
}

func TestPredictorAndPolicies(t *testing.T) {
	pr := NewPredictor(10 * time.Millisecond)
	if pr.Mean() != 10*time.Millisecond {
		t.Fatal(pr.Mean())
	}
	for range 50 {
		pr.Observe(20 * time.Millisecond)
	}
	if d := pr.Mean() - 20*time.Millisecond; d < -time.Microsecond || d > time.Microsecond || pr.Tail() < pr.Mean() {
		t.Fatalf("mean %v tail %v", pr.Mean(), pr.Tail())
	}
	for _, p := range Policies() {
		if got, err := ParsePolicy(string(p)); err != nil || got != p {
			t.Fatalf("ParsePolicy(%s) = %v %v", p, got, err)
		}
	}
	if _, err := ParsePolicy("best"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := New(Config{Node: topology.Node{}}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid node accepted: %v", err)
	}
}
