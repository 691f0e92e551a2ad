package device

import (
	"context"
	"runtime"
	"time"
)

// WaitSpin is how long Wait polls before it blocks.
const WaitSpin = 100 * time.Microsecond

// Wait is how a backend waits for asynchronous work (a stream's or an event's) to complete: it returns nil once
// done reports completion, done's error, or ctx's error when ctx ends first. It polls done for WaitSpin, yielding
// the processor between polls, then blocks in block (the driver's own synchronize) on a goroutine of its own, so
// that ctx's end returns at once (the blocked call then finishes in the background and its result is dropped).
// Without a deadline or cancel on ctx it blocks in block at once. It uses no timer: Go's timers below a
// millisecond fire after about one, which a synchronize would pay.
//
// The cuda backend waits for the driver with it, and the sim backend's timed mode waits for its modelled GPU with
// it, so that a benchmark on the simulated GPU pays what the real backend's wait costs.
func Wait(ctx context.Context, done func() (bool, error), block func() error) error {
	if ctx.Done() == nil {
		return block()
	}
	deadline := time.Now().Add(WaitSpin)
	for i := 0; ; i++ {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i%8 == 7 && time.Now().After(deadline) {
			break
		}
		runtime.Gosched()
	}
	ch := make(chan error, 1)
	go func() { ch <- block() }()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
