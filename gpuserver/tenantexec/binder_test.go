package tenantexec

import (
	"context"
	"errors"
	"testing"
)

// TestAbandonedHoldNeverBinds: the gpuserver's abandon of a hold (handoff.Release.Abandoned) that arrives before
// its Acquire started refuses that Acquire when it comes; one that arrives while the Acquire runs cancels its
// context, and its completion is refused (what it held is released, never added to the bindings).
func TestAbandonedHoldNeverBinds(t *testing.T) {
	ctx := context.Background()
	b := newBinder(&process{})

	b.abandon("early") // dispatched before its Acquire
	if _, err := b.begin(ctx, "early"); !errors.Is(err, errAbandoned) {
		t.Fatalf("the acquire of a binding abandoned before it started: %v", err)
	}
	if len(b.abandoned) != 0 {
		t.Fatalf("the abandon is kept after its acquire came: %v", b.abandoned)
	}

	hctx, err := b.begin(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.begin(ctx, "late"); err == nil {
		t.Fatal("a second acquire of a binding in flight was accepted")
	}
	b.abandon("late") // while the Acquire runs
	if hctx.Err() == nil {
		t.Fatal("the abandon did not cancel the acquire in flight")
	}
	if err := b.finish("late", true, nil); !errors.Is(err, errAbandoned) {
		t.Fatalf("the completion of an abandoned acquire: %v", err)
	}
	if _, ok := b.CurrentGPU("f"); ok || len(b.holding) != 0 || len(b.abandoned) != 0 {
		t.Fatalf("left after the abandon: holding %v, abandoned %v", b.holding, b.abandoned)
	}

	// An acquire that was not abandoned completes; its (failed) hold binds nothing.
	if _, err := b.begin(ctx, "plain"); err != nil {
		t.Fatal(err)
	}
	if err := b.finish("plain", true, nil); err != nil {
		t.Fatal(err)
	}
}
