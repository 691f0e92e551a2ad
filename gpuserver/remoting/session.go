package remoting

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// idler is implemented by handlers that hold an implicit binding to release when the session is idle.
type idler interface{ Idle() }

func (s *Server) refuse(c *net.UnixConn, status int32, reason string, err error) {
	s.metrics.refused.WithLabelValues(reason).Inc()
	_, _ = c.Write(reply{status: status, message: err.Error()}.encode())
}

// serveConn runs one session: hello, then the ring until the client hangs up or ctx ends. With Config.HandOff
// the session runs elsewhere once its hello passed.
func (s *Server) serveConn(ctx context.Context, c *net.UnixConn, who string) {
	shm, h, spec, done, kept, err := s.handshake(c, who, s.cfg.HandOff != nil)
	if err != nil {
		return
	}
	done = s.instanceSession(ctx, h.key, done)
	info := SessionInfo{Function: h.key, Spec: spec, PID: int(h.pid)}
	if s.cfg.HandOff != nil {
		_ = shm.unmap()
		s.handOff(ctx, c, kept, info, h.shmSize, done)
		return
	}
	defer done()
	s.runSession(ctx, c, shm, info)
}

// runSession answers the hello of a checked connection and serves its ring until the client hangs up or ctx ends.
func (s *Server) runSession(ctx context.Context, c *net.UnixConn, shm *sharedMemory, info SessionInfo) {
	defer shm.unmap()
	log := s.log.With("function", info.Function)
	var (
		handler Handler
		err     error
	)
	if s.cfg.NewHandler != nil {
		handler, err = s.cfg.NewHandler(ctx, info)
	} else {
		handler, err = newDeviceHandler(ctx, s.cfg, info, log)
		if err == nil {
			s.sessionStarted(info.Function)
			defer s.sessionEnded(ctx, info.Function, log) // runs after the handler's Close below
		}
	}
	if err != nil {
		log.Error("remoting: session", "err", err)
		s.refuse(c, wireStatusInternal, "internal", err)
		return
	}
	if cl, ok := handler.(io.Closer); ok {
		defer func() {
			if err := cl.Close(); err != nil {
				log.Error("remoting: close session", "err", err)
			}
		}()
	}
	rep := s.deviceReply(info.Spec)
	if _, err := c.Write(rep.encode()); err != nil {
		log.Warn("remoting: hello reply", "err", err)
		return
	}
	_ = c.SetDeadline(time.Time{})
	log.Debug("remoting: session started", "pid", info.PID)
	sess := &session{srv: s, conn: c, shm: shm, h: handler, log: log, function: info.Function}
	if err := sess.run(ctx); err != nil && ctx.Err() == nil {
		log.Warn("remoting: session ended", "pid", info.PID, "err", err)
	}
}

// handshake reads and checks a connection's hello: magic and version, the function's identity (its token), the
// per-function session limit and the shared memory. On success the session counts against the function's limit
// until done is called; on failure the client got a refusal (when it sent a hello at all) and the error is
// returned. The hello must arrive within Config.HelloTimeout.
//
// With keep, the ring memfd is also returned as a descriptor of its own (kept, -1 otherwise), to hand it over.
func (s *Server) handshake(c *net.UnixConn, who string, keep bool) (shm *sharedMemory, h hello,
	spec pool.FunctionSpec, done func(), kept int, err error) {
	kept = -1
	checked := false
	defer func() {
		if !checked {
			s.helloDone(who)
		}
	}()
	_ = c.SetDeadline(time.Now().Add(s.cfg.HelloTimeout))
	h, fd, err := readHello(c)
	if err != nil {
		s.metrics.refused.WithLabelValues("protocol").Inc()
		s.log.Warn("remoting: refused connection", "err", err)
		return nil, h, spec, nil, -1, err
	}
	if fd >= 0 {
		defer syscall.Close(fd)
	}
	log := s.log.With("function", h.function)
	if err := h.checkVersion(); err != nil {
		log.Warn("remoting: refused connection", "pid", h.pid, "err", err)
		s.refuse(c, wireStatusVersion, "version", err)
		return nil, h, spec, nil, -1, err
	}
	spec, token, err := s.cfg.Functions.Function(h.function)
	if err == nil && (token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(h.token)) != 1) {
		err = errors.New("wrong token")
	}
	if err != nil {
		err = fmt.Errorf("%w: function %q: %w", ErrIdentity, h.function, err)
		log.Warn("remoting: refused connection", "pid", h.pid, "err", err)
		s.refuse(c, wireStatusIdentity, "identity", err)
		return nil, h, spec, nil, -1, err
	}
	checked = true
	s.helloDone(who) // the client proved who it is: from here it counts against its function's limit
	done, err = s.admit(h.function)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrLimit, err)
		log.Warn("remoting: refused connection", "pid", h.pid, "err", err)
		s.refuse(c, wireStatusInternal, "sessions_per_function", err)
		return nil, h, spec, nil, -1, err
	}
	if h.key, err = s.instance(h); err != nil {
		log.Warn("remoting: refused connection", "pid", h.pid, "instance", h.instance, "err", err)
		s.refuse(c, wireStatusIdentity, "instance", err)
		done()
		return nil, h, spec, nil, -1, err
	}
	if fd < 0 {
		err = fmt.Errorf("%w: no shared memory passed with the hello", ErrProtocol)
		s.refuse(c, wireStatusSharedMemory, "shared_memory", err)
		done()
		return nil, h, spec, nil, -1, err
	}
	shm, err = mapSharedMemory(fd, h.shmSize)
	if err != nil {
		err = fmt.Errorf("%w: shared memory: %w", ErrProtocol, err)
		log.Warn("remoting: refused connection", "pid", h.pid, "err", err)
		s.refuse(c, wireStatusSharedMemory, "shared_memory", err)
		done()
		return nil, h, spec, nil, -1, err
	}
	if keep {
		if kept, err = dupCloexec(fd); err != nil {
			_ = shm.unmap()
			err = fmt.Errorf("%w: keep the shared memory: %w", ErrProtocol, err)
			s.refuse(c, wireStatusInternal, "internal", err)
			done()
			return nil, h, spec, nil, -1, err
		}
	}
	return shm, h, spec, done, kept, nil
}

