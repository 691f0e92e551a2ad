package remoting

import (
	"context"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Sessions handed over to another process (docs/tenants.md): the gpuserver checks a connection's hello and hands
// the connection and its ring memfd to the function's tenant executor (Config.HandOff), which answers the hello and
// runs the session (Adopt). Records then flow from the function's ring into the executor without a hop through
// the gpuserver.

// HandOff receives a connection whose hello passed: the function's token was checked, the session counted against
// its function's limit and the ring memfd's seals and layout checked. conn and shm are descriptors of their own
// (HandOff closes them, also on error); done uncounts the session and must be called exactly once, when the session
// ended wherever it runs (also when HandOff fails). An error refuses the hello with its message.
type HandOff func(ctx context.Context, conn, shm *os.File, info SessionInfo, shmSize uint64, done func()) error

func dupCloexec(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// handOff passes a checked connection to Config.HandOff; on failure the client gets a refusal naming why.
func (s *Server) handOff(ctx context.Context, c *net.UnixConn, shmFD int, info SessionInfo, shmSize uint64,
	done func()) {
	shm := os.NewFile(uintptr(shmFD), "remoting-shm")
	conn, err := c.File()
	if err != nil {
		_ = shm.Close()
		done()
		s.refuse(c, wireStatusInternal, "handoff", fmt.Errorf("hand the session over: %w", err))
		return
	}
	if err := s.cfg.HandOff(ctx, conn, shm, info, shmSize, done); err != nil {
		s.log.Warn("remoting: hand-off refused", "function", info.Function, "pid", info.PID, "err", err)
		s.refuse(c, wireStatusInternal, "handoff", err)
		return
	}
	s.metrics.handedOff.Inc()
}

// Adopt runs a session whose hello another process checked and handed over (HandOff there): conn is the
// connection and shm the ring's memfd (Adopt closes both). It answers the hello and serves the ring until the
// client hangs up or ctx ends, and returns then. The ring is checked again before it is used.
func (s *Server) Adopt(ctx context.Context, conn, shm *os.File, info SessionInfo, shmSize uint64) error {
	defer shm.Close()
	fc, err := net.FileConn(conn)
	_ = conn.Close()
	if err != nil {
		return fmt.Errorf("remoting: adopt %s: %w", info.Function, err)
	}
	c, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return fmt.Errorf("%w: adopt %s: the connection is %T, want a Unix socket", ErrProtocol, info.Function, fc)
	}
	m, err := mapSharedMemory(int(shm.Fd()), shmSize)
	if err != nil {
		err = fmt.Errorf("%w: shared memory: %w", ErrProtocol, err)
		s.refuse(c, wireStatusSharedMemory, "shared_memory", err)
		c.Close()
		return err
	}
	s.mu.Lock()
	if ctx.Err() != nil {
		s.mu.Unlock()
		_ = m.unmap()
		c.Close()
		return ctx.Err()
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer func() {
		stop()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	s.contain(func() { s.runSession(ctx, c, m, info) })
	return nil
}
