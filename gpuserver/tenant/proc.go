package tenant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// proc supervises one tenant's executor process: it starts it, hands it its configuration, restarts it when it
// ends (at once, then with a doubling back-off while it keeps dying) and tells everything that depended on the
// ended process (sessions, bindings, chunks) that it ended.
type proc struct {
	pl     *Plane
	tenant string
	slot   int
	dir    string

	mu        sync.Mutex
	cur       *generation   // the running (or starting) executor; nil between two
	up        chan struct{} // closed while cur serves; replaced when it ends
	gens      int
	state     string // starting, up, backoff, stopped
	restarts  int
	faults    int
	lastExit  string
	functions map[string]bool
	stopped   bool
	stop      chan struct{}
	done      chan struct{}
}

// generation is one executor process of a tenant.
type generation struct {
	p   *proc
	n   int
	pid int // set once started, under p.mu

	mu       sync.Mutex
	peer     *handoff.Peer // nil once ended
	ended    bool
	why      string            // how it ended
	sessions map[uint64]func() // done of every session handed to it
	implicit map[string]func() // release of every implicit binding it holds
	gone     chan struct{}     // closed when it ended
	faulted  bool              // a kernel of the tenant faulted in it (health.go)
	checks   map[int]bool      // GPUs checked once it ended (health.go)
	// images are the module image bytes it reserved, imagesEnded says it reserves no more (Plane.imu guards both).
	images      uint64
	imagesEnded bool
}

// live returns the peer of a generation still running, or nil (also as soon as its control socket ended, before
// its process was reaped).
func (g *generation) live() *handoff.Peer {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended || g.peer == nil || g.peer.Err() != nil {
		return nil
	}
	return g.peer
}

func newProc(pl *Plane, tenant string, slot int) *proc {
	return &proc{pl: pl, tenant: tenant, slot: slot, dir: filepath.Join(pl.cfg.RepositoryDir, dirName(tenant)),
		up: make(chan struct{}), state: "starting", functions: map[string]bool{}, stop: make(chan struct{}),
		done: make(chan struct{})}
}

// waitUp returns the running executor, waiting for it to (re)start until ctx ends.
func (p *proc) waitUp(ctx context.Context) (*generation, *handoff.Peer, error) {
	for {
		p.mu.Lock()
		up, g, stopped, last := p.up, p.cur, p.stopped, p.lastExit
		p.mu.Unlock()
		if stopped {
			return nil, nil, fmt.Errorf("%w: the executor of %s is stopped", ErrExecutorDown, p.tenant)
		}
		select {
		case <-up:
			if g != nil {
				if peer := g.live(); peer != nil {
					return g, peer, nil
				}
			}
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("%w: the executor of %s is not up (%s): %w", ErrExecutorDown, p.tenant, last,
				ctx.Err())
		}
		// it ended between up and now: wait for the next one
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// call sends a request of op to p's running executor (waiting for it to be up) and returns the answer.
func call[Req, Ans any](ctx context.Context, p *proc, op handoff.Op[Req, Ans], req Req) (Ans, error) {
	_, peer, err := p.waitUp(ctx)
	if err != nil {
		var none Ans
		return none, err
	}
	return op.Call(ctx, peer, req)
}

// run supervises the executor until stopped.
func (p *proc) run() {
	defer close(p.done)
	backoff := time.Duration(0)
	for {
		started := time.Now()
		why := p.runOnce()
		ran := time.Since(started)
		p.mu.Lock()
		stopped := p.stopped
		if !stopped {
			p.restarts++
			p.lastExit = why
			p.state = "backoff"
		}
		p.mu.Unlock()
		if stopped {
			return
		}
		switch {
		case ran >= p.pl.cfg.StableAfter || backoff == 0:
			backoff = p.pl.cfg.BackoffMin
		default:
			backoff = min(2*backoff, p.pl.cfg.BackoffMax)
		}
		p.pl.metrics.restarts.WithLabelValues(p.tenant).Inc()
		p.pl.log.Error("tenant executor ended: restarting it", "tenant", p.tenant, "why", why,
			"ran", ran.Round(time.Millisecond), "restart_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-p.stop:
			t.Stop()
			return
		}
	}
}

// runOnce starts one executor and returns how it ended.
func (p *proc) runOnce() string {
	cfg := p.pl.cfg
	p.mu.Lock()
	p.gens++
	g := &generation{p: p, n: p.gens, sessions: map[uint64]func(){}, implicit: map[string]func(){},
		gone: make(chan struct{})}
	p.cur, p.state = g, "starting"
	fns := make([]handoff.Function, 0, len(p.functions))
	for name := range p.functions {
		fns = append(fns, handoff.Function{Name: name, Tenant: p.tenant})
	}
	p.mu.Unlock()
	defer p.ended(g)
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return fmt.Sprintf("repository directory: %v", err)
	}
	parent, child, err := handoff.Socketpair()
	if err != nil {
		return err.Error()
	}
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.ExtraFiles = []*os.File{child} // fd 3 (handoff.FileFD)
	cmd.Stdout, cmd.Stderr = cfg.Stderr, cfg.Stderr
	// Its own process group (a signal to the gpuserver's terminal does not reach it first), and SIGKILL when the
	// gpuserver dies: no executor outlives its gpuserver.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		child.Close()
		parent.Close()
		return fmt.Sprintf("start %s: %v", cfg.Command[0], err)
	}
	child.Close()
	p.mu.Lock() // Tenants and PID read it under p.mu
	g.pid = cmd.Process.Pid
	p.mu.Unlock()
	// Under memory pressure the kernel's OOM killer should pick an executor (one tenant) before the gpuserver
	// (every tenant): best effort, as the gpuserver's user may not lower its own score.
	_ = os.WriteFile(filepath.Join("/proc", strconv.Itoa(g.pid), "oom_score_adj"), []byte("500"), 0)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	peer := handoff.NewPeer(parent, p.pl.handlers(g), handoff.Codes, p.pl.log.With("tenant", p.tenant))
	served := make(chan struct{})
	go func() { defer close(served); _ = peer.Serve(p.pl.ctx) }()
	g.mu.Lock()
	g.peer = peer
	g.mu.Unlock()

	base, size := p.pl.plan.window(p.slot)
	start := handoff.Start{Tenant: p.tenant, Generation: g.n, Device: cfg.Executor, ChunkSize: p.pl.mem.ChunkSize(),
		Chunks: p.pl.chunks, WindowBase: base, WindowSize: size, RepositoryDir: p.dir, GroupBytes: cfg.GroupBytes,
		LogLevel: cfg.LogLevel, Functions: fns}
	sctx, cancel := context.WithTimeout(p.pl.ctx, cfg.StartTimeout)
	_, err = handoff.OpStart.Call(sctx, peer, start)
	cancel()
	if err != nil {
		_ = cmd.Process.Kill()
		_ = peer.Close()
		<-served
		return fmt.Sprintf("did not start: %v (%s)", err, exitText(<-exited))
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		_ = peer.Close()
		<-served
		return stopExecutor(cmd, exited)
	}
	p.state = "up"
	close(p.up)
	p.mu.Unlock()
	p.pl.metrics.up.WithLabelValues(p.tenant).Set(1)
	p.pl.log.Info("tenant executor up", "tenant", p.tenant, "generation", g.n, "pid", g.pid,
		"functions", len(fns))
	select {
	case err := <-exited:
		_ = peer.Close()
		<-served
		return exitText(err)
	case <-served:
		// The control socket ended first (the gpuserver stops, or the executor closed it): the process must go.
		return stopExecutor(cmd, exited)
	}
}

