package device_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Wait polls a little, then blocks in the driver's synchronize even when ctx can end (a wait that polled between
// timers instead would never return here: done never reports completion), and returns block's result.
func TestWaitBlocksAfterPolling(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var polls atomic.Int64
	errDriver := errors.New("the driver's synchronize failed")
	got := make(chan error, 1)
	go func() {
		got <- device.Wait(ctx, func() (bool, error) { polls.Add(1); return false, nil },
			func() error { return errDriver })
	}()
	select {
	case err := <-got:
		if !errors.Is(err, errDriver) {
			t.Fatalf("Wait: %v, want the blocking call's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait never blocked in the driver's synchronize")
	}
	if polls.Load() == 0 {
		t.Fatal("Wait blocked without polling first")
	}
}

// A wait blocked in the driver returns ctx's error as soon as ctx ends; the blocked call goes on on its own.
func TestWaitReturnsWhenContextEndsWhileBlocked(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	blocked := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		got <- device.Wait(ctx, func() (bool, error) { return false, nil },
			func() error { close(blocked); <-release; return nil })
	}()
	<-blocked
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return when its context ended")
	}
	close(release)
}

// Completion found while polling returns at once without the driver's synchronize; done's error is returned.
func TestWaitReturnsWhatPollingFinds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	block := func() error { t.Error("blocked although polling found completion"); return nil }
	n := 0
	if err := device.Wait(ctx, func() (bool, error) { n++; return n == 3, nil }, block); err != nil {
		t.Fatal(err)
	}
	errBad := errors.New("bad")
	if err := device.Wait(ctx, func() (bool, error) { return false, errBad }, block); !errors.Is(err, errBad) {
		t.Fatalf("Wait: %v, want done's error", err)
	}
	if err := device.Wait(context.Background(), nil, func() error { return errBad }); !errors.Is(err, errBad) {
		t.Fatalf("Wait without a cancellable context: %v, want block's error", err)
	}
}
