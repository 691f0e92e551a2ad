package sim

import (
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Stream capture on the simulated device (device.GraphCapture): while a stream captures, enqueue records the
// operations it would have queued; a graph launch queues them as one operation that runs them in order and takes
// their summed modelled time (on the GPU's compute engine in the timed mode).

type simGraph struct {
	b   *Backend
	gpu int
	who int
	ops []op
}

func (g *simGraph) Destroy() error { return nil }

// BeginCapture starts recording the stream's work.
func (s *stream) BeginCapture() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("%w: stream destroyed", device.ErrInvalidValue)
	}
	if s.capture != nil {
		return fmt.Errorf("%w: the stream is capturing already", device.ErrInvalidValue)
	}
	s.capture = &[]op{}
	return nil
}

// EndCapture ends the recording and returns it as a graph.
func (s *stream) EndCapture() (device.GraphExec, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capture == nil {
		return nil, fmt.Errorf("%w: the stream is not capturing", device.ErrInvalidValue)
	}
	ops, failed := *s.capture, s.captureErr
	s.capture, s.captureErr = nil, nil
	if failed != nil {
		return nil, failed
	}
	return &simGraph{b: s.b, gpu: s.gpu, who: s.who, ops: ops}, nil
}

// LaunchGraph queues a graph's operations as one.
func (s *stream) LaunchGraph(g device.GraphExec) error {
	sg, ok := g.(*simGraph)
	if !ok || sg.b != s.b || sg.gpu != s.gpu || sg.who != s.who {
		return fmt.Errorf("%w: a graph of another GPU or context", device.ErrInvalidValue)
	}
	return s.enqueue(op{kind: fmt.Sprintf("graph of %d operations", len(sg.ops)), compute: true,
		run: func() (time.Duration, error) {
			var total time.Duration
			for _, o := range sg.ops {
				d, err := runOp(o)
				if err != nil {
					return 0, fmt.Errorf("%s: %w", o.kind, err)
				}
				total += d
			}
			return total, nil
		}})
}

var _ device.GraphCapture = (*stream)(nil)