// session is one connection's loop over its ring.
type session struct {
	srv      *Server
	conn     *net.UnixConn
	shm      *sharedMemory
	h        Handler
	log      *slog.Logger
	function string
	kicked   atomic.Bool // Wake: the function was bound while the session may sleep
	head     uint64
	pending  Result // first error of an async call since the last syncpoint
	early    int    // async records of the publication being executed, not yet followed by a synchronous call
	wake     [64]byte
}

// errClosed: the client hung up.
var errClosed = errors.New("client closed the connection")

func (s *session) run(ctx context.Context) error {
	s.srv.addSession(s)
	defer s.srv.removeSession(s)
	for {
		tail := s.shm.tail()
		if tail == s.head {
			if err := s.wait(ctx); err != nil {
				if errors.Is(err, errClosed) {
					return nil
				}
				return err
			}
			continue
		}
		if tail-s.head > uint64(len(s.shm.ring)) || tail < s.head {
			return fmt.Errorf("%w: tail %d, head %d, ring %d", ErrProtocol, tail, s.head, len(s.shm.ring))
		}
		s.early = 0 // async records of this publication so far
		var busy time.Duration
		for s.head < tail {
			start := time.Now()
			n, sync, err := s.record(ctx, tail)
			if err != nil {
				return err
			}
			if !sync {
				busy += time.Since(start)
			}
			s.head += n
			s.shm.setHead(s.head)
		}
		s.srv.metrics.busy.Add(busy.Seconds())
	}
}

// record executes the record at head and returns its size and whether the client waits for its result.
func (s *session) record(ctx context.Context, tail uint64) (size uint64, sync bool, err error) {
	ringSize := uint64(len(s.shm.ring))
	pos := s.head % ringSize
	avail := min(tail-s.head, ringSize-pos)
	slot := s.shm.ring[pos : pos+avail]
	if avail < 8 {
		return 0, false, fmt.Errorf("%w: %d bytes at ring offset %d", ErrProtocol, avail, pos)
	}
	hdr := recordHeader{size: leU32(slot), id: CallID(leU16(slot[4:]))}
	if hdr.size < 8 || hdr.size%8 != 0 || uint64(hdr.size) > avail {
		return 0, false, fmt.Errorf("%w: record size %d at ring offset %d (%d bytes available)", ErrProtocol, hdr.size,
			pos, avail)
	}
	if hdr.id == wireRecordPadID {
		return uint64(hdr.size), false, nil
	}
	if hdr.size < wireRecordHeaderSize {
		return 0, false, fmt.Errorf("%w: record size %d", ErrProtocol, hdr.size)
	}
	rec := slot[:hdr.size]
	hdr = parseRecordHeader(rec)
	info := calls[hdr.id]
	resp := s.shm.resp[wireResponseHeaderSize:]
	id, r, n, err := DecodeRecord(ctx, s.h, rec, resp)
	if err != nil {
		return 0, false, err
	}
	s.srv.metrics.records.Inc()
	respond := info.sync || hdr.flags&wireRecordFlagSync != 0
	if !info.sync && r != ResultSuccess {
		if s.pending == ResultSuccess {
			s.pending = r
		}
		s.log.Debug("remoting: async call failed", "call", id.String(), "result", int32(r))
	}
	if info.syncpoint && r == ResultSuccess && s.pending != ResultSuccess {
		r, s.pending = s.pending, ResultSuccess
	}
	if !respond {
		s.early++
	} else {
		if s.early > 0 { // published together with this synchronous call: they waited for the client to wait
			s.srv.metrics.late.Add(float64(s.early))
			s.early = 0
		}
		if r != ResultSuccess {
			n = 0
		}
		s.shm.respond(hdr.seq, r, n)
		if s.shm.clientWaiting() {
			if _, err := s.conn.Write([]byte{1}); err != nil {
				return 0, false, fmt.Errorf("doorbell: %w", err)
			}
		}
	}
	return uint64(hdr.size), respond, nil
}

