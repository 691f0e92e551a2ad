package remoting

import (
	"context"
	"errors"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Events, created in the function's context on the GPU they are recorded on.

type event struct {
	ev     device.Event
	gpu    int
	ctx    device.Context // the function's context on gpu it was created in
	timing bool
}

// eventDisableTiming is CU_EVENT_DISABLE_TIMING.
const eventDisableTiming = 0x2

// newEvent creates an event in the function's context on gpu.
func (h *deviceHandler) newEvent(gpu int, timing bool) (device.Event, device.Context, error) {
	dc, err := h.context(gpu)
	if err != nil {
		return nil, nil, err
	}
	var ev device.Event
	if timing {
		ev, err = dc.NewTimedEvent()
	} else {
		ev, err = dc.NewEvent()
	}
	return ev, dc, err
}

func (h *deviceHandler) CuEventCreate(ctx context.Context, flags uint32) (uint64, Result) {
	if len(h.events) >= maxEvents {
		return 0, ResultOutOfMemory
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, r
	}
	timing := flags&eventDisableTiming == 0
	ev, dc, err := h.newEvent(h.gpu, timing)
	if err != nil {
		return 0, result(err)
	}
	id := h.handle()
	h.events[id] = &event{ev: ev, gpu: h.gpu, ctx: dc, timing: timing}
	return id, ResultSuccess
}

// CuEventElapsedTime: both events must have been recorded on the GPU the function runs on (an event recorded
// before the function moved is recreated at its next record).
func (h *deviceHandler) CuEventElapsedTime(_ context.Context, start, end uint64) (float32, Result) {
	s, ok1 := h.events[start]
	e, ok2 := h.events[end]
	if !ok1 || !ok2 {
		return 0, ResultInvalidHandle
	}
	if s.gpu != e.gpu {
		return 0, ResultInvalidHandle
	}
	d, err := e.ev.Elapsed(s.ev)
	if err != nil {
		if errors.Is(err, device.ErrInvalidValue) {
			return 0, ResultInvalidHandle
		}
		return 0, result(err)
	}
	return float32(d.Seconds() * 1e3), ResultSuccess
}

func (h *deviceHandler) CuEventElapsedTime_v2(ctx context.Context, start, end uint64) (float32, Result) {
	return h.CuEventElapsedTime(ctx, start, end)
}

func (h *deviceHandler) CuEventDestroy_v2(_ context.Context, e uint64) Result {
	ev, ok := h.events[e]
	if !ok {
		return ResultInvalidHandle
	}
	delete(h.events, e)
	return result(ev.ev.Destroy())
}

func (h *deviceHandler) CuEventRecord(ctx context.Context, e, s uint64) Result {
	ev, ok := h.events[e]
	if !ok || !h.validStream(s) {
		return ResultInvalidHandle
	}
	if h.eventRecordedInCapture(e, s) {
		return ResultSuccess
	}
	st, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	if r := h.eventOnGPU(ev); r != ResultSuccess { // the function moved, or a fault replaced its context
		return r
	}
	return result(st.Record(ev.ev))
}

func (h *deviceHandler) CuEventRecordWithFlags(ctx context.Context, e, s uint64, _ uint32) Result {
	return h.CuEventRecord(ctx, e, s)
}

// waitable is event e for call, a wait on it from the host: an unknown handle, a fault of the work before it
// (found where no call answered) and an event recorded in a capture (which invalidates the capture) answer r.
func (h *deviceHandler) waitable(call string, e uint64) (ev *event, r Result) {
	ev, ok := h.events[e]
	if !ok {
		return nil, ResultInvalidHandle
	}
	if r := h.takeLost(); r != ResultSuccess {
		return nil, r
	}
	if c, ok := h.g.events[e]; ok {
		return nil, c.invalidate(ResultStreamCaptureUnsupported, "%s of an event recorded in the capture", call)
	}
	return ev, ResultSuccess
}

func (h *deviceHandler) CuEventSynchronize(ctx context.Context, e uint64) Result {
	ev, r := h.waitable("cuEventSynchronize", e)
	if r != ResultSuccess {
		return r
	}
	return result(ev.ev.Synchronize(ctx))
}

func (h *deviceHandler) CuEventQuery(_ context.Context, e uint64) Result {
	ev, r := h.waitable("cuEventQuery", e)
	if r != ResultSuccess {
		return r
	}
	done, err := ev.ev.Query()
	if err != nil {
		return result(err)
	}
	if !done {
		return ResultNotReady
	}
	return ResultSuccess
}
