package remoting

import (
	"context"
)

// Streams: every stream of a session runs in order on the function's one executor stream.

func (h *deviceHandler) CuCtxSynchronize(ctx context.Context) Result {
	if r, ok := h.refuseInCapture("cuCtxSynchronize", 0, true); ok {
		return r
	}
	return h.syncStream(ctx)
}

func (h *deviceHandler) CuStreamCreate(context.Context, uint32) (uint64, Result) {
	if len(h.streams) >= maxStreams {
		return 0, ResultOutOfMemory
	}
	id := h.handle()
	h.streams[id] = true
	return id, ResultSuccess
}

func (h *deviceHandler) CuStreamCreateWithPriority(ctx context.Context, flags uint32, _ int32) (uint64, Result) {
	return h.CuStreamCreate(ctx, flags)
}

func (h *deviceHandler) validStream(s uint64) bool { return s == 0 || s == 1 || s == 2 || h.streams[s] }

func (h *deviceHandler) CuStreamDestroy_v2(_ context.Context, s uint64) Result {
	if !h.streams[s] {
		return ResultInvalidHandle
	}
	delete(h.streams, s)
	return ResultSuccess
}

func (h *deviceHandler) CuStreamSynchronize(ctx context.Context, s uint64) Result {
	if !h.validStream(s) {
		return ResultInvalidHandle
	}
	if r, ok := h.refuseInCapture("cuStreamSynchronize", s, false); ok {
		return r
	}
	return h.syncStream(ctx)
}

func (h *deviceHandler) CuStreamQuery(ctx context.Context, s uint64) Result {
	return h.CuStreamSynchronize(ctx, s)
}

func (h *deviceHandler) CuStreamWaitEvent(_ context.Context, s, e uint64, _ uint32) Result {
	if !h.validStream(s) {
		return ResultInvalidHandle
	}
	if _, ok := h.events[e]; !ok {
		return ResultInvalidHandle
	}
	h.waitJoinsCapture(s, e)
	return ResultSuccess // every stream of the session runs in order on one device stream
}
