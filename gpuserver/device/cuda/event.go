package cuda

import (
	"context"
	"sync/atomic"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

type event struct {
	ctx      cu.Context
	e        cu.Event
	recorded atomic.Bool
}

// NewEvent creates an event without timing on a GPU.
func (b *Backend) NewEvent(i int) (device.Event, error) {
	g, err := b.gpu(i)
	if err != nil {
		return nil, err
	}
	e, err := cu.EventCreate(g.ctx)
	if err != nil {
		return nil, wrap(err)
	}
	return &event{ctx: g.ctx, e: e}, nil
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
