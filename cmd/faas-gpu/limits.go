package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/connlimit"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// connFlags bound the connections of a command's HTTP surface (package connlimit): in total and per peer.
type connFlags struct {
	maxConns, maxPerPeer int
}

func (f *connFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.maxConns, "max-conns", 0,
		"connections the HTTP surface keeps open at once; beyond, a new connection gets 503 and is closed (0: "+
			"sized from the open-file limit, at most 4096, so that a connection storm never takes the descriptors "+
			"the other surfaces need)")
	fs.IntVar(&f.maxPerPeer, "max-conns-per-peer", 0,
		"connections of one peer (an IPv4 address, an IPv6 /64; on loopback every local client is one peer) "+
			"(0: a quarter of -max-conns)")
}

func (f *connFlags) validate() error {
	switch {
	case f.maxConns < 0:
		return usageError{fmt.Errorf("-max-conns %d: must be >= 0 (0: sized from the open-file limit)", f.maxConns)}
	case f.maxPerPeer < 0:
		return usageError{fmt.Errorf("-max-conns-per-peer %d: must be >= 0 (0: a quarter of -max-conns)", f.maxPerPeer)}
	case f.maxConns > 0 && f.maxPerPeer > f.maxConns:
		return usageError{fmt.Errorf("-max-conns-per-peer %d: must not exceed -max-conns %d", f.maxPerPeer, f.maxConns)}
	}
	return nil
}

// limits are the flags' bounds; unset ones come from the process's descriptor budget (share of it, at most 4096).
func (f *connFlags) limits(share float64) connlimit.Limits {
	l := connlimit.Budget(connlimit.NoFile(), share, 4096)
	if f.maxConns > 0 {
		l = connlimit.Limits{MaxConns: f.maxConns, MaxPerPeer: max(1, f.maxConns/4)}
	}
	if f.maxPerPeer > 0 {
		l.MaxPerPeer = f.maxPerPeer
	}
	return l
}

// boundedListen listens on addr behind connlimit with the given bounds.
func boundedListen(network, addr, surface string, l connlimit.Limits, log *slog.Logger) (*connlimit.Listener, error) {
	raw, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	bl, err := connlimit.New(raw, connlimit.Config{Surface: surface, MaxConns: l.MaxConns, MaxPerPeer: l.MaxPerPeer,
		Logger: log})
	if err != nil {
		raw.Close()
		return nil, err
	}
	return bl, nil
}

// byteLimit is a flag holding a byte count as a quantity (512Mi, 2Gi) or "none" (no bound, -1).
type byteLimit int64

func (b *byteLimit) String() string {
	switch {
	case b == nil || *b == 0:
		return ""
	case *b < 0:
		return "none"
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteLimit) Set(s string) error {
	if strings.TrimSpace(s) == "none" {
		*b = -1
		return nil
	}
	v, err := gpuspec.ParseQuantity(s)
	if err != nil {
		return err
	}
	if v > 1<<62 {
		return fmt.Errorf("%q is too large", s)
	}
	*b = byteLimit(v)
	return nil
}

// streamLimitFlags bound the JetStream streams the queue worker manages (package queue's Limits).
type streamLimitFlags struct {
	queueMaxBytes      byteLimit
	queueMaxAge        time.Duration
	deadLetterMaxBytes byteLimit
}

func (f *streamLimitFlags) register(fs *flag.FlagSet) {
	f.queueMaxBytes = queue.DefaultQueueMaxBytes
	f.deadLetterMaxBytes = queue.DefaultDeadLetterMaxBytes
	fs.Var(&f.queueMaxBytes, "queue-max-bytes",
		"bound of each queue's backlog (e.g. 1Gi; none: no bound); a call beyond it is refused with 429, a call once "+
			"accepted is never dropped for space (default 1Gi)")
	fs.DurationVar(&f.queueMaxAge, "queue-max-age", queue.DefaultQueueMaxAge,
		"calls still waiting after this long are removed from the queue (0: no bound)")
	fs.Var(&f.deadLetterMaxBytes, "dead-letter-max-bytes",
		"bound of the dead-letter stream (e.g. 256Mi; none: no bound); the oldest entries are removed first (default 256Mi)")
}

// validate checks what the flags mean beyond the worker's settings (a negative -queue-max-age); the bounds
// themselves are the worker's to check (worker.Config.ValidateStreams).
func (f *streamLimitFlags) validate() error {
	if f.queueMaxAge < 0 {
		return usageError{fmt.Errorf("-queue-max-age %s: must not be negative (0: no bound)", f.queueMaxAge)}
	}
	return nil
}

// apply sets the limits on a worker's config.
func (f *streamLimitFlags) apply(cfg *worker.Config) {
	cfg.QueueMaxBytes = int64(f.queueMaxBytes)
	cfg.DeadLetterMaxBytes = int64(f.deadLetterMaxBytes)
	cfg.QueueMaxAge = f.queueMaxAge
	if f.queueMaxAge == 0 {
		cfg.QueueMaxAge = -1 // the flag's 0 is "no bound"; the worker's 0 is its default
	}
}
