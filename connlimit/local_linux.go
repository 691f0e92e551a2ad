package connlimit

import (
	"encoding/binary"
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// localUser names the user of a loopback TCP connection's client socket ("/uid:N"), "" for any other connection or
// when the kernel does not say. Every local client reaches a loopback listener from the same address, so without it
// one local process (a function on faas-gpu up, which shares the machine's network) was the same peer as every
// other: its stalled connections took the share every local client, faas-cli included, had. The kernel's socket
// diagnostics (NETLINK_SOCK_DIAG) name the owner of the client's socket, found by its exact addresses and ports.
func localUser(c net.Conn) string {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || !remote.IP.IsLoopback() || !local.IP.IsLoopback() {
		return ""
	}
	uid, ok := socketUID(remote, local)
	if !ok {
		return ""
	}
	return "/uid:" + strconv.FormatUint(uint64(uid), 10)
}

// Netlink and inet_diag layouts (linux/netlink.h, linux/inet_diag.h).
const (
	nlmsgHeaderLen   = 16
	inetDiagReqLen   = 56 // struct inet_diag_req_v2
	inetDiagMsgLen   = 72 // struct inet_diag_msg
	inetDiagUIDOff   = 64 // idiag_uid in struct inet_diag_msg
	nlmFRequest      = 0x1
	nlmsgError       = 0x2
	inetDiagNoCookie = ^uint32(0)
)

// socketUID asks the kernel for the owner of the TCP socket whose own address is src and peer address is dst.
func socketUID(src, dst *net.TCPAddr) (uint32, bool) {
	family, n := uint8(unix.AF_INET), 4
	if src.IP.To4() == nil {
		family, n = unix.AF_INET6, 16
	}
	req := make([]byte, nlmsgHeaderLen+inetDiagReqLen)
	le, be := binary.LittleEndian, binary.BigEndian
	le.PutUint32(req[0:], uint32(len(req)))
	le.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	le.PutUint16(req[6:], nlmFRequest)
	le.PutUint32(req[8:], 1) // sequence
	r := req[nlmsgHeaderLen:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	le.PutUint32(r[4:], ^uint32(0)) // every state
	id := r[8:]
	be.PutUint16(id[0:], uint16(src.Port))
	be.PutUint16(id[2:], uint16(dst.Port))
	if n == 4 {
		copy(id[4:], src.IP.To4())
		copy(id[20:], dst.IP.To4())
	} else {
		copy(id[4:], src.IP.To16())
		copy(id[20:], dst.IP.To16())
	}
	le.PutUint32(id[40:], inetDiagNoCookie)
	le.PutUint32(id[44:], inetDiagNoCookie)

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Usec: 100_000}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, false
	}
	buf := make([]byte, 4096)
	got, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil || got < nlmsgHeaderLen+inetDiagMsgLen {
		return 0, false
	}
	if le.Uint16(buf[4:]) == nlmsgError || le.Uint16(buf[4:]) != unix.SOCK_DIAG_BY_FAMILY {
		return 0, false
	}
	return le.Uint32(buf[nlmsgHeaderLen+inetDiagUIDOff:]), true
}
