package remoting

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// CUDA graphs (shim/src/graph.c is the client's half).
//
// On the device. A graph launch is one record on the wire; on the GPU the session launches it as one operation too
// where the device can (device.GraphCapture: CUDA's stream capture on the cuda backend, a recorded operation list on
// the sim): at the first launch on a GPU and context, the nodes are made once on a stream of the function's context
// that captures instead of running, the result instantiated and kept, and every later launch there is one graph
// launch after the function's segments are ready. A device that cannot capture a node leaves the graph to be
// replayed call by call.
//
// While a client stream captures (streamBeginCapture), the session records the asynchronous work the function
// issues on it (kernel launches, memsets, device-to-device copies; the streams that join the capture by waiting on
// an event recorded in it) instead of running it: each recorded node is the same call with its arguments copied,
// to be made again later. streamEndCapture turns the recording into a graph; instantiating copies it into an
// executable graph, and cuGraphLaunch (one record) makes every recorded call again, in order, on the function's
// stream: through the same paths as the calls themselves, so the bound GPU, the segment gates of a swap still
// landing, the translation of module globals and the ownership checks of every pointer apply at each launch, on
// whichever GPU the function runs then. The session's streams run in order on one device stream, so a recorded
// order is a valid order of the graph's dependencies.
//
// What a capture cannot hold invalidates it, as the driver does: host-to-device or device-to-host copies on the
// capturing stream, a synchronisation of it (or of the context, or a synchronous call on the legacy stream, while a
// capture in global mode is under way). The offending call answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (or
// _IMPLICIT), and streamEndCapture answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED with no graph. Every graph is
// bounded in nodes and bytes.

// Results of the graph calls (CUresult values).
const (
	ResultStreamCaptureUnsupported Result = 900
	ResultStreamCaptureInvalidated Result = 901
	ResultStreamCaptureImplicit    Result = 906
)

// Limits of one session's graphs: a function is not trusted with the gpuserver's memory.
const (
	maxGraphNodes  = 1 << 16  // nodes of one graph
	maxGraphBytes  = 64 << 20 // argument bytes recorded in one graph
	maxGraphs      = 4096     // graphs and executable graphs alive in one session
	captureGlobal  = 0        // CU_STREAM_CAPTURE_MODE_GLOBAL
	captureRelaxed = 2        // CU_STREAM_CAPTURE_MODE_RELAXED
)

// CUgraphExecUpdateResult values answered by graphExecUpdate.
const (
	updateSuccess         = 0
	updateTopologyChanged = 2
	updateNodeTypeChanged = 3
	updateFunctionChanged = 4
)

// graphNode is one recorded call: kind names it (for updates and errors), fn is the kernel of a launch, and run
// makes the call again on a stream that does not capture. check, when set, checks again that the function still
// owns every address the node touches (checkReplay).
type graphNode struct {
	kind  string
	fn    uint64
	bytes int
	run   func(ctx context.Context, stream uint64) Result
	check func() Result
}

// Ownership at replay. A device graph is captured once per GPU and context and then launched as one operation, so
// the checks its nodes' calls made at capture (owns, on every copy and memset) are not made again by its later
// launches; and the function may free a buffer between two launches. So every launch of an executable graph
// first checks each node again (checkReplay), as the calls themselves check: the ranges of its copies and memsets,
// and for a kernel every 8-byte argument that was an address of the function's own memory when it was recorded
// (an allocation or a module global): freed since, the launch answers CUDA_ERROR_INVALID_VALUE and runs nothing,
// where it would have made the kernel touch memory that is no longer the function's (a fault of its tenant, or
// another function's bytes once the address is reused).

// checkReplay checks every node of x before a launch: the first that touches memory the function no longer owns
// answers its refusal.
func (h *deviceHandler) checkReplay(x *execGraph) Result {
	for i, n := range x.nodes {
		if n.check == nil {
			continue
		}
		if r := n.check(); r != ResultSuccess {
			h.log.Warn("remoting: graph launch refused: a node touches memory the function no longer owns",
				"node", i, "kind", n.kind, "result", r)
			return r
		}
	}
	return ResultSuccess
}

