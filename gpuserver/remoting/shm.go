package remoting

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Linux fcntl commands and seals (not in package syscall).
const (
	fGetSeals   = 1034
	fSealShrink = 0x0002
	fSealGrow   = 0x0004
)

// sharedMemory is the client's memfd mapped into the server: control block, request ring, response area.
type sharedMemory struct {
	mem  []byte
	ring []byte
	resp []byte
}

// mapSharedMemory checks and maps the memfd a client passed. The memfd must be sealed against shrinking and
// growing (so the mapping cannot fault), its size must match the hello, and the control block must describe a
// layout inside it.
func mapSharedMemory(fd int, helloSize uint64) (*sharedMemory, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat memfd: %w", err)
	}
	seals, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), fGetSeals, 0)
	if errno != 0 {
		return nil, fmt.Errorf("memfd seals: %w", errno)
	}
	if seals&(fSealShrink|fSealGrow) != fSealShrink|fSealGrow {
		return nil, fmt.Errorf("memfd is not sealed against shrinking and growing (seals %#x)", seals)
	}
	size := uint64(st.Size)
	if size != helloSize || size < wireControlSize+2*4096 || size > 4<<30 {
		return nil, fmt.Errorf("memfd of %d bytes (hello says %d)", size, helloSize)
	}
	mem, err := syscall.Mmap(fd, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap memfd: %w", err)
	}
	le := binary.LittleEndian
	ringOff, ringSize := le.Uint64(mem[wireCtlRingOffset:]), le.Uint64(mem[wireCtlRingSize:])
	respOff, respSize := le.Uint64(mem[wireCtlRespOffset:]), le.Uint64(mem[wireCtlRespSize:])
	switch {
	case le.Uint32(mem[wireCtlMagic:]) != wireMagic:
		err = fmt.Errorf("control block magic %#x", le.Uint32(mem[wireCtlMagic:]))
	case le.Uint16(mem[wireCtlMajor:]) != wireVersionMajor:
		err = fmt.Errorf("control block version %d", le.Uint16(mem[wireCtlMajor:]))
	case le.Uint32(mem[wireCtlControlSize:]) != wireControlSize || ringOff != wireControlSize:
		err = fmt.Errorf("control block layout (control %d, ring at %d)", le.Uint32(mem[wireCtlControlSize:]), ringOff)
	case ringSize < 4096 || ringSize%8 != 0 || ringSize > size-ringOff:
		err = fmt.Errorf("ring of %d bytes", ringSize)
	case respOff != ringOff+ringSize || respSize < 4096 || respSize > size-respOff:
		err = fmt.Errorf("response area of %d bytes at %d", respSize, respOff)
	}
	if err != nil {
		_ = syscall.Munmap(mem)
		return nil, err
	}
	return &sharedMemory{mem: mem, ring: mem[ringOff : ringOff+ringSize], resp: mem[respOff : respOff+respSize]}, nil
}

func (m *sharedMemory) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&m.mem[off])) }
func (m *sharedMemory) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&m.mem[off])) }

func (m *sharedMemory) tail() uint64     { return atomic.LoadUint64(m.u64(wireCtlReqTail)) }
func (m *sharedMemory) setHead(v uint64) { atomic.StoreUint64(m.u64(wireCtlReqHead), v) }
func (m *sharedMemory) setServerWaiting(v bool) {
	var x uint32
	if v {
		x = 1
	}
	atomic.StoreUint32(m.u32(wireCtlServerWaiting), x)
}
func (m *sharedMemory) clientWaiting() bool {
	return atomic.LoadUint32(m.u32(wireCtlClientWaiting)) != 0
}

// respond publishes a response of n payload bytes already written after the response header.
func (m *sharedMemory) respond(seq uint64, r Result, n int) {
	binary.LittleEndian.PutUint64(m.resp, seq)
	binary.LittleEndian.PutUint32(m.resp[8:], uint32(r))
	binary.LittleEndian.PutUint32(m.resp[12:], uint32(n))
	atomic.StoreUint64(m.u64(wireCtlRespSeq), seq)
}

func (m *sharedMemory) unmap() error { return syscall.Munmap(m.mem) }
