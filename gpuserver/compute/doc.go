// Package compute shares a GPU's compute between co-located bindings by tokens (docs/design.md, decision 11;
// Dilu's design): a per-GPU Arbiter issues each binding's Gate tokens every period (DefaultPeriod, 5 ms) in
// proportion to the binding's current share, and the gate, in the tenant executor's launch path (Gated: kernel
// launches, graph launches, memsets, device-to-device copies), releases work only while the binding has tokens
// left. A binding whose function asked for the whole GPU (the default, pool.FunctionSpec.Exclusive) gets no gate:
// its launches pass untouched and cost nothing.
//
// # Tokens
//
// Tokens are GPU time: the time the binding's work occupies the GPU's compute engine, as its stream measures it
// (device.ComputeMeter; on the timed virtual GPU the modelled time of each kernel). Thread blocks, Dilu's unit, are
// known at launch but weigh a block of a tiny kernel like one of a long one; measured time is what a share of the
// GPU is, so it tracks the share exactly. Its price is that a launch's cost is known only once it is measured: the
// gate charges each admitted launch the binding's mean measured cost per launch until its measurement arrives, and
// a binding that overdraws (a kernel longer than its balance) carries the debt into the next periods, so that over a
// window the binding receives its share within one kernel.
//
// # Shares
//
// Each binding's share moves between its request and its limit (the function's com.openfaas.gpu.compute.request
// and .limit) by Dilu's four-state controller (controller.go), once per period: a binding that launched nothing
// in a period is idle and falls back to its request (lent to its neighbours until it launches again, when it runs at
// once on the period's tokens it kept and they give back what they borrowed); one whose
// last launch cycle (Gate.Cycle: one request's GPU work, an inference batch) stretched past EmergencyStretch times
// its target jumps to its limit (emergency); one held at its gate while the GPU has room grows multiplicatively
// (Increase) towards its limit; the others stay. The active bindings' shares never sum above 1: their requests come
// first (the controller admits co-runners only while the requests sum to at most 1), what is left is divided
// among those above their request.
//
// # Across processes
//
// Co-runners of different tenants run in different executor processes (decision 7). The gpuserver holds the
// decision: a Coordinator with one remote Arbiter per GPU over every tenant's shared bindings there runs the
// controller on the usage the executors report, and sends each executor its bindings' Grants every period (an
// Allotment over the control socket, executor.DataPlane.ComputeShares); an executor's gates issue tokens only when
// a grant arrives (Arbiter.Apply), so the tokens of a GPU's bindings in all processes never exceed one period's GPU
// time per period (remote.go). gpuserver/server/sharing.go joins each binding of a shared function before the data
// plane holds it and leaves at its release.
//
// # Long kernels
//
// The GPU does not preempt a kernel for a neighbour (decision 7 keeps co-runners in separate processes, whose
// kernels the driver time-slices): a kernel of length L admitted with a small balance holds the engine for L, and a
// neighbour's work waits behind it. The debt bounds what it does to the neighbour's share: the binding is held at
// its gate until its share has paid for L (L/share), so over any window of W >= L/share its neighbour receives its
// request less at most L/W; a single cycle of the neighbour stretches by at most L. A function whose kernels are
// longer than its SLO allows for should not share (its request should be 1).
package compute