// ownsCheck is the check of a node that touches [p, p+n) of each range given as p, n pairs.
func (h *deviceHandler) ownsCheck(call string, ranges ...uint64) func() Result {
	return func() Result {
		for i := 0; i+1 < len(ranges); i += 2 {
			if !h.owns(ranges[i], ranges[i+1]) {
				return h.refuse(call, ranges[i], ranges[i+1])
			}
		}
		return ResultSuccess
	}
}

// kernelCheck is the check of a recorded launch of fn with args: every 8-byte argument that is an address of the
// function's memory now (at the recording) must still be at each launch. Nil when there is none.
func (h *deviceHandler) kernelCheck(fn *function, args []byte) func() Result {
	var ptrs []uint64
	for _, p := range fn.params {
		if p.Size != 8 || int(p.Offset)+8 > len(args) {
			continue
		}
		if v := binary.LittleEndian.Uint64(args[p.Offset:]); h.findAllocation(v) >= 0 {
			ptrs = append(ptrs, v)
		}
	}
	if len(ptrs) == 0 {
		return nil
	}
	return func() Result {
		for _, v := range ptrs {
			if h.findAllocation(v) < 0 {
				return h.refuse("cuGraphLaunch: a kernel's argument", v, 1)
			}
		}
		return ResultSuccess
	}
}

// capture is a recording under way on an origin stream (and the streams that joined it).
type capture struct {
	origin  uint64
	mode    uint32
	nodes   []graphNode
	bytes   int
	cost    uint64 // charged to the function's graph budget for nodes (functionBudgets)
	invalid error  // why the capture cannot become a graph (nil while it can)
}

// graphs is a session's capture and graph state (a field of deviceHandler).
type graphs struct {
	captures map[uint64]*capture // by client stream: the origin and the streams that joined
	events   map[uint64]*capture // events recorded on a capturing stream: a wait on one joins its capture
	graphs   map[uint64][]graphNode
	execs    map[uint64]*execGraph
	// devCapture, while set, is the device stream a device graph is being captured on: the calls the nodes make
	// go there (bind answers it).
	devCapture device.Stream
	// charged is what the session's captures, graphs and executable graphs are charged in the function's graph
	// budget (given back when the session ends).
	charged uint64
}

// execGraph is an executable graph: its nodes, and the device graphs captured from them per GPU and context (a
// graph launch is then one operation on the device too).
type execGraph struct {
	nodes    []graphNode
	dev      map[graphKey]device.GraphExec
	noDevice bool // the device cannot capture these nodes: replay them call by call
}

type graphKey struct {
	gpu int
	ctx device.Context
}

// drop destroys the device graphs of x.
func (x *execGraph) drop() {
	for k, d := range x.dev {
		_ = d.Destroy()
		delete(x.dev, k)
	}
}

func (g *graphs) init() {
	if g.captures == nil {
		g.captures, g.events = map[uint64]*capture{}, map[uint64]*capture{}
		g.graphs, g.execs = map[uint64][]graphNode{}, map[uint64]*execGraph{}
	}
}

// capturing returns the capture stream s records into, nil when it does not capture.
func (g *graphs) capturing(s uint64) *capture { return g.captures[s] }

// globalCapture returns a capture in global mode under way, nil if none: it forbids synchronisations of the
// context and synchronous calls on the legacy stream.
func (g *graphs) globalCapture() *capture {
	for _, c := range g.captures {
		if c.mode == captureGlobal && c.invalid == nil {
			return c
		}
	}
	return nil
}

// invalidate records why c cannot become a graph and returns code for the offending call.
func (c *capture) invalidate(code Result, format string, args ...any) Result {
	if c.invalid == nil {
		c.invalid = fmt.Errorf(format, args...)
	}
	return code
}

