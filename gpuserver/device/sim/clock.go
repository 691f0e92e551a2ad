package sim

import (
	"context"
	"runtime"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Clock is the time source of the simulated node's delays.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// SleepUntil returns at t or when ctx ends (with ctx's error).
	SleepUntil(ctx context.Context, t time.Time) error
}

// WallClock is the real clock (device.WallClock).
type WallClock = device.WallClock

// timerSlack is how late a Go timer may fire (timers below a millisecond fire after about one): sleepPrecisely
// sleeps on a timer until this long before its deadline and polls the clock for the rest.
const timerSlack = 1500 * time.Microsecond

// sleepPrecisely returns at t (within the scheduler's latency) or when ctx ends, spinning for at most timerSlack.
func sleepPrecisely(ctx context.Context, t time.Time) error {
	if d := time.Until(t) - timerSlack; d > 0 {
		if err := (WallClock{}).SleepUntil(ctx, time.Now().Add(d)); err != nil {
			return err
		}
	}
	for time.Now().Before(t) {
		if err := ctx.Err(); err != nil {
			return err
		}
		runtime.Gosched()
	}
	return nil
}
