package compute

import (
	"context"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// graphLauncher is a stream that launches instantiated graphs (the executor's, device.GraphCapture's).
type graphLauncher interface {
	LaunchGraph(g device.GraphExec) error
}

// Gated wraps a shared binding's stream so that its compute work (kernel launches, extended launches, graph
// launches, memsets, device-to-device copies) passes g first; copies to and from the host, events and
// synchronisation pass untouched (they take no compute). m measures the stream's work (device.ComputeMeter: the
// device stream under st); without one the binding is refused with ErrNotMetered rather than run unmetered. ctx
// bounds the waits at the gate (the binding's lifetime). An exclusive binding is never wrapped: its launches cost
// nothing more.
func Gated(ctx context.Context, st device.Stream, m device.ComputeMeter, g *Gate) (device.Stream, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: binding %s on gpu %d", ErrNotMetered, g.binding, st.GPU())
	}
	g.Attach(m)
	return &gatedStream{Stream: st, ctx: ctx, g: g, m: m}, nil
}

type gatedStream struct {
	device.Stream
	ctx context.Context
	g   *Gate
	m   device.ComputeMeter
}

var (
	_ device.ExtendedLauncher = (*gatedStream)(nil)
	_ device.ComputeMeter     = (*gatedStream)(nil)
	_ graphLauncher           = (*gatedStream)(nil)
)

func (s *gatedStream) Launch(f device.Function, grid, block device.Dim3, sharedMem uint32, args []byte) error {
	if err := s.g.Admit(s.ctx); err != nil {
		return err
	}
	return s.Stream.Launch(f, grid, block, sharedMem, args)
}

func (s *gatedStream) LaunchEx(f device.Function, grid, block device.Dim3, sharedMem uint32,
	attrs []device.LaunchAttribute, args []byte) error {
	xl, ok := s.Stream.(device.ExtendedLauncher)
	if !ok {
		return fmt.Errorf("%w: launch attributes on gpu %d", device.ErrNotSupported, s.GPU())
	}
	if err := s.g.Admit(s.ctx); err != nil {
		return err
	}
	return xl.LaunchEx(f, grid, block, sharedMem, attrs, args)
}

func (s *gatedStream) LaunchGraph(x device.GraphExec) error {
	gl, ok := s.Stream.(graphLauncher)
	if !ok {
		return fmt.Errorf("%w: the device's streams launch no graphs", device.ErrNotSupported)
	}
	if err := s.g.Admit(s.ctx); err != nil {
		return err
	}
	return gl.LaunchGraph(x)
}

func (s *gatedStream) Memset8(dst device.Ptr, v uint8, n uint64) error {
	if err := s.g.Admit(s.ctx); err != nil {
		return err
	}
	return s.Stream.Memset8(dst, v, n)
}

func (s *gatedStream) Memset32(dst device.Ptr, v uint32, n uint64) error {
	if err := s.g.Admit(s.ctx); err != nil {
		return err
	}
	return s.Stream.Memset32(dst, v, n)
}

func (s *gatedStream) CopyDtoD(dst, src device.Ptr, size uint64) error {
	if err := s.g.Admit(s.ctx); err != nil {
		return err
	}
	return s.Stream.CopyDtoD(dst, src, size)
}

// ComputeWork is the wrapped stream's.
func (s *gatedStream) ComputeWork() (uint64, time.Duration) {
	return s.m.ComputeWork()
}