// record adds a node to c, or invalidates c when it is full, and reports whether it added it. The calls recorded
// are asynchronous: what went wrong is reported when the capture ends.
func (c *capture) record(n graphNode) bool {
	if c.invalid != nil {
		return false
	}
	if len(c.nodes) >= maxGraphNodes || c.bytes+n.bytes > maxGraphBytes {
		c.invalidate(ResultOutOfMemory, "the graph exceeds %d nodes or %d bytes of arguments", maxGraphNodes,
			maxGraphBytes)
		return false
	}
	c.nodes = append(c.nodes, n)
	c.bytes += n.bytes
	return true
}

// recordNode records n into c, charged to the function's graph budget; a node beyond the budget invalidates c.
func (h *deviceHandler) recordNode(c *capture, n graphNode) {
	if c.invalid != nil {
		return
	}
	cost := graphNodeOverhead + uint64(n.bytes)
	if !h.chargeGraph(cost) {
		c.invalidate(ResultOutOfMemory, "the function's graphs would take more than %d bytes of memory "+
			"(MaxGraphBytesPerFunction)", h.budgets.maxGraph)
		return
	}
	if !c.record(n) {
		h.unchargeGraph(cost)
		return
	}
	c.cost += cost
}

// chargeGraph charges n bytes of graphs to the function (all its sessions together) when they fit its bound.
func (h *deviceHandler) chargeGraph(n uint64) bool {
	if !h.budgets.chargeGraph(h.info.Function, n) {
		return false
	}
	h.g.charged += n
	return true
}

func (h *deviceHandler) unchargeGraph(n uint64) {
	n = min(n, h.g.charged)
	h.g.charged -= n
	h.budgets.unchargeGraph(h.info.Function, n)
}

// captured records a call on stream s when s captures: it returns ResultSuccess and true; false when s does not
// capture (the call runs as usual).
func (h *deviceHandler) captured(s uint64, n graphNode) (Result, bool) {
	c := h.g.capturing(s)
	if c == nil {
		return ResultSuccess, false
	}
	h.recordNode(c, n)
	return ResultSuccess, true
}

// refuseInCapture invalidates the capture of stream s (and answers code) when s captures, or, for a call that
// synchronises the context or the legacy stream (legacy true), when a capture in global mode is under way. An
// asynchronous call answers ResultSuccess instead (asyncRefused): its refusal is reported when the capture ends,
// as CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, not at an unrelated synchronisation after it.
func (h *deviceHandler) refuseInCapture(call string, s uint64, legacy bool) (Result, bool) {
	if c := h.g.capturing(s); c != nil {
		return c.invalidate(ResultStreamCaptureUnsupported, "%s on the capturing stream", call), true
	}
	if legacy || s == 0 || s == 1 {
		if c := h.g.globalCapture(); c != nil {
			return c.invalidate(ResultStreamCaptureImplicit, "%s while a capture in global mode is under way", call),
				true
		}
	}
	return ResultSuccess, false
}

// asyncRefused is refuseInCapture for an asynchronous call.
func (h *deviceHandler) asyncRefused(call string, s uint64, legacy bool) bool {
	_, ok := h.refuseInCapture(call, s, legacy)
	return ok
}

func (h *deviceHandler) StreamBeginCapture(_ context.Context, s uint64, mode uint32) Result {
	h.g.init()
	switch {
	case !h.validStream(s):
		return ResultInvalidHandle
	case s == 0 || s == 1:
		return ResultStreamCaptureUnsupported // the legacy stream synchronises with every other: it cannot capture
	case mode > captureRelaxed:
		return ResultInvalidValue
	case h.g.captures[s] != nil:
		return ResultIllegalState
	case len(h.g.graphs)+len(h.g.execs) >= maxGraphs:
		return ResultOutOfMemory
	}
	h.g.captures[s] = &capture{origin: s, mode: mode}
	return ResultSuccess
}

