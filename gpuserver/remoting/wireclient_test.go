package remoting

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// wireClient speaks the shim's side of the transport from Go, so that tests can send records the C shim never
// would (crafted sizes, unknown calls) and watch how the server answers. It writes one record at a time into the
// ring and polls for the response.
type wireClient struct {
	conn  *net.UnixConn
	mem   []byte
	ring  []byte
	resp  []byte
	tail  uint64
	seq   uint64
	reply []byte
}

const (
	testRingSize = 1 << 20
	testRespSize = 1 << 19
)

// newSharedMemory creates a sealed memfd laid out as the shim lays it out (control block, ring, response area).
func newSharedMemory(t testing.TB) (fd int, mem []byte) {
	t.Helper()
	size := wireControlSize + testRingSize + testRespSize
	fd, err := unix.MemfdCreate("faas-gpu-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	le.PutUint32(mem[wireCtlMagic:], wireMagic)
	le.PutUint16(mem[wireCtlMajor:], wireVersionMajor)
	le.PutUint16(mem[wireCtlMinor:], wireVersionMinor)
	le.PutUint32(mem[wireCtlControlSize:], wireControlSize)
	le.PutUint64(mem[wireCtlRingOffset:], wireControlSize)
	le.PutUint64(mem[wireCtlRingSize:], testRingSize)
	le.PutUint64(mem[wireCtlRespOffset:], wireControlSize+testRingSize)
	le.PutUint64(mem[wireCtlRespSize:], testRespSize)
	return fd, mem
}

// helloBytes is a hello of the current version for function fn with token.
func helloBytes(fn, token string, shmSize uint64) []byte {
	b := make([]byte, wireHelloSize)
	le := binary.LittleEndian
	le.PutUint32(b, wireMagic)
	le.PutUint16(b[4:], wireVersionMajor)
	le.PutUint16(b[6:], wireVersionMinor)
	le.PutUint32(b[wireHelloPid:], uint32(syscall.Getpid()))
	le.PutUint64(b[wireHelloShmSize:], shmSize)
	copy(b[wireHelloFunction:wireHelloFunction+wireNameMax-1], fn)
	copy(b[wireHelloToken:wireHelloToken+wireNameMax-1], token)
	return b
}

// dialWire connects as function fn with token and completes the hello. It returns the client, or the server's
// refusal (status and message) as an error.
func dialWire(t testing.TB, sock, fn, token string) (*wireClient, error) {
	t.Helper()
	fd, mem := newSharedMemory(t)
	defer unix.Close(fd)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	if _, _, err := c.WriteMsgUnix(helloBytes(fn, token, uint64(len(mem))), unix.UnixRights(fd), nil); err != nil {
		_ = unix.Munmap(mem)
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	reply := make([]byte, wireReplySize)
	if _, err := io.ReadFull(c, reply); err != nil {
		_ = unix.Munmap(mem)
		c.Close()
		return nil, fmt.Errorf("hello reply: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	if st := int32(binary.LittleEndian.Uint32(reply[wireReplyStatus:])); st != wireStatusOK {
		_ = unix.Munmap(mem)
		c.Close()
		return nil, fmt.Errorf("refused with status %d: %s", st, cstring(reply[wireReplyMessage:]))
	}
	w := &wireClient{conn: c, mem: mem, ring: mem[wireControlSize : wireControlSize+testRingSize],
		resp: mem[wireControlSize+testRingSize:], reply: reply}
	t.Cleanup(w.close)
	return w, nil
}

func (w *wireClient) close() {
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
		_ = unix.Munmap(w.mem)
	}
}

func (w *wireClient) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&w.mem[off])) }

