package remoting

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
)

// hello is the first message of a connection.
type hello struct {
	magic        uint32
	major, minor uint16
	pid          uint32
	flags        uint32
	shmSize      uint64
	function     string
	token        string
	// instance names the process's instance of the function (minor >= 3, wireHelloFlagInstance): "" is the
	// function itself (pool.InstanceKey).
	instance string
	// key is what the session's calls run under: the instance's key once the hello is checked (handshake).
	key string
}

func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func parseHello(b []byte) hello {
	le := binary.LittleEndian
	return hello{
		magic:    le.Uint32(b),
		major:    le.Uint16(b[4:]),
		minor:    le.Uint16(b[6:]),
		pid:      le.Uint32(b[wireHelloPid:]),
		flags:    le.Uint32(b[wireHelloFlags:]),
		shmSize:  le.Uint64(b[wireHelloShmSize:]),
		function: cstring(b[wireHelloFunction : wireHelloFunction+wireNameMax]),
		token:    cstring(b[wireHelloToken : wireHelloToken+wireNameMax]),
	}
}

// checkVersion refuses a hello whose version the server does not speak.
func (h hello) checkVersion() error {
	if h.magic != wireMagic {
		return fmt.Errorf("%w: hello magic %#x, want %#x", ErrProtocol, h.magic, wireMagic)
	}
	if h.major != wireVersionMajor || h.minor > wireVersionMinor {
		return fmt.Errorf("%w: shim speaks %d.%d, gpuserver speaks %d.%d (major must match, minor at most the "+
			"server's): install the shim that comes with this gpuserver", ErrVersion, h.major, h.minor,
			wireVersionMajor, wireVersionMinor)
	}
	return nil
}

// readHello reads the hello and the memfd passed with it. The returned fd is -1 when none came.
func readHello(c *net.UnixConn) (hello, int, error) {
	buf := make([]byte, wireHelloSize)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	fd := -1
	got := 0
	for got < len(buf) {
		n, oobn, _, _, err := c.ReadMsgUnix(buf[got:], oob)
		if oobn > 0 {
			msgs, perr := syscall.ParseSocketControlMessage(oob[:oobn])
			if perr == nil {
				for _, m := range msgs {
					fds, _ := syscall.ParseUnixRights(&m)
					for _, f := range fds {
						if fd < 0 {
							fd = f
						} else {
							_ = syscall.Close(f)
						}
					}
				}
			}
		}
		got += n
		if err != nil {
			if fd >= 0 {
				_ = syscall.Close(fd)
			}
			return hello{}, -1, fmt.Errorf("%w: hello: %w", ErrProtocol, err)
		}
	}
	h := parseHello(buf)
	if h.flags&wireHelloFlagInstance != 0 && h.magic == wireMagic && h.minor >= 3 {
		// The instance block follows the hello (sent with it; read whole before anything else is answered).
		ib := make([]byte, wireHelloInstanceSize)
		for got := 0; got < len(ib); {
			n, err := c.Read(ib[got:])
			got += n
			if err != nil {
				if fd >= 0 {
					_ = syscall.Close(fd)
				}
				return hello{}, -1, fmt.Errorf("%w: hello's instance block: %w", ErrProtocol, err)
			}
		}
		h.instance = cstring(ib)
	}
	return h, fd, nil
}

// reply is the answer to a hello.
type reply struct {
	status     int32
	totalMem   uint64
	vaBase     uint64
	vaSize     uint64
	deviceName string
	uuid       [16]byte
	attrs      [wireAttrCount]int32
	message    string
}

func (r reply) encode() []byte {
	b := make([]byte, wireReplySize)
	le := binary.LittleEndian
	le.PutUint32(b, wireMagic)
	le.PutUint16(b[4:], wireVersionMajor)
	le.PutUint16(b[6:], wireVersionMinor)
	le.PutUint32(b[wireReplyStatus:], uint32(r.status))
	le.PutUint64(b[wireReplyTotalMem:], r.totalMem)
	le.PutUint64(b[wireReplyVABase:], r.vaBase)
	le.PutUint64(b[wireReplyVASize:], r.vaSize)
	copy(b[wireReplyDeviceName:wireReplyDeviceName+255], r.deviceName)
	copy(b[wireReplyUUID:wireReplyUUID+16], r.uuid[:])
	for i, a := range r.attrs {
		le.PutUint32(b[wireReplyAttrs+4*i:], uint32(a))
	}
	copy(b[wireReplyMessage:wireReplyMessage+255], r.message)
	return b
}
