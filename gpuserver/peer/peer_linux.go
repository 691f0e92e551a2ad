package peer

import (
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// Of names the peer a connection counts against: the user of a Unix socket's peer process (SO_PEERCRED),
// the IP address of a TCP client.
func Of(c net.Conn) string {
	switch c := c.(type) {
	case *net.UnixConn:
		raw, err := c.SyscallConn()
		if err != nil {
			return "unix"
		}
		var cred *unix.Ucred
		if cerr := raw.Control(func(fd uintptr) {
			cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		}); cerr != nil || err != nil {
			return "unix"
		}
		return "uid:" + strconv.FormatUint(uint64(cred.Uid), 10)
	case *net.TCPConn:
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			return "ip:" + a.IP.String()
		}
	}
	return "other"
}
