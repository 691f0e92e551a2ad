package cuda

import (
	"fmt"
	"sync/atomic"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

// Stream capture with the real driver (device.GraphCapture): cuStreamBeginCapture_v2 in relaxed mode,
// cuStreamEndCapture and cuGraphInstantiateWithFlags at the end, cuGraphLaunch per launch.

type graphExec struct {
	ctx  cu.Context
	e    cu.GraphExec
	gone atomic.Bool
}

func (g *graphExec) Destroy() error {
	if g.gone.Swap(true) {
		return nil
	}
	return wrap(cu.GraphExecDestroy(g.ctx, g.e))
}

func (s *stream) BeginCapture() error { return wrap(cu.CaptureBegin(s.ctx, s.s)) }

func (s *stream) EndCapture() (device.GraphExec, error) {
	e, err := cu.CaptureEnd(s.ctx, s.s)
	if err != nil {
		return nil, wrap(err)
	}
	return &graphExec{ctx: s.ctx, e: e}, nil
}

func (s *stream) LaunchGraph(g device.GraphExec) error {
	ge, ok := g.(*graphExec)
	if !ok || ge.ctx != s.ctx {
		return fmt.Errorf("%w: a graph of another context", device.ErrInvalidValue)
	}
	return wrap(cu.GraphLaunch(s.ctx, ge.e, s.s))
}

func (g *guardedStream) BeginCapture() error { return g.c.call(g.s.BeginCapture) }

func (g *guardedStream) EndCapture() (device.GraphExec, error) {
	var e device.GraphExec
	err := g.c.call(func() error {
		var err error
		e, err = g.s.EndCapture()
		return err
	})
	return e, err
}

func (g *guardedStream) LaunchGraph(e device.GraphExec) error {
	return g.c.call(func() error { return g.s.LaunchGraph(e) })
}

var (
	_ device.GraphCapture = (*stream)(nil)
	_ device.GraphCapture = (*guardedStream)(nil)
)