func (h *deviceHandler) StreamEndCapture(_ context.Context, s uint64) (uint64, uint64, Result) {
	h.g.init()
	c := h.g.captures[s]
	if c == nil {
		return 0, 0, ResultIllegalState
	}
	if c.origin != s {
		return 0, 0, c.invalidate(ResultStreamCaptureInvalidated, "the capture ended on a joined stream, not its origin")
	}
	for st, cc := range h.g.captures { // the origin and every stream that joined it leave the capture
		if cc == c {
			delete(h.g.captures, st)
		}
	}
	for e, cc := range h.g.events {
		if cc == c {
			delete(h.g.events, e)
		}
	}
	if c.invalid != nil {
		h.unchargeGraph(c.cost)
		h.log.Info("remoting: stream capture invalidated", "err", c.invalid)
		return 0, 0, ResultStreamCaptureInvalidated
	}
	id := h.handle()
	h.g.graphs[id] = c.nodes
	return id, uint64(len(c.nodes)), ResultSuccess
}

func (h *deviceHandler) CuGraphInstantiateWithFlags(_ context.Context, graph, _ uint64) (uint64, Result) {
	h.g.init()
	nodes, ok := h.g.graphs[graph]
	if !ok {
		return 0, ResultInvalidValue
	}
	if len(h.g.graphs)+len(h.g.execs) >= maxGraphs || !h.chargeGraph(nodesCost(nodes)) {
		return 0, ResultOutOfMemory
	}
	id := h.handle()
	h.g.execs[id] = &execGraph{nodes: append([]graphNode(nil), nodes...), dev: map[graphKey]device.GraphExec{}}
	return id, ResultSuccess
}

// CuGraphLaunch makes the recorded calls again, in order, on stream s. Launched into a capturing stream, the
// executable graph's nodes are recorded into that capture (a child graph).
func (h *deviceHandler) CuGraphLaunch(ctx context.Context, exec, s uint64) Result {
	h.g.init()
	x, ok := h.g.execs[exec]
	if !ok {
		return ResultInvalidValue
	}
	if !h.validStream(s) {
		return ResultInvalidHandle
	}
	if c := h.g.capturing(s); c != nil {
		for _, n := range x.nodes {
			h.recordNode(c, n)
		}
		return ResultSuccess
	}
	if r := h.checkReplay(x); r != ResultSuccess {
		return r
	}
	if r, ok := h.launchDeviceGraph(ctx, x, s); ok {
		return r
	}
	for i, n := range x.nodes {
		if r := n.run(ctx, s); r != ResultSuccess {
			h.log.Debug("remoting: graph node failed", "node", i, "kind", n.kind,
				"result", r)
			return r
		}
	}
	return ResultSuccess
}

// CuGraphUpload has nothing to do: an executable graph is ready once instantiated.
func (h *deviceHandler) CuGraphUpload(_ context.Context, exec, s uint64) Result {
	h.g.init()
	if _, ok := h.g.execs[exec]; !ok {
		return ResultInvalidValue
	}
	if !h.validStream(s) {
		return ResultInvalidHandle
	}
	return ResultSuccess
}

// GraphExecUpdate gives an executable graph the parameters of graph when both have the same nodes (kinds, and
// kernels for launches), as cuGraphExecUpdate does; otherwise it answers why not and changes nothing.
func (h *deviceHandler) GraphExecUpdate(_ context.Context, exec, graph uint64) (uint32, Result) {
	h.g.init()
	x, ok := h.g.execs[exec]
	nodes, ok2 := h.g.graphs[graph]
	if !ok || !ok2 {
		return 0, ResultInvalidValue
	}
	old := x.nodes
	if len(old) != len(nodes) {
		return updateTopologyChanged, ResultSuccess
	}
	for i := range old {
		switch {
		case old[i].kind != nodes[i].kind:
			return updateNodeTypeChanged, ResultSuccess
		case old[i].fn != nodes[i].fn:
			return updateFunctionChanged, ResultSuccess
		}
	}
	if !h.chargeGraph(nodesCost(nodes)) {
		return 0, ResultOutOfMemory
	}
	h.unchargeGraph(nodesCost(old))
	x.nodes = append([]graphNode(nil), nodes...)
	x.drop() // captured from the old parameters
	x.noDevice = false
	return updateSuccess, ResultSuccess
}