// bounder is implemented by handlers that can say whether their function holds a binding now.
type bounder interface{ Bound() bool }

// wait polls for new records, then sleeps on the socket until the client rings, releasing an implicit binding
// after IdleRelease. It polls for Config.Spin, or for Config.BoundSpin while the function holds a binding (checked
// every boundCheck): a request's records then reach the device without a doorbell or a wake-up.
func (s *session) wait(ctx context.Context) error {
	start := time.Now()
	spin := s.srv.cfg.Spin
	b, _ := s.h.(bounder)
	bound := b != nil && s.srv.cfg.BoundSpin > 0 && b.Bound()
	if bound {
		spin = max(spin, s.srv.cfg.BoundSpin)
	}
	checked := start
	for i := 0; ; i++ {
		if s.shm.tail() != s.head {
			if bound {
				s.srv.metrics.boundPoll.Add(time.Since(start).Seconds())
			}
			return nil
		}
		if i%64 == 63 {
			now := time.Now()
			if now.Sub(start) > spin {
				break
			}
			if bound && now.Sub(checked) > boundCheck {
				checked = now
				if !b.Bound() { // released: poll no longer than an unbound session
					s.srv.metrics.boundPoll.Add(now.Sub(start).Seconds())
					bound, spin = false, s.srv.cfg.Spin
					start = now.Add(-s.srv.cfg.Spin) // sleep at once
					continue
				}
			}
			runtime.Gosched()
		}
	}
	if bound {
		s.srv.metrics.boundPoll.Add(time.Since(start).Seconds())
		s.srv.metrics.boundSleeps.Inc()
	}
	s.srv.metrics.sleeps.Inc()
	s.shm.setServerWaiting(true)
	defer s.shm.setServerWaiting(false)
	idle := false
	release := start.Add(s.srv.cfg.IdleRelease) // the implicit binding goes after IdleRelease idle, polling included
	for s.shm.tail() == s.head {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if s.kicked.Swap(false) && b != nil && s.srv.cfg.BoundSpin > 0 && b.Bound() {
			return nil // bound meanwhile (Wake): poll for the request's records instead of waiting for a doorbell
		}
		if !idle && !time.Now().Before(release) {
			idle = true
			if i, ok := s.h.(idler); ok {
				i.Idle()
			}
		}
		deadline := release
		if idle {
			deadline = time.Now().Add(s.srv.cfg.IdleRelease)
		}
		_ = s.conn.SetReadDeadline(deadline)
		if s.kicked.Load() { // woken between the check above and the deadline
			continue
		}
		_, err := s.conn.Read(s.wake[:])
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
			return errClosed
		default:
			return err
		}
	}
	return nil
}

// addSession and removeSession keep the sessions by function, for Wake.
func (s *Server) addSession(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byFunction[sess.function] == nil {
		s.byFunction[sess.function] = map[*session]struct{}{}
	}
	s.byFunction[sess.function][sess] = struct{}{}
}

func (s *Server) removeSession(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byFunction[sess.function], sess)
	if len(s.byFunction[sess.function]) == 0 {
		delete(s.byFunction, sess.function)
	}
}

// Wake tells the sessions of function that it was bound to a GPU for a request: a session asleep on its socket
// starts polling its ring (Config.BoundSpin) at once, so that the request's first records do not wait for a
// doorbell and a wake-up. Whoever binds calls it (the gpuserver's pool, a tenant executor's acquire).
func (s *Server) Wake(function string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.byFunction[function] {
		sess.kicked.Store(true)
		_ = sess.conn.SetReadDeadline(time.Now()) // ends a Read in progress
	}
}

// boundCheck is how often a polling session asks whether its function still holds a binding.
const boundCheck = time.Millisecond

func leU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func leU16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
