package remoting

import (
	"context"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Copies and memsets, through the function's executor stream.

// at is where every copy and memset starts: it refuses call unless the function owns [p, p+n), then binds the
// function's stream and translates p to the device address behind it.
func (h *deviceHandler) at(ctx context.Context, call string, p, n uint64) (device.Stream, device.Ptr, Result) {
	if !h.owns(p, n) {
		return nil, 0, h.refuse(call, p, n)
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return nil, 0, r
	}
	d, err := h.translate(p)
	if err != nil {
		return nil, 0, result(err)
	}
	return s, d, ResultSuccess
}

func (h *deviceHandler) htod(ctx context.Context, call string, dst uint64, src []byte, wait bool) Result {
	s, d, r := h.at(ctx, call, dst, uint64(len(src)))
	if r != ResultSuccess {
		return r
	}
	if !wait {
		src = append([]byte(nil), src...) // the ring slot is reused once the record is consumed
	}
	if err := s.CopyHtoD(d, src); err != nil {
		return result(err)
	}
	if wait {
		return result(s.Synchronize(ctx))
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemcpyHtoD_v2(ctx context.Context, dst uint64, src []byte, _ uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyHtoD", 0, true); ok {
		return r
	}
	return h.htod(ctx, "cuMemcpyHtoD", dst, src, true)
}

func (h *deviceHandler) CuMemcpyHtoDAsync_v2(ctx context.Context, dst uint64, src []byte, _, st uint64) Result {
	if h.asyncRefused("cuMemcpyHtoDAsync", st, false) {
		return ResultSuccess
	}
	return h.htod(ctx, "cuMemcpyHtoDAsync", dst, src, false)
}

func (h *deviceHandler) MemcpyHtoDChunk(ctx context.Context, dst uint64, src []byte, _, st uint64) Result {
	if h.asyncRefused("cuMemcpyHtoDAsync", st, false) {
		return ResultSuccess
	}
	return h.htod(ctx, "cuMemcpyHtoD", dst, src, false)
}

func (h *deviceHandler) dtoh(ctx context.Context, call string, dst []byte, src uint64) Result {
	s, sp, r := h.at(ctx, call, src, uint64(len(dst)))
	if r != ResultSuccess {
		return r
	}
	if err := s.CopyDtoH(dst, sp); err != nil {
		return result(err)
	}
	return result(s.Synchronize(ctx))
}

func (h *deviceHandler) CuMemcpyDtoH_v2(ctx context.Context, dst []byte, src, _ uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyDtoH", 0, true); ok {
		return r
	}
	return h.dtoh(ctx, "cuMemcpyDtoH", dst, src)
}

func (h *deviceHandler) CuMemcpyDtoHAsync_v2(ctx context.Context, dst []byte, src, _, st uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyDtoHAsync", st, false); ok {
		return r
	}
	return h.dtoh(ctx, "cuMemcpyDtoHAsync", dst, src)
}

func (h *deviceHandler) dtod(ctx context.Context, dst, src, n uint64, wait bool) Result {
	if h.owns(dst, n) && !h.owns(src, n) { // an unowned dst is refused first, by at
		return h.refuse("cuMemcpyDtoD", src, n)
	}
	s, d, r := h.at(ctx, "cuMemcpyDtoD", dst, n)
	if r != ResultSuccess {
		return r
	}
	sp, err := h.translate(src)
	if err != nil {
		return result(err)
	}
	if err := s.CopyDtoD(d, sp, n); err != nil {
		return result(err)
	}
	if wait {
		return result(s.Synchronize(ctx))
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemcpyDtoD_v2(ctx context.Context, dst, src, n uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpyDtoD", 0, true); ok {
		return r
	}
	return h.dtod(ctx, dst, src, n, true)
}

func (h *deviceHandler) CuMemcpyDtoDAsync_v2(ctx context.Context, dst, src, n, st uint64) Result {
	if r, ok := h.captured(st, graphNode{kind: "copy", check: h.ownsCheck("cuMemcpyDtoD", dst, n, src, n),
		run: func(ctx context.Context, s uint64) Result {
			return h.CuMemcpyDtoDAsync_v2(ctx, dst, src, n, s)
		}}); ok {
		return r
	}
	return h.dtod(ctx, dst, src, n, false)
}

func (h *deviceHandler) memset(ctx context.Context, dst uint64, v uint32, n uint64, elem uint64) Result {
	if n > (1<<62)/elem { // n*elem would overflow
		return h.refuse("cuMemset", dst, n*elem)
	}
	s, d, r := h.at(ctx, "cuMemset", dst, n*elem)
	if r != ResultSuccess {
		return r
	}
	switch elem {
	case 1:
		return result(s.Memset8(d, uint8(v), n))
	case 2:
		return result(memset16(s, d, uint16(v), n))
	case 4:
		return result(s.Memset32(d, v, n))
	}
	return ResultNotSupported
}

func (h *deviceHandler) CuMemsetD8_v2(ctx context.Context, dst uint64, v uint32, n uint64) Result {
	if h.asyncRefused("cuMemsetD8", 0, true) {
		return ResultSuccess
	}
	return h.memset(ctx, dst, v, n, 1)
}

func (h *deviceHandler) CuMemsetD32_v2(ctx context.Context, dst uint64, v uint32, n uint64) Result {
	if h.asyncRefused("cuMemsetD32", 0, true) {
		return ResultSuccess
	}
	return h.memset(ctx, dst, v, n, 4)
}

// memsetAsync runs a memset on stream st, or records it when st captures.
func (h *deviceHandler) memsetAsync(ctx context.Context, dst uint64, v uint32, n, elem, st uint64) Result {
	check := func() Result { return h.refuse("cuMemset", dst, n) } // n*elem would overflow
	if n <= (1<<62)/elem {
		check = h.ownsCheck("cuMemset", dst, n*elem)
	}
	if r, ok := h.captured(st, graphNode{kind: "memset", check: check, run: func(ctx context.Context, s uint64) Result {
		return h.memsetAsync(ctx, dst, v, n, elem, s)
	}}); ok {
		return r
	}
	return h.memset(ctx, dst, v, n, elem)
}

func (h *deviceHandler) CuMemsetD8Async(ctx context.Context, dst uint64, v uint32, n, st uint64) Result {
	return h.memsetAsync(ctx, dst, v, n, 1, st)
}

func (h *deviceHandler) CuMemsetD32Async(ctx context.Context, dst uint64, v uint32, n, st uint64) Result {
	return h.memsetAsync(ctx, dst, v, n, 4, st)
}
