package sim

import (
	"context"
	"time"
)

// Clock is the time source of the simulated node's delays.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// SleepUntil returns at t or when ctx ends (with ctx's error).
	SleepUntil(ctx context.Context, t time.Time) error
}

// WallClock is the real clock.
type WallClock struct{}

// Now is time.Now.
func (WallClock) Now() time.Time { return time.Now() }

// SleepUntil sleeps until t.
func (WallClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
