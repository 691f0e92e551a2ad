package cuda

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

type event struct {
	ctx      cu.Context
	e        cu.Event
	timing   bool
	recorded atomic.Bool
}

// NewEvent creates an event without timing on a GPU.
func (b *Backend) NewEvent(i int) (device.Event, error) { return b.newEvent(i, false) }

// NewTimedEvent creates an event with timing on a GPU.
func (b *Backend) NewTimedEvent(i int) (device.Event, error) { return b.newEvent(i, true) }

func (b *Backend) newEvent(i int, timing bool) (device.Event, error) {
	g, err := b.gpu(i)
	if err != nil {
		return nil, err
	}
	e, err := cu.EventCreate(g.ctx, timing)
	if err != nil {
		return nil, wrap(err)
	}
	return &event{ctx: g.ctx, e: e, timing: timing}, nil
}

// Elapsed is the time between start's completion and e's (cuEventElapsedTime).
func (e *event) Elapsed(start device.Event) (time.Duration, error) {
	s, ok := start.(*event)
	if !ok || !s.timing || !e.timing || s.ctx != e.ctx {
		return 0, fmt.Errorf("%w: elapsed time needs two timing events of one GPU", device.ErrInvalidValue)
	}
	ms, err := cu.EventElapsed(e.ctx, s.e, e.e)
	if err != nil {
		return 0, wrap(err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

func (e *event) Query() (bool, error) {
	ok, err := cu.EventQuery(e.ctx, e.e)
	return ok, wrap(err)
}

func (e *event) Synchronize(ctx context.Context) error {
	return wait(ctx, func() (bool, error) { return cu.EventQuery(e.ctx, e.e) },
		func() error { return cu.EventSynchronize(e.ctx, e.e) })
}

func (e *event) Destroy() error { return wrap(cu.EventDestroy(e.ctx, e.e)) }
