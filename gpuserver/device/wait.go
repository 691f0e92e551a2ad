package device

import (
	"context"
	"time"
)

// Wait is how a backend waits for asynchronous work (a stream's or an event's) to complete: it returns nil once
// done reports completion, done's error, or ctx's error when ctx ends first. Without a deadline or cancel on ctx it
// blocks in block (the driver's own synchronize). With one, it polls done between timers of 1 us doubling up to
// 1 ms.
//
// The cuda backend waits for the driver with it, and the sim backend's timed mode waits for its modelled GPU with
// it, so that a benchmark on the simulated GPU pays what the real backend's wait costs.
func Wait(ctx context.Context, done func() (bool, error), block func() error) error {
	if ctx.Done() == nil {
		return block()
	}
	for d := time.Microsecond; ; d = min(2*d, time.Millisecond) {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
