// Package peer names who is at the other end of a connection, so that a server can bound what each peer holds:
// the user of a Unix socket's peer process (SO_PEERCRED, the kernel's word, not the peer's), the IP address of a
// TCP client.
package peer
