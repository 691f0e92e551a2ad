package device

import (
	"context"
	"time"
)

// WallClock is the real clock, for the packages that take a clock so that tests and the simulator can drive time
// (the timed virtual GPU, the compute arbiter): Now and a sleep that ends early with its context.
type WallClock struct{}

// Now is time.Now.
func (WallClock) Now() time.Time { return time.Now() }

// SleepUntil sleeps until t, or until ctx ends (with ctx's error).
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
