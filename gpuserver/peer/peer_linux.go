package peer

import (
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// Of names the peer a connection counts against: the user of a Unix socket's peer process (SO_PEERCRED) and, when
// that process runs in a PID namespace below this process's (a sandbox), the sandbox: the outermost PID namespace
// between the two; the IP address of a TCP client.
//
// The sandbox matters where the user does not tell peers apart: faas-gpu up without root runs every function under
// its own uid (user namespaces, not ids, separate them), so one function's connections would count against every
// function's bound. A function cannot leave its sandbox's PID namespace, and namespaces it creates inside lie below
// it, so it is one peer however many it makes.
func Of(c net.Conn) string {
	switch c := c.(type) {
	case *net.UnixConn:
		raw, err := c.SyscallConn()
		if err != nil {
			return "unix"
		}
		var (
			cred    *unix.Ucred
			sandbox string
		)
		if cerr := raw.Control(func(fd uintptr) {
			cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
			if err == nil {
				sandbox = sandboxOf(int(fd), cred.Pid)
			}
		}); cerr != nil || err != nil {
			return "unix"
		}
		return "uid:" + strconv.FormatUint(uint64(cred.Uid), 10) + sandbox
	case *net.TCPConn:
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			return "ip:" + a.IP.String()
		}
	}
	return "other"
}

// maxPIDNamespaceDepth is the kernel's bound on nested PID namespaces (32), plus room.
const maxPIDNamespaceDepth = 40

// sandboxOf names the PID namespace of the socket fd's peer process (pid, in this process's namespace) that lies
// directly below this process's own: "" when the peer shares this process's namespace, "/pidns:<inode>"
// otherwise; "/pidns:?" when it cannot be told (the process ended before it was looked at, a namespace outside this
// one's), so that such connections share a bound of their own rather than another peer's.
func sandboxOf(fd int, pid int32) string {
	const unknown = "/pidns:?"
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &self); err != nil {
		return ""
	}
	if pid <= 0 {
		return unknown
	}
	// The pid names the peer only while that process lives: its pidfd (Linux 6.5 and later) says whether it still
	// did once its namespace was opened, so that a reused pid is never taken for the peer.
	pidfd, perr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if perr == nil {
		defer unix.Close(pidfd)
	}
	ns, err := unix.Open("/proc/"+strconv.Itoa(int(pid))+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return unknown
	}
	if perr == nil && unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
		unix.Close(ns)
		return unknown
	}
	for range maxPIDNamespaceDepth {
		var st unix.Stat_t
		if err := unix.Fstat(ns, &st); err != nil {
			break
		}
		if st.Dev == self.Dev && st.Ino == self.Ino {
			unix.Close(ns)
			return "" // this process's own namespace
		}
		parent, err := unix.IoctlRetInt(ns, unix.NS_GET_PARENT)
		if err != nil { // ns is the outermost this process may see (EPERM: its parent lies outside ours)
			unix.Close(ns)
			return "/pidns:" + strconv.FormatUint(st.Ino, 10)
		}
		var pst unix.Stat_t
		if err := unix.Fstat(parent, &pst); err != nil {
			unix.Close(parent)
			break
		}
		if pst.Dev == self.Dev && pst.Ino == self.Ino {
			unix.Close(parent)
			unix.Close(ns)
			return "/pidns:" + strconv.FormatUint(st.Ino, 10)
		}
		unix.Close(ns)
		ns = parent
	}
	unix.Close(ns)
	return unknown
}