// stopExecutor waits for an executor whose control socket closed to exit (it shuts down when it sees the socket
// end), killing it after a grace period.
func stopExecutor(cmd *exec.Cmd, exited chan error) string {
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case err := <-exited:
		return exitText(err)
	case <-t.C:
		_ = cmd.Process.Kill()
		return exitText(<-exited) + " (killed after its control socket closed)"
	}
}

// exitText says how a process ended.
func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			switch {
			case ws.Signaled():
				return "killed by signal " + ws.Signal().String()
			case ws.ExitStatus() == exitFault:
				return "ended after a kernel fault of the tenant (exit status 3)"
			}
			return fmt.Sprintf("exit status %d", ws.ExitStatus())
		}
	}
	if err != nil {
		return err.Error()
	}
	return "exit status 0"
}

// exitFault mirrors tenantexec.ExitFault (the executor's package imports this one's hand-off, not the reverse).
const exitFault = 3

// ended tells everything that depended on g that it ended: its sessions end (their functions' limits count them
// no more), its implicit bindings are released, its chunks return (to be zeroed before they are lent again), and
// bindings held on it answer that they broke.
func (p *proc) ended(g *generation) {
	g.mu.Lock()
	g.ended = true
	g.why = "ended"
	sessions, implicit := g.sessions, g.implicit
	g.sessions, g.implicit = nil, nil
	close(g.gone)
	g.mu.Unlock()
	p.mu.Lock()
	if p.cur == g {
		p.cur = nil
		select {
		case <-p.up:
			p.up = make(chan struct{})
		default:
		}
	}
	p.mu.Unlock()
	p.pl.metrics.up.WithLabelValues(p.tenant).Set(0)
	for _, done := range sessions {
		done()
	}
	for _, release := range implicit {
		release()
	}
	p.pl.lend.takeAll(g)
	p.pl.releaseImages(g, 0, true)
}

// shutdown stops supervising and ends the executor.
func (p *proc) shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		<-p.done
		return nil
	}
	p.stopped = true
	p.state = "stopped"
	close(p.stop)
	g := p.cur
	p.mu.Unlock()
	if g != nil {
		if peer := g.live(); peer != nil {
			_ = peer.Close()
		}
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the executor of %s did not end: %w", p.tenant, ctx.Err())
	}
}
