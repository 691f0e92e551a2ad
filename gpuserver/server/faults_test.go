package server

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestFaultBackoffIsExponentialAndBounded: on a virtual clock, a function is refused only after Threshold faults
// within Window (faults older than the window do not count), for Min; each fault soon after a backoff's end backs
// it off twice as long, up to Max; a window of quiet starts it over; another function is never refused for it, and
// a deregistered function's record is dropped.
func TestFaultBackoffIsExponentialAndBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newFaultBackoff(FaultBackoff{Threshold: 3, Window: time.Minute, Min: time.Second, Max: 4 * time.Second},
		func() time.Time { return now }, slog.New(slog.DiscardHandler))
	refusedFor := func() time.Duration {
		t.Helper()
		err := b.refused("bad")
		if err == nil {
			return 0
		}
		var be *pool.BackedOffError
		if !errors.As(err, &be) || !errors.Is(err, pool.ErrBackedOff) || be.Function != "bad" {
			t.Fatalf("refusal: %v", err)
		}
		return be.RetryAfter
	}
	b.fault("bad", 0, "illegal address")
	now = now.Add(2 * time.Minute) // out of the window
	b.fault("bad", 1, "illegal address")
	b.fault("bad", 2, "illegal address")
	if d := refusedFor(); d != 0 {
		t.Fatalf("refused for %v after 2 faults within the window", d)
	}
	b.fault("bad", 3, "illegal address")
	if d := refusedFor(); d != time.Second {
		t.Fatalf("after the third fault in the window: refused for %v, want 1s", d)
	}
	if b.refused("good") != nil {
		t.Fatal("another function refused")
	}
	for i, want := range []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second} {
		now = now.Add(refusedFor() + time.Millisecond) // the backoff ends, it faults at once
		if d := refusedFor(); d != 0 {
			t.Fatalf("still refused after the backoff's end: %v", d)
		}
		b.fault("bad", 0, "illegal address")
		if d := refusedFor(); d != want {
			t.Fatalf("backoff %d: refused for %v, want %v", i+2, d, want)
		}
	}
	if f, off := b.view("bad"); f != 7 || off != 4*time.Second {
		t.Fatalf("view: %d faults, backed off %v", f, off)
	}
	now = now.Add(4*time.Second + 2*time.Minute) // a window of quiet after its last backoff
	b.fault("bad", 0, "illegal address")
	if d := refusedFor(); d != 0 {
		t.Fatalf("refused for %v after one fault following a quiet window", d)
	}
	b.fault("bad", 0, "illegal address")
	b.fault("bad", 0, "illegal address")
	if d := refusedFor(); d != time.Second {
		t.Fatalf("after a quiet window and three faults: refused for %v, want 1s again", d)
	}
	b.forget("bad")
	if d := refusedFor(); d != 0 {
		t.Fatalf("a deregistered function is still refused for %v", d)
	}
}
