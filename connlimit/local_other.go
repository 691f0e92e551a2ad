//go:build !linux

package connlimit

import "net"

// localUser names the user of a loopback connection's client where the kernel says; not on this system.
func localUser(net.Conn) string { return "" }
