package executor

import "github.com/faas-gpu/faas-gpu/gpuserver/device"

// ComputeGate is the launch path's hook for compute shares (gpuserver/compute, Registry.Wrap): given a function's
// stream on gpu (and the meter of the device stream under it), it returns the stream the function's work goes
// through: gated when the function holds a share of the GPU, st itself when it is bound exclusively. It is called
// with the node's lock held and must not call the node.
type ComputeGate func(function string, gpu int, st device.Stream, m device.ComputeMeter) (device.Stream, error)

// computeGated is Node.Stream's hook call: st through Config.ComputeGate, or st when there is none.
func (n *Node) computeGated(name string, st *Stream) (device.Stream, error) {
	if n.cfg.ComputeGate == nil {
		return st, nil
	}
	m, _ := st.s.(device.ComputeMeter)
	return n.cfg.ComputeGate(name, st.gpu, st, m)
}