func (h *deviceHandler) CuGraphDestroy(_ context.Context, graph uint64) Result {
	h.g.init()
	nodes, ok := h.g.graphs[graph]
	if !ok {
		return ResultInvalidValue
	}
	h.unchargeGraph(nodesCost(nodes))
	delete(h.g.graphs, graph)
	return ResultSuccess
}

func (h *deviceHandler) CuGraphExecDestroy(_ context.Context, exec uint64) Result {
	h.g.init()
	x, ok := h.g.execs[exec]
	if !ok {
		return ResultInvalidValue
	}
	x.drop()
	h.unchargeGraph(nodesCost(x.nodes))
	delete(h.g.execs, exec)
	return ResultSuccess
}

// eventRecordedInCapture notes an event recorded on a capturing stream (no node: within the graph, order is the
// recording's), so that a stream waiting on it joins the capture.
func (h *deviceHandler) eventRecordedInCapture(e, s uint64) bool {
	c := h.g.capturing(s)
	if c == nil {
		delete(h.g.events, e)
		return false
	}
	h.g.events[e] = c
	return true
}

// waitJoinsCapture makes stream s join the capture whose stream recorded e (a fork inside the graph).
func (h *deviceHandler) waitJoinsCapture(s, e uint64) {
	if c, ok := h.g.events[e]; ok && h.g.captures[s] == nil {
		h.g.captures[s] = c
	}
}

// graphLauncher is the function's executor stream when it can launch device graphs (executor.Stream).
type graphLauncher interface {
	LaunchGraph(g device.GraphExec) error
}

// launchDeviceGraph launches x as one device graph on the bound GPU, capturing it there first (from its nodes, on a
// stream of the function's context of its own) when it has none for this GPU and context. It answers false when the
// device cannot (its streams do not capture, or a node cannot be captured): the caller replays the nodes.
func (h *deviceHandler) launchDeviceGraph(ctx context.Context, x *execGraph, s uint64) (Result, bool) {
	if x.noDevice {
		return ResultSuccess, false
	}
	st, r := h.bind(ctx)
	if r != ResultSuccess {
		return r, true
	}
	gl, ok := st.(graphLauncher)
	if !ok {
		x.noDevice = true
		return ResultSuccess, false
	}
	dc, err := h.context(h.gpu)
	if err != nil {
		return result(err), true
	}
	key := graphKey{gpu: h.gpu, ctx: dc}
	dg, ok := x.dev[key]
	if !ok {
		if dg, r = h.captureDevice(ctx, x, dc, s); dg == nil {
			return r, r != ResultSuccess
		}
		x.dev[key] = dg
	}
	return result(gl.LaunchGraph(dg)), true
}

// captureDevice captures x's nodes on a new stream of context dc. It answers a nil graph and ResultSuccess when the
// device cannot capture them (x.noDevice is set), or a nil graph and the error of a node that failed.
func (h *deviceHandler) captureDevice(ctx context.Context, x *execGraph, dc device.Context, s uint64) (device.GraphExec, Result) {
	cs, err := dc.NewStream()
	if err != nil {
		return nil, result(err)
	}
	defer func() { _ = cs.Destroy() }()
	gc, ok := cs.(device.GraphCapture)
	if !ok {
		x.noDevice = true
		return nil, ResultSuccess
	}
	if err := gc.BeginCapture(); err != nil {
		h.log.Info("remoting: the device cannot capture a graph; replaying it call by call", "err", err)
		x.noDevice = true
		return nil, ResultSuccess
	}
	h.g.devCapture = cs
	var failed Result
	for _, n := range x.nodes {
		if r := n.run(ctx, s); r != ResultSuccess {
			failed = r
			break
		}
	}
	h.g.devCapture = nil
	dg, err := gc.EndCapture()
	if failed == ResultSuccess && err == nil {
		return dg, ResultSuccess
	}
	if dg != nil {
		_ = dg.Destroy()
	}
	h.log.Info("remoting: capturing a graph on the device failed; replaying it call by call", "result", failed,
		"err", err)
	x.noDevice = true
	return nil, ResultSuccess
}
