package remoting

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// Binding: the GPU a session's calls run on, and moving the function there.

// Bound reports whether the function holds a binding: the session's implicit one, or a request's.
func (h *deviceHandler) Bound() bool {
	if h.release != nil {
		return true
	}
	_, ok := h.cfg.Binder.CurrentGPU(h.info.Function)
	return ok
}

// phase is where the session's process is in its life: initialising until it said its initialisation ended
// (lifecycle.go), or, when it never said it began, until a request bound the function for its calls (explicit); so
// that the blocks a process started after the function's first request allocates in its initialisation stay the
// function's whatever its scratch mode (executor.Initialising).
func (h *deviceHandler) phase() executor.Phase {
	if h.initialised || (h.explicit && !h.declared) {
		return executor.Serving
	}
	return executor.Initialising
}

// Idle releases the implicit binding (called by the session when no call arrived for Config.IdleRelease).
func (h *deviceHandler) Idle() {
	if h.release != nil {
		h.releaseImplicit(context.Background())
	}
}

// releaseImplicit waits for the work queued under the implicit binding, then releases it. No call answers that
// wait: a failure it finds (a fault of the work, which tears the stream down) is kept for the next call (lost).
func (h *deviceHandler) releaseImplicit(ctx context.Context) {
	h.keepLost(h.waitStream(ctx))
	h.release()
	h.release = nil
}

// syncStream waits for the session's work: a failure kept from a wait no call answered comes first (lost).
func (h *deviceHandler) syncStream(ctx context.Context) Result {
	if r := h.takeLost(); r != ResultSuccess {
		return r
	}
	return h.waitStream(ctx)
}

// waitStream waits for the work queued on the session's stream. A stream torn down with its tenant's context
// answers the fault (the executor's Stream reports the loss once) and is dropped: the next call binds afresh.
func (h *deviceHandler) waitStream(ctx context.Context) Result {
	if h.stream == nil {
		return ResultSuccess // nothing queued since the last answer
	}
	err := h.stream.Synchronize(ctx)
	if errors.Is(err, executor.ErrContextFault) {
		h.stream = nil // torn down with the tenant's context: the next call binds afresh
	}
	return result(err)
}

// keepLost keeps r, the answer of a wait that no call passes on, for the next call (the first failure kept wins).
func (h *deviceHandler) keepLost(r Result) {
	if r != ResultSuccess && h.lost == ResultSuccess {
		h.lost = r
	}
}

// takeLost returns the failure kept for the next call, once.
func (h *deviceHandler) takeLost() Result {
	r := h.lost
	h.lost = ResultSuccess
	return r
}

// bind returns the function's executor stream on the GPU its calls run on now, swapping it there if needed.
func (h *deviceHandler) bind(ctx context.Context) (device.Stream, Result) {
	if h.g.devCapture != nil { // a graph's nodes being captured on the device (graph.go)
		return h.g.devCapture, ResultSuccess
	}
	var gpu int
	if g, ok := h.cfg.Binder.CurrentGPU(h.info.Function); ok {
		if h.release != nil {
			// The work queued under the implicit binding is waited for before the request's binding serves the
			// function (and before its initialisation ends on it): a fault of it is this call's answer.
			h.keepLost(h.waitStream(ctx))
		}
		if r := h.takeLost(); r != ResultSuccess {
			return nil, r
		}
		if !h.explicit && (!h.declared || h.initialised) {
			// The function's first request: its initialisation is over (a no-op when the binder ended it). A
			// process that declared its initialisation (lifecycle.go) and has not ended it runs its calls under
			// another process's request: they are still its initialisation's.
			if err := h.node.EndInit(ctx, h.info.Function); err != nil {
				h.log.Error("remoting: end of initialisation", "gpu", g, "err", err)
				return nil, result(err)
			}
			h.explicit = true
		}
		if h.release != nil {
			h.release()
			h.release = nil
		}
		gpu = g
	} else {
		if h.release != nil && h.cfg.MaxImplicitHold > 0 && time.Since(h.boundAt) > h.cfg.MaxImplicitHold {
			// Calls outside a request kept the GPU this long: give it up and queue again behind the requests
			// waiting for one.
			h.releaseImplicit(ctx)
		}
		if r := h.takeLost(); r != ResultSuccess {
			return nil, r
		}
		if h.release == nil {
			g, rel, err := h.cfg.Binder.BindImplicit(ctx, h.info.Function)
			if err != nil {
				h.log.Warn("remoting: implicit binding", "err", err)
				if errors.Is(err, executor.ErrBroken) {
					return nil, result(err)
				}
				return nil, ResultSystemNotReady
			}
			h.implicit, h.release, h.boundAt = g, rel, time.Now()
		}
		gpu = h.implicit
	}
	if gpu == h.gpu && h.stream != nil && h.node.Active(h.info.Function) == gpu {
		return h.stream, ResultSuccess
	}
	if r := h.moveTo(ctx, gpu); r != ResultSuccess {
		return nil, r
	}
	return h.stream, ResultSuccess
}

