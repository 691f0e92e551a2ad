package remoting

import (
	"context"
)

// A process's own lifecycle (call processPhase, shim/src/lifecycle.c).
//
// A function's replicas share its memory on the node, and the calls of a replica that starts while another
// serves a request run under that request's binding (Binder.CurrentGPU): by the bindings alone, a replica started
// after the function's first request (a scale-up, a rolling update's new process) cannot be told initialising
// from serving. So a process may say so: phase 1 when its initialisation begins (the gpu-python template, before
// it imports the handler), phase 2 when it has ended. Between the two, the blocks it allocates are its
// initialisation's (executor.Initialising: after the function's capture they are the function's own whatever its
// scratch mode, never given back as a request's scratch or mapped zeroed) and the function's image is not
// captured (Node.BeginInit: a capture would miss what it writes afterwards into the blocks it already has). A
// process that says nothing is initialising until a request binds the function for its calls, as before.

// Phases of call processPhase.
const (
	phaseInitialising = 1
	phaseInitialised  = 2
)

// ProcessPhase records where the session's process is in its life.
func (h *deviceHandler) ProcessPhase(_ context.Context, phase uint32) Result {
	switch {
	case phase == phaseInitialising && !h.declared && !h.explicit:
		if err := h.node.BeginInit(h.info.Function); err != nil {
			return result(err)
		}
		h.declared = true
		return ResultSuccess
	case phase == phaseInitialised && h.declared:
		h.endInit()
		return ResultSuccess
	case phase == phaseInitialised && !h.declared:
		return ResultSuccess // nothing begun: its initialisation ends at its first request, as without the call
	}
	return ResultInvalidValue // declared twice, or after its calls served a request
}

// endInit ends the declared initialisation of the session's process (its phase 2, or the session's end).
func (h *deviceHandler) endInit() {
	if !h.declared || h.initialised {
		return
	}
	h.initialised = true
	h.node.FinishInit(h.info.Function)
}
