//go:build !linux

package api

import "net"

// peerOf names the peer a connection counts against: the IP address of a TCP client; Unix socket peers are one
// peer where SO_PEERCRED is not available.
func peerOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return "ip:" + a.IP.String()
	}
	return "unix"
}
