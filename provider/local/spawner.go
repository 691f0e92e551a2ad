package local

import (
	"context"
	"os/exec"
	"runtime"
)

// spawner starts child processes from one OS thread that stays alive for the backend's lifetime. A child's
// parent-death signal (Pdeathsig, Linux) fires when the thread that forked it exits, not when the process does, so
// starting children from arbitrary goroutines would kill them whenever the Go runtime retires a thread. When the
// spawner stops, its locked goroutine returns without unlocking, the runtime ends the thread, and any child still
// alive gets SIGKILL.
type spawner struct {
	reqs chan spawnRequest
	quit chan struct{}
	done chan struct{}
}

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnRequest), quit: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *spawner) loop() {
	runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
	defer close(s.done)
	for {
		select {
		case r := <-s.reqs:
			r.errc <- r.cmd.Start()
		case <-s.quit:
			return
		}
	}
}

// start starts cmd on the spawner's thread.
func (s *spawner) start(ctx context.Context, cmd *exec.Cmd) error {
	r := spawnRequest{cmd: cmd, errc: make(chan error, 1)}
	select {
	case s.reqs <- r:
		return <-r.errc
	case <-s.quit:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the spawner's thread and waits for it.
func (s *spawner) stop() {
	close(s.quit)
	<-s.done
}
