// Package handoff is everything that crosses between the gpuserver and a tenant executor process
// (docs/tenants.md): one control socket (an AF_UNIX SOCK_SEQPACKET socketpair, the executor's fd 3) carrying
// frames, each a fixed header, a JSON body and the descriptors passed with it (SCM_RIGHTS). Each hand-off has a
// file of its own: start.go (the executor's configuration), session.go (an authenticated remoting connection),
// chunks.go (physical chunks lent by descriptor), control.go (bindings, swaps, evictions, status). ops.go is the one
// table of the operations: each kind paired with its request and answer types (Op, Event), whose Call and Handle
// are the two ends. frame.go is the framing and peer.go the request/reply machinery both sides share;
// handoff_test.go pins the layout.
package handoff

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The frame header: 24 bytes, little endian.
//
//	offset  size  field
//	0       4     magic   "FGTN" (0x4e544746)
//	4       2     major   incompatible changes: a peer of another major is refused
//	6       2     minor   compatible additions
//	8       2     kind    what the body is (Kind)
//	10      2     flags   FlagReply, FlagError
//	12      4     length  of the JSON body that follows the header
//	16      8     id      a request's id; a reply carries its request's id; 0 for a one-way frame
const (
	Magic        uint32 = 0x4e544746
	VersionMajor uint16 = 1
	VersionMinor uint16 = 5
	HeaderSize          = 24
	// MaxBody bounds a frame's JSON body (a datagram of the socket must hold a whole frame on every Linux: the
	// default socket buffer is about 208 KiB).
	MaxBody = 128 << 10
	// MaxFiles bounds the descriptors of one frame (the kernel's SCM_MAX_FD is 253).
	MaxFiles = 250
)

// Flags of a frame.
const (
	FlagReply uint16 = 1 << 0 // an answer to the request with the same id
	FlagError uint16 = 1 << 1 // a reply whose body is an Error
)

// Kind says what a frame's body is. The kinds are numbered per hand-off (start 1-9, session 10-19, chunks 20-29,
// control 30-59); a number is never reused for another meaning. A kind added in a minor version is answered by an
// older peer with an error frame (no handler), which the caller treats as that peer lacking it.
type Kind uint16

// Frame is one message.
type Frame struct {
	Kind  Kind
	Flags uint16
	ID    uint64
	Body  []byte
	// Files are the descriptors that came with the frame; the receiver owns (and closes) them.
	Files []*os.File
}

// ErrProtocol is wrapped by every refusal of a malformed frame.
var ErrProtocol = errors.New("tenant hand-off protocol")

// header encodes a frame's header.
func header(kind Kind, flags uint16, id uint64, bodyLen int) []byte {
	h := make([]byte, HeaderSize, HeaderSize+bodyLen)
	le := binary.LittleEndian
	le.PutUint32(h[0:], Magic)
	le.PutUint16(h[4:], VersionMajor)
	le.PutUint16(h[6:], VersionMinor)
	le.PutUint16(h[8:], uint16(kind))
	le.PutUint16(h[10:], flags)
	le.PutUint32(h[12:], uint32(bodyLen))
	le.PutUint64(h[16:], id)
	return h
}

// Encode lays a frame out as it travels (header and body; descriptors travel beside it).
func Encode(kind Kind, flags uint16, id uint64, body any) ([]byte, error) {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("%w: encode %v: %w", ErrProtocol, kind, err)
		}
	}
	if len(raw) > MaxBody {
		return nil, fmt.Errorf("%w: %v body of %d bytes exceeds %d", ErrProtocol, kind, len(raw), MaxBody)
	}
	return append(header(kind, flags, id, len(raw)), raw...), nil
}

// Decode checks a received datagram and splits it into a frame (without descriptors).
func Decode(b []byte) (Frame, error) {
	if len(b) < HeaderSize {
		return Frame{}, fmt.Errorf("%w: frame of %d bytes, shorter than the header", ErrProtocol, len(b))
	}
	le := binary.LittleEndian
	if m := le.Uint32(b[0:]); m != Magic {
		return Frame{}, fmt.Errorf("%w: magic %#x, want %#x", ErrProtocol, m, Magic)
	}
	if major := le.Uint16(b[4:]); major != VersionMajor {
		return Frame{}, fmt.Errorf("%w: version %d.%d, this side speaks %d.%d: run one faas-gpu binary for the "+
			"gpuserver and its tenant executors", ErrProtocol, major, le.Uint16(b[6:]), VersionMajor, VersionMinor)
	}
	n := le.Uint32(b[12:])
	if n > MaxBody || uint64(n) != uint64(len(b)-HeaderSize) {
		return Frame{}, fmt.Errorf("%w: body of %d bytes in a frame of %d", ErrProtocol, n, len(b))
	}
	return Frame{Kind: Kind(le.Uint16(b[8:])), Flags: le.Uint16(b[10:]), ID: le.Uint64(b[16:]),
		Body: b[HeaderSize:]}, nil
}

// Socketpair returns the two ends of a new control socket: the gpuserver keeps the first and passes the second to
// the executor process (which receives it as fd 3, see FileFD).
func Socketpair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("control socket: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "tenant-control")
	defer mine.Close()
	c, err := FileConn(mine)
	if err != nil {
		_ = unix.Close(fds[1])
		return nil, nil, err
	}
	return c, os.NewFile(uintptr(fds[1]), "tenant-control"), nil
}

// FileFD is the descriptor number the executor process receives its end of the control socket as.
const FileFD = 3

// FileConn makes a connection of a control socket descriptor (which stays the caller's to close).
func FileConn(f *os.File) (*net.UnixConn, error) {
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%w: control socket is %T", ErrProtocol, c)
	}
	return uc, nil
}

// write sends one frame with its descriptors.
func write(c *net.UnixConn, b []byte, files []*os.File) error {
	if len(files) > MaxFiles {
		return fmt.Errorf("%w: %d descriptors in one frame, at most %d", ErrProtocol, len(files), MaxFiles)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err == nil && (n != len(b) || oobn != len(oob)) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(b))
	}
	return err
}

// read receives one frame and its descriptors.
func read(c *net.UnixConn, buf, oob []byte) (Frame, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	var files []*os.File
	if oobn > 0 {
		if msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, m := range msgs {
				fds, _ := syscall.ParseUnixRights(&m)
				for _, fd := range fds {
					files = append(files, os.NewFile(uintptr(fd), "handed-over"))
				}
			}
		}
	}
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	if err != nil {
		closeAll()
		return Frame{}, err
	}
	if n == 0 && oobn == 0 {
		return Frame{}, errPeerClosed
	}
	if flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
		closeAll()
		return Frame{}, fmt.Errorf("%w: frame truncated (flags %#x)", ErrProtocol, flags)
	}
	f, err := Decode(buf[:n])
	if err != nil {
		closeAll()
		return Frame{}, err
	}
	f.Body = append([]byte(nil), f.Body...)
	f.Files = files
	return f, nil
}

var errPeerClosed = errors.New("the other side closed the control socket")

// Error is the body of a reply with FlagError: the codes of the sentinel errors it wraps (see Code) and its
// message.
type Error struct {
	Codes   []string `json:"codes,omitempty"`
	Message string   `json:"message"`
}
