package remoting

import (
	"context"
	"encoding/binary"
	"math/bits"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Pitched copies and memsets (cuMemcpy2D/3D, cuMemsetD2D*), stream memory operations and 16-bit memsets. Every
// row, value and memset is checked against the session's own memory first.

// extent is the bytes a pitched region of height rows of width bytes spans from its start; ok is false when it
// overflows or width exceeds pitch.
func extent(pitch, width, height uint64) (uint64, bool) {
	if height == 0 || width == 0 {
		return 0, true
	}
	if height > 1 && width > pitch {
		return 0, false
	}
	hi, lo := bits.Mul64(pitch, height-1)
	if hi != 0 || lo+width < lo {
		return 0, false
	}
	return lo + width, true
}

func (h *deviceHandler) ownsPitched(call string, p, pitch, width, height uint64) Result {
	n, ok := extent(pitch, width, height)
	if !ok || !h.owns(p, n) {
		return h.refuse(call, p, n)
	}
	return ResultSuccess
}

func (h *deviceHandler) Memcpy2DHtoD(ctx context.Context, dst, dstPitch, width, height uint64, src []byte, _, st uint64) Result {
	if h.asyncRefused("cuMemcpy2DAsync from host", st, false) {
		return ResultSuccess
	}
	if hi, lo := bits.Mul64(width, height); hi != 0 || lo != uint64(len(src)) {
		return ResultInvalidValue
	}
	if r := h.ownsPitched("cuMemcpy2D", dst, dstPitch, width, height); r != ResultSuccess {
		return r
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	src = append([]byte(nil), src...) // the ring slot is reused once the record is consumed
	for i := uint64(0); i < height; i++ {
		d, err := h.translate(dst + i*dstPitch)
		if err != nil {
			return result(err)
		}
		if err := s.CopyHtoD(d, src[i*width:(i+1)*width]); err != nil {
			return result(err)
		}
	}
	return ResultSuccess
}

func (h *deviceHandler) Memcpy2DDtoH(ctx context.Context, dst []byte, src, srcPitch, width, height, _, st uint64) Result {
	if r, ok := h.refuseInCapture("cuMemcpy2DAsync to host", st, st == 0 || st == 1); ok {
		return r
	}
	if hi, lo := bits.Mul64(width, height); hi != 0 || lo != uint64(len(dst)) {
		return ResultInvalidValue
	}
	if r := h.ownsPitched("cuMemcpy2D", src, srcPitch, width, height); r != ResultSuccess {
		return r
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	for i := uint64(0); i < height; i++ {
		p, err := h.translate(src + i*srcPitch)
		if err != nil {
			return result(err)
		}
		if err := s.CopyDtoH(dst[i*width:(i+1)*width], p); err != nil {
			return result(err)
		}
	}
	return result(s.Synchronize(ctx))
}

func (h *deviceHandler) Memcpy2DDtoD(ctx context.Context, dst, dstPitch, src, srcPitch, width, height, st uint64) Result {
	check := func() Result {
		if r := h.ownsPitched("cuMemcpy2D", dst, dstPitch, width, height); r != ResultSuccess {
			return r
		}
		return h.ownsPitched("cuMemcpy2D", src, srcPitch, width, height)
	}
	if r, ok := h.captured(st, graphNode{kind: "copy2d", check: check, run: func(ctx context.Context, s uint64) Result {
		return h.Memcpy2DDtoD(ctx, dst, dstPitch, src, srcPitch, width, height, s)
	}}); ok {
		return r
	}
	if r := h.ownsPitched("cuMemcpy2D", dst, dstPitch, width, height); r != ResultSuccess {
		return r
	}
	if r := h.ownsPitched("cuMemcpy2D", src, srcPitch, width, height); r != ResultSuccess {
		return r
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	for i := uint64(0); i < height; i++ {
		d, err := h.translate(dst + i*dstPitch)
		if err != nil {
			return result(err)
		}
		p, err := h.translate(src + i*srcPitch)
		if err != nil {
			return result(err)
		}
		if err := s.CopyDtoD(d, p, width); err != nil {
			return result(err)
		}
	}
	return ResultSuccess
}

func (h *deviceHandler) Memset2D(ctx context.Context, dst, pitch uint64, value, elem uint32, width, height, st uint64) Result {
	check := func() Result {
		if elem != 1 && elem != 2 && elem != 4 || width > (1<<62)/uint64(elem) {
			return ResultInvalidValue
		}
		return h.ownsPitched("cuMemsetD2D", dst, pitch, width*uint64(elem), height)
	}
	if r, ok := h.captured(st, graphNode{kind: "memset2d", check: check, run: func(ctx context.Context, s uint64) Result {
		return h.Memset2D(ctx, dst, pitch, value, elem, width, height, s)
	}}); ok {
		return r
	}
	if elem != 1 && elem != 2 && elem != 4 || width > (1<<62)/uint64(elem) {
		return ResultInvalidValue
	}
	if r := h.ownsPitched("cuMemsetD2D", dst, pitch, width*uint64(elem), height); r != ResultSuccess {
		return r
	}
	for i := uint64(0); i < height; i++ {
		if r := h.memset(ctx, dst+i*pitch, value, width, uint64(elem)); r != ResultSuccess {
			return r
		}
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemsetD16_v2(ctx context.Context, dst uint64, v uint32, n uint64) Result {
	if h.asyncRefused("cuMemsetD16", 0, true) {
		return ResultSuccess
	}
	return h.memset(ctx, dst, v, n, 2)
}

func (h *deviceHandler) CuMemsetD16Async(ctx context.Context, dst uint64, v uint32, n, st uint64) Result {
	return h.memsetAsync(ctx, dst, v, n, 2, st)
}

// memset16 sets n 16-bit values: as 32-bit words when aligned, else by copying the pattern.
func memset16(s device.Stream, dst device.Ptr, v uint16, n uint64) error {
	if dst%4 == 0 && n%2 == 0 {
		return s.Memset32(dst, uint32(v)|uint32(v)<<16, n/2)
	}
	const chunk = 1 << 19 // values per copy
	buf := make([]byte, 2*min(n, chunk))
	for i := 0; i < len(buf); i += 2 {
		binary.LittleEndian.PutUint16(buf[i:], v)
	}
	for n > 0 {
		c := min(n, chunk)
		if err := s.CopyHtoD(dst, buf[:2*c]); err != nil {
			return err
		}
		dst += device.Ptr(2 * c)
		n -= c
	}
	return nil
}

// --- stream memory operations

// CU_STREAM_WAIT_VALUE_* conditions (the low bits of the flags).
const (
	waitGEQ = 0
	waitEQ  = 1
	waitAND = 2
	waitNOR = 3
)

func (h *deviceHandler) StreamWriteValue(ctx context.Context, st, addr, value uint64, size, _ uint32) Result {
	if !h.validStream(st) {
		return ResultInvalidHandle
	}
	if h.asyncRefused("cuStreamWriteValue", st, false) {
		return ResultSuccess
	}
	if size != 4 && size != 8 || addr%uint64(size) != 0 {
		return ResultInvalidValue
	}
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, value)
	return h.htod(ctx, "cuStreamWriteValue", addr, b[:size], false)
}

// StreamWaitValue checks the value once the stream's earlier work has completed: the session's streams run in
// order on one device stream, so no later work can change it, and a condition that does not hold then never
// will (CUDA_ERROR_ILLEGAL_STATE instead of a hang).
func (h *deviceHandler) StreamWaitValue(ctx context.Context, st, addr, value uint64, size, flags uint32) Result {
	if !h.validStream(st) {
		return ResultInvalidHandle
	}
	if r, ok := h.refuseInCapture("cuStreamWaitValue", st, false); ok {
		return r
	}
	if size != 4 && size != 8 || addr%uint64(size) != 0 {
		return ResultInvalidValue
	}
	b := make([]byte, size)
	if r := h.dtoh(ctx, "cuStreamWaitValue", b, addr); r != ResultSuccess {
		return r
	}
	var v uint64
	if size == 4 {
		v = uint64(binary.LittleEndian.Uint32(b))
		value = uint64(uint32(value))
	} else {
		v = binary.LittleEndian.Uint64(b)
	}
	var ok bool
	switch flags & 0x3 {
	case waitGEQ:
		ok = int64(v-value) >= 0 // the driver compares cyclically
		if size == 4 {
			ok = int32(uint32(v)-uint32(value)) >= 0
		}
	case waitEQ:
		ok = v == value
	case waitAND:
		ok = v&value != 0
	case waitNOR:
		mask := ^uint64(0)
		if size == 4 {
			mask = 1<<32 - 1
		}
		ok = ^(v|value)&mask != 0
	}
	if !ok {
		h.log.Warn("remoting: stream wait on a value no later work can change", "ptr", addr, "value", value,
			"found", v, "flags", flags)
		return ResultIllegalState
	}
	return ResultSuccess
}
