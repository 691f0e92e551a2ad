//go:build !linux

package peer

import "net"

// Of names the peer a connection counts against: the IP address of a TCP client; Unix socket peers are one
// peer where SO_PEERCRED is not available.
func Of(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return "ip:" + a.IP.String()
	}
	return "unix"
}