// moveTo makes gpu the function's GPU: the node swaps it there (a no-op when the binder already did) and its
// globals follow it.
func (h *deviceHandler) moveTo(ctx context.Context, gpu int) Result {
	left := h.gpu >= 0 && !h.node.Healthy(h.gpu) // the GPU it leaves failed: nothing there to wait for or read
	if !left {
		if r := h.syncStream(ctx); r != ResultSuccess {
			return r
		}
	}
	if h.node.Active(h.info.Function) != gpu {
		if err := h.node.SwapIn(ctx, h.info.Function, gpu, executor.Any); err != nil {
			h.log.Error("remoting: swap in", "gpu", gpu, "err", err)
			return result(err)
		}
	}
	st, err := h.node.Stream(h.info.Function)
	if err != nil {
		return result(err)
	}
	if left && len(h.globals) > 0 {
		// Module globals live on one GPU only: those written on the failed GPU are lost (the trap docs/design.md ends
		// with), and no image holds them; going on with their initial values would compute wrong answers.
		return result(h.node.Lose(h.info.Function, fmt.Errorf("gpu %d failed holding the module globals the "+
			"function uses (%d)", h.gpu, len(h.globals))))
	}
	if h.gpu >= 0 && h.gpu != gpu && !left {
		if err := h.moveGlobals(ctx, h.gpu, gpu); err != nil {
			h.log.Error("remoting: move module globals", "gpu", gpu, "err", err)
			return result(err)
		}
	}
	h.gpu, h.stream = gpu, st
	return ResultSuccess
}

// moveGlobals copies the bytes of the module globals the function asked for from GPU from to GPU to.
func (h *deviceHandler) moveGlobals(ctx context.Context, from, to int) error {
	for _, g := range h.globals {
		src, err := h.globalOn(g, from)
		if err != nil {
			return err
		}
		dst, err := h.globalOn(g, to)
		if err != nil {
			return err
		}
		buf := make([]byte, g.size)
		if err := h.copyOnce(ctx, from, func(s device.Stream) error { return s.CopyDtoH(buf, src) }); err != nil {
			return fmt.Errorf("global %s from gpu %d: %w", g.name, from, err)
		}
		if err := h.copyOnce(ctx, to, func(s device.Stream) error { return s.CopyHtoD(dst, buf) }); err != nil {
			return fmt.Errorf("global %s to gpu %d: %w", g.name, to, err)
		}
	}
	return nil
}

func (h *deviceHandler) copyOnce(ctx context.Context, gpu int, f func(device.Stream) error) error {
	dc, err := h.context(gpu)
	if err != nil {
		return err
	}
	s, err := dc.NewStream()
	if err != nil {
		return err
	}
	err = f(s)
	if err == nil {
		err = s.Synchronize(ctx)
	}
	return errors.Join(err, s.Destroy())
}
