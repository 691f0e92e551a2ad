package remoting

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// CallID identifies a remoted call on the wire (shim/api/cuda.api).
type CallID uint16

// String is the call's CUDA name.
func (id CallID) String() string {
	if c, ok := calls[id]; ok {
		return c.name
	}
	return fmt.Sprintf("call(%d)", uint16(id))
}

// callInfo is what the server knows of a call id.
type callInfo struct {
	name      string
	sync      bool // the shim waits for the result
	syncpoint bool // reports the first pending error of an earlier async call
}

// Result is a CUDA driver result code (CUresult).
type Result int32

// CUDA results the server produces.
const (
	ResultSuccess        Result = 0
	ResultInvalidValue   Result = 1
	ResultOutOfMemory    Result = 2
	ResultNotInitialized Result = 3
	// ResultDeviceUnavailable (CUDA_ERROR_DEVICE_UNAVAILABLE): the GPU the request was bound to failed.
	ResultDeviceUnavailable Result = 46
	ResultInvalidDevice     Result = 101
	ResultInvalidImage      Result = 200
	ResultInvalidContext    Result = 201
	// ResultContextIsDestroyed (CUDA_ERROR_CONTEXT_IS_DESTROYED): the function's memory is gone (a fault during its
	// initialisation); its process must start again.
	ResultContextIsDestroyed Result = 709
	ResultNoBinaryForGPU     Result = 209
	ResultInvalidHandle      Result = 400
	ResultNotFound           Result = 500
	ResultNotReady           Result = 600
	ResultIllegalAddress     Result = 700
	ResultLaunchFailed       Result = 719
	ResultNotPermitted       Result = 800
	ResultNotSupported       Result = 801
	ResultSystemNotReady     Result = 802
	ResultUnknown            Result = 999
	ResultIllegalState       Result = 401
	// ResultKernelNotSimulated is faas-gpu's own, never a CUDA result: a launch of a kernel the simulated node
	// cannot compute (device.ErrKernelNotSimulated). The shim hands its function CUDA_ERROR_NOT_SUPPORTED in its
	// place and counts it (faas_gpu_kernels_not_simulated), so that the gpu-python template answers 501 naming
	// --sim-kernels=dry instead of the handler's exception.
	ResultKernelNotSimulated Result = 0x46470001
)

// Errors of the protocol.
var (
	// ErrProtocol: a malformed hello or record; the session ends.
	ErrProtocol = errors.New("remoting protocol error")
	// ErrVersion: the client speaks a protocol version the server does not.
	ErrVersion = errors.New("remoting protocol version not supported")
	// ErrIdentity: the hello names an unknown function or carries the wrong token.
	ErrIdentity = errors.New("function identity not accepted")
	// ErrLimit: the function has as many sessions open as it may (Config.MaxSessionsPerFunction).
	ErrLimit = errors.New("remoting session limit reached")
)

func errUnknownCall(id CallID) error {
	return fmt.Errorf("%w: unknown call id %d", ErrProtocol, uint16(id))
}

// decoder reads the payload of one record: scalars are 8 bytes little-endian, bytes are a u64 length and the data
// padded to 8 bytes. The first error sticks.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b)-d.off < 8 {
		d.err = fmt.Errorf("%w: payload ends at byte %d, scalar expected", ErrProtocol, d.off)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v
}

func (d *decoder) bytes() []byte {
	n := d.u64()
	if d.err != nil {
		return nil
	}
	rest := uint64(len(d.b) - d.off)
	if n > rest || pad8(n) > rest { // n <= rest < 2^63 before pad8: it cannot wrap
		d.err = fmt.Errorf("%w: %d bytes announced at byte %d, %d left", ErrProtocol, n, d.off-8, rest)
		return nil
	}
	v := d.b[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(pad8(n))
	return v
}

// finish reports the first decoding error, or trailing bytes.
func (d *decoder) finish(id CallID) error {
	if d.err != nil {
		return fmt.Errorf("%s: %w", id, d.err)
	}
	if d.off != len(d.b) {
		return fmt.Errorf("%w: %s: %d trailing bytes", ErrProtocol, id, len(d.b)-d.off)
	}
	return nil
}

func pad8(n uint64) uint64 { return (n + 7) &^ 7 }

// respWriter writes the out arguments of a response into the response area.
type respWriter struct {
	b   []byte
	off int
}

// slot reserves 8 bytes for a scalar out argument (filled by put); -1 if the area is full.
func (w *respWriter) slot() int {
	if len(w.b)-w.off < 8 {
		return -1
	}
	w.off += 8
	return w.off - 8
}

func (w *respWriter) put(slot int, v uint64) {
	if slot >= 0 {
		binary.LittleEndian.PutUint64(w.b[slot:], v)
	}
}

// reserve returns room for n bytes of out data (preceded by its length), or false if the area is too small. n
// comes from the wire: it is compared with the room left before any arithmetic on it, so a length near 2^64
// (whose padded size would wrap to 0) is refused like any other that does not fit.
func (w *respWriter) reserve(n uint64) ([]byte, bool) {
	room := uint64(len(w.b) - w.off)
	if room < 8 || n > room-8 || pad8(n) > room-8 {
		return nil, false
	}
	binary.LittleEndian.PutUint64(w.b[w.off:], n)
	w.off += 8
	v := w.b[w.off : w.off+int(n) : w.off+int(n)]
	clear(w.b[w.off : w.off+int(pad8(n))])
	w.off += int(pad8(n))
	return v, true
}

// recordHeader is the fixed start of every record in the ring.
type recordHeader struct {
	size  uint32
	id    CallID
	flags uint16
	seq   uint64
}

func parseRecordHeader(b []byte) recordHeader {
	return recordHeader{
		size:  binary.LittleEndian.Uint32(b),
		id:    CallID(binary.LittleEndian.Uint16(b[4:])),
		flags: binary.LittleEndian.Uint16(b[6:]),
		seq:   binary.LittleEndian.Uint64(b[8:]),
	}
}

// DecodeRecord checks one complete record (header and payload, as in the ring) and dispatches it to h; resp
// receives the out arguments. It returns the call's result, or an error for a malformed record. It is the fuzz
// target's entry point and the heart of a session's loop.
func DecodeRecord(ctx context.Context, h Handler, rec []byte, resp []byte) (CallID, Result, int, error) {
	if len(rec) < wireRecordHeaderSize {
		return 0, 0, 0, fmt.Errorf("%w: record of %d bytes", ErrProtocol, len(rec))
	}
	hdr := parseRecordHeader(rec)
	if int(hdr.size) != len(rec) || hdr.size%8 != 0 {
		return hdr.id, 0, 0, fmt.Errorf("%w: record size %d in a %d-byte slot", ErrProtocol, hdr.size, len(rec))
	}
	if _, ok := calls[hdr.id]; !ok {
		return hdr.id, 0, 0, errUnknownCall(hdr.id)
	}
	w := respWriter{b: resp}
	r, err := dispatch(ctx, h, hdr.id, rec[wireRecordHeaderSize:], &w)
	return hdr.id, r, w.off, err
}
