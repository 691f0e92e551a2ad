// Package remoting is the gpuserver's side of CUDA remoting: it accepts the shim's connections (the replacement
// libcuda.so.1 in a function's process), checks the function's identity, decodes the call records the shim writes
// into a shared-memory ring, and executes them on the GPU the function is bound to.
//
// # Transport (docs/design.md, decision 5)
//
// A Unix stream socket carries the hello and one-byte doorbells. The hello names the function and its token
// (FAAS_GPU_FUNCTION, FAAS_GPU_TOKEN: the token handed out when the function was registered) and passes a sealed
// memfd (SCM_RIGHTS): a control block, a request ring of call records and a response area. The server checks the
// magic number, the protocol version (the major must match; a client minor above the server's is refused), the
// identity and the memfd's seals (it cannot shrink under the server), and answers with the device the function
// sees: one GPU whose memory is the function's quota. A refusal carries a status and a message that the shim logs.
//
// Launches, async copies, memsets and event records are fire-and-forget: the shim batches them and publishes the
// ring's tail at the next synchronous call; an error of an async call is reported by the next synchronising call
// (cuCtxSynchronize, cuStreamSynchronize, synchronous copies, ...). Both sides spin briefly before sleeping on the
// socket, and the other side rings only when the waiting flag is set.
//
// The wire format (record header, control block, hello) and the per-call encoders and decoders are generated from
// shim/api/cuda.api by shim/gen; calls_gen.go is the Go half. Tests pin the layout against records the C shim
// wrote (shim/testdata/records.golden).
//
// # Sessions
//
// A session is one connection of one function process. Calls that touch the GPU run on the GPU the function is
// bound to: the GPU of its request in flight (Binder.CurrentGPU, between acquire and release), otherwise an
// implicit binding (Binder.BindImplicit) held while initialisation calls arrive and released when the session is
// idle (its queued work waited for first; a fault found then, where no call answers, is the answer of the
// function's next call that binds or waits, never success). Everything runs on the node's executors (package executor): blocks come from the function's fixed-address
// space (Node.AllocSegment: model blocks until its initialisation ends, scratch after), so kernel arguments pass
// through unchanged; copies, memsets, launches and event records go through the function's executor stream
// (Node.Stream), which waits per segment for a swap still landing; when the binding names another GPU the node
// swaps the function there (peer copy from a GPU holding it, else the host image). The first request ends the
// initialisation (Node.EndInit: the model blocks become the function's image); a process started later is
// initialising until its own first request, or, when it says so (lifecycle.go), until it says its initialisation
// ended: the blocks it allocates meanwhile stay the function's whatever its scratch mode. Module globals, which
// live at a different address on each GPU, keep the address the function first got (cuModuleGetGlobal) and are
// translated to the current GPU's in copies, memsets and kernel arguments; their bytes follow the function when it
// moves.
// Every pointer of a copy or memset must lie inside one of the session's own allocations or globals, so a
// function cannot read or write another's memory through the API. When a function's last process hangs up, the
// node forgets its memory (Node.Reset), so its next process initialises afresh.
package remoting