// record encodes a record: scalars are 8 bytes, []byte a length and the data padded to 8.
func record(id CallID, flags uint16, seq uint64, args ...any) []byte {
	var payload []byte
	for _, a := range args {
		switch v := a.(type) {
		case uint64:
			payload = binary.LittleEndian.AppendUint64(payload, v)
		case int:
			payload = binary.LittleEndian.AppendUint64(payload, uint64(v))
		case []byte:
			payload = binary.LittleEndian.AppendUint64(payload, uint64(len(v)))
			payload = append(payload, v...)
			for len(payload)%8 != 0 {
				payload = append(payload, 0)
			}
		case string: // as the shim sends names: without their NUL
			b := []byte(v)
			payload = binary.LittleEndian.AppendUint64(payload, uint64(len(b)))
			payload = append(payload, b...)
			for len(payload)%8 != 0 {
				payload = append(payload, 0)
			}
		default:
			panic(fmt.Sprintf("record: argument of type %T", a))
		}
	}
	rec := make([]byte, wireRecordHeaderSize, wireRecordHeaderSize+len(payload))
	binary.LittleEndian.PutUint32(rec, uint32(wireRecordHeaderSize+len(payload)))
	binary.LittleEndian.PutUint16(rec[4:], uint16(id))
	binary.LittleEndian.PutUint16(rec[6:], flags)
	binary.LittleEndian.PutUint64(rec[8:], seq)
	return append(rec, payload...)
}

// errNoAnswer: the server closed the session instead of answering.
var errNoAnswer = errors.New("the server closed the session without answering")

// call sends one synchronous call and returns its result and response payload.
func (w *wireClient) call(id CallID, args ...any) (Result, []byte, error) {
	w.seq++
	return w.send(record(id, wireRecordFlagSync, w.seq, args...), true)
}

// room waits until n more bytes fit in the ring (the server consumed enough).
func (w *wireClient) room(n uint64) error {
	deadline := time.Now().Add(60 * time.Second)
	for w.tail+n-atomic.LoadUint64(w.u64(wireCtlReqHead)) > testRingSize {
		if time.Now().After(deadline) {
			return errors.New("wire client: the server never made room in the ring")
		}
		if w.closedByServer() {
			return errNoAnswer
		}
	}
	return nil
}

// send writes a raw record into the ring (a padding record first when it does not fit before the ring's end),
// publishes it, rings the doorbell and, when wait is set, polls for the response to the record's seq (or the
// session's end).
func (w *wireClient) send(rec []byte, wait bool) (Result, []byte, error) {
	if uint64(len(rec)) > testRingSize/2 {
		return 0, nil, errors.New("wire client: record larger than half the ring")
	}
	if pos := w.tail % testRingSize; pos+uint64(len(rec)) > testRingSize {
		pad := testRingSize - pos
		if err := w.room(pad); err != nil {
			return 0, nil, err
		}
		binary.LittleEndian.PutUint32(w.ring[pos:], uint32(pad))
		binary.LittleEndian.PutUint16(w.ring[pos+4:], wireRecordPadID)
		w.tail += pad
	}
	if err := w.room(uint64(len(rec))); err != nil {
		return 0, nil, err
	}
	copy(w.ring[w.tail%testRingSize:], rec)
	w.tail += uint64(len(rec))
	atomic.StoreUint64(w.u64(wireCtlReqTail), w.tail)
	if _, err := w.conn.Write([]byte{1}); err != nil {
		return 0, nil, fmt.Errorf("%w: doorbell: %w", errNoAnswer, err)
	}
	if !wait {
		return 0, nil, nil
	}
	seq := binary.LittleEndian.Uint64(rec[8:])
	deadline := time.Now().Add(60 * time.Second)
	for atomic.LoadUint64(w.u64(wireCtlRespSeq)) != seq {
		if time.Now().After(deadline) {
			return 0, nil, errors.New("wire client: no response within 60s")
		}
		if w.closedByServer() {
			return 0, nil, errNoAnswer
		}
	}
	r := Result(int32(binary.LittleEndian.Uint32(w.resp[8:])))
	n := binary.LittleEndian.Uint32(w.resp[12:])
	return r, append([]byte(nil), w.resp[wireResponseHeaderSize:wireResponseHeaderSize+n]...), nil
}

// closedByServer waits up to a millisecond for the server to hang up.
func (w *wireClient) closedByServer() bool {
	_ = w.conn.SetReadDeadline(time.Now().Add(time.Millisecond))
	defer w.conn.SetReadDeadline(time.Time{})
	var b [64]byte
	_, err := w.conn.Read(b[:])
	return err != nil && !errors.Is(err, syscall.EAGAIN) && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
