package connlimit

// Limits are the bounds of one surface.
type Limits struct {
	MaxConns, MaxPerPeer int
}

// Budget shares the process's file descriptors (its soft RLIMIT_NOFILE, which the Go runtime raises to the hard
// limit at start) out between a server's surfaces: a quarter, at least 256, stays for everything that is not a
// client connection (files, the platform's own sockets, function processes' pipes, upstream connections);
// shares of the rest go to the surfaces, each capped at max. A surface gets MaxConns = its share, MaxPerPeer = a
// quarter of it (at least 8), so that one peer never holds a surface alone. Limits are never below 16.
func Budget(nofile uint64, share float64, max int) Limits {
	reserve := max64(256, nofile/4)
	free := uint64(0)
	if nofile > reserve {
		free = nofile - reserve
	}
	n := int(float64(free) * share)
	if n > max {
		n = max
	}
	if n < 16 {
		n = 16
	}
	per := n / 4
	if per < 8 {
		per = 8
	}
	return Limits{MaxConns: n, MaxPerPeer: per}
}

func max64(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
