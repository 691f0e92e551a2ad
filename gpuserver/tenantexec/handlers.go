package tenantexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// The control and session hand-offs, executor side: each request of the gpuserver runs on the executor's Node
// as the gpuserver's in-process code ran it (package server's trackedPool, the controller's actuator).

func (p *process) registerFunction(ctx context.Context, fn handoff.Function) error {
	if fn.Tenant != p.cfg.Tenant {
		return fmt.Errorf("%w: %s belongs to %s, this executor serves %s", handoff.ErrProtocol, fn.Name, fn.Tenant,
			p.cfg.Tenant)
	}
	if err := p.node.Register(fn.Name); err != nil {
		return err
	}
	return p.node.SetTenant(ctx, fn.Name, fn.Tenant)
}

func (p *process) register(ctx context.Context, fn handoff.Function) (handoff.None, error) {
	return handoff.None{}, p.registerFunction(ctx, fn)
}

func (p *process) acquire(ctx context.Context, a handoff.Acquire) (handoff.None, error) {
	if a.Binding == "" {
		return handoff.None{}, fmt.Errorf("%w: acquire without a binding id", handoff.ErrProtocol)
	}
	ctx, err := p.binder.begin(ctx, a.Binding) // cancelled when the gpuserver abandons the hold
	if err != nil {
		return handoff.None{}, err
	}
	b, err := p.hold(ctx, a)
	if ferr := p.binder.finish(a.Binding, a.Request, b); ferr != nil {
		return handoff.None{}, errors.Join(ferr, err)
	}
	if err != nil {
		return handoff.None{}, err
	}
	if a.Request && p.srv != nil {
		p.srv.Wake(a.Function) // its sessions poll for the request's records at once
	}
	return handoff.None{}, nil
}

// hold is an Acquire's work on the Node.
func (p *process) hold(ctx context.Context, a handoff.Acquire) (*executor.Binding, error) {
	if a.Request { // the function's first request ends its initialisation (its model becomes its image)
		if err := p.node.EndInit(ctx, a.Function); err != nil {
			return nil, err
		}
	}
	return p.node.Acquire(ctx, a.Function, a.GPU, a.Source)
}

func (p *process) release(_ context.Context, r handoff.Release) (handoff.Released, error) {
	if r.Abandoned { // idempotent: whatever became of its Acquire, the binding is not held after it
		p.binder.abandon(r.Binding)
		return handoff.Released{}, nil
	}
	b := p.binder.take(r.Binding)
	if b == nil {
		return handoff.Released{}, fmt.Errorf("%w: %s", pool.ErrUnknownBinding, r.Binding)
	}
	out := handoff.Released{}
	if err := b.Err(); err != nil {
		e := p.peer.EncodeError(err)
		out.Broken = &e
	}
	b.Release()
	return out, nil
}

// expire ends a request's binding held too long (the maximum binding hold) as the in-process gpuserver does: the
// sessions stop running the function's calls on its GPU, its work is refused until the request releases the
// binding (whose release then answers that it broke), and what it queued is stopped after the grace.
func (p *process) expire(ctx context.Context, e handoff.Expire) (handoff.None, error) {
	grace := time.Duration(e.GraceNS)
	if e.Binding == "" || grace < 0 || grace > handoff.MaxExpireGrace {
		return handoff.None{}, fmt.Errorf("%w: expire binding %q with a grace of %s (at most %s)", handoff.ErrProtocol,
			e.Binding, grace, handoff.MaxExpireGrace)
	}
	b := p.binder.expire(e.Binding)
	if b == nil {
		return handoff.None{}, fmt.Errorf("%w: %s", pool.ErrUnknownBinding, e.Binding)
	}
	return handoff.None{}, p.node.Expire(ctx, b, grace, errors.New(e.Cause))
}

func (p *process) status(context.Context, handoff.None) (handoff.Status, error) {
	st := handoff.Status{GPUs: p.node.Status(), Images: p.node.Images(), Sessions: int(p.sessions.Load())}
	for g := range p.node.GPUs() {
		st.Borrowed = append(st.Borrowed, p.mem.Pool(g).Borrowed())
	}
	rs := p.srv.Stats()
	st.Records, st.Sleeps = rs.Records, rs.Sleeps
	if b, err := handoff.Encode(handoff.KindStatus, 0, 0, st); err != nil || len(b) > handoff.MaxBody-1024 {
		for i := range st.GPUs {
			st.GPUs[i].Resident, st.GPUs[i].Active = nil, nil
		}
		st.Truncated = true
	}
	return st, nil
}

func (p *process) reclaim(ctx context.Context, r handoff.Reclaim) (handoff.Reclaimed, error) {
	if r.GPU < 0 || r.GPU >= p.node.GPUs() || r.N <= 0 {
		return handoff.Reclaimed{}, fmt.Errorf("%w: reclaim %d chunks of gpu %d", handoff.ErrProtocol, r.N, r.GPU)
	}
	if r.Evict {
		if _, err := p.node.EvictIdle(ctx, r.GPU, r.N); err != nil {
			p.log.Warn("evict idle copies for another tenant", "gpu", r.GPU, "err", err)
		}
	}
	idx, err := p.mem.Pool(r.GPU).Reclaim(r.N)
	if err != nil {
		p.log.Warn("give chunks back", "gpu", r.GPU, "err", err)
	}
	return handoff.Reclaimed{GPU: r.GPU, Indexes: idx}, nil
}

// session adopts a connection the gpuserver checked; it answers once the session runs, and reports its end.
func (p *process) session(_ context.Context, s handoff.Session, files []*os.File) (handoff.None, []*os.File,
	error) {
	if len(files) != 2 {
		closeAll(files)
		return handoff.None{}, nil, fmt.Errorf("%w: a session with %d descriptors, want 2", handoff.ErrProtocol,
			len(files))
	}
	if s.Spec.Tenant() != p.cfg.Tenant {
		closeAll(files)
		return handoff.None{}, nil, fmt.Errorf("%w: a session of %s (%s) handed to the executor of %s", handoff.ErrProtocol,
			s.Function, s.Spec.Tenant(), p.cfg.Tenant)
	}
	conn, shm := files[0], files[1]
	p.sessions.Add(1)
	go func() {
		defer p.sessions.Add(-1)
		info := remoting.SessionInfo{Function: s.Function, Spec: s.Spec, PID: s.PID}
		if err := p.srv.Adopt(p.ctx, conn, shm, info, s.ShmSize); err != nil {
			p.log.Warn("adopt a session", "function", s.Function, "pid", s.PID, "err", err)
		}
		_ = handoff.EventSessionEnded.Notify(p.peer, handoff.SessionEnded{ID: s.ID, Function: s.Function})
	}()
	return handoff.None{}, nil, nil
}
