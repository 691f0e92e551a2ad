package executor

import (
	"context"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// ComputeGate is the launch path's hook for compute shares (gpuserver/compute, Registry.Wrap): given a function's
// stream on gpu (and the meter of the device stream under it), it returns the stream the function's work goes
// through: gated when the function holds a share of the GPU, st itself when it is bound exclusively. It is called
// with the node's lock held and must not call the node.
type ComputeGate func(function string, gpu int, st device.Stream, m device.ComputeMeter) (device.Stream, error)

// computeGated is Node.Stream's hook call: st through Config.ComputeGate, else through the gates the gpuserver's
// grants made (ComputeShares); st itself for a function that holds no share on its GPU.
func (n *Node) computeGated(name string, st *Stream) (device.Stream, error) {
	m, _ := st.s.(device.ComputeMeter)
	if n.cfg.ComputeGate != nil {
		return n.cfg.ComputeGate(name, st.gpu, st, m)
	}
	return n.shares.Wrap(name, st.gpu, st, m)
}

// ComputeShares implements DataPlane: the gates of gpu's shared bindings in this node take the gpuserver's grants
// (compute.Registry.Apply; tokens are issued only by them). A function granted a share gets its stream through
// its gate from then on (Stream); one never granted gets its stream untouched. Not with Config.ComputeGate (the
// gates are the hook's).
func (n *Node) ComputeShares(_ context.Context, a compute.Allotment) (compute.Report, error) {
	if n.cfg.ComputeGate != nil {
		return compute.Report{}, fmt.Errorf("%w: compute shares are the ComputeGate hook's", ErrInvalid)
	}
	if a.GPU < 0 || a.GPU >= len(n.execs) {
		return compute.Report{}, fmt.Errorf("%w: gpu %d", ErrInvalid, a.GPU)
	}
	rep, err := n.shares.Apply(a)
	if err != nil {
		return compute.Report{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return rep, nil
}
