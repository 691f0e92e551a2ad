package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// The operations of the hand-off, each a request kind paired with the type of its body and of its answer: the one
// table of what crosses the control socket. A request is sent with its Op's Call and answered by the handler its Op
// made (Handle); an Event is one-way (Notify, Handle). A data-plane operation (PlaneOp, plane.go) also binds its
// kind to the executor.DataPlane method that answers it, so that its executor end is this table (PlaneRoutes).
//
// Adding a data-plane operation (a method of executor.DataPlane the gpuserver asks of a tenant's executor):
//
//  1. the method on executor.DataPlane (gpuserver/executor/seam.go), taking (ctx, Req) and answering error (or
//     (Ans, error)) where it can, Req a type of package executor;
//  2. its in-process end, the method on executor.Node;
//  3. its executor-client end, the method on tenant.Plane: one line sending the op to the function's executor
//     (toFunction), the tenant's (toTenant) or every one (toEvery);
//  4. its declaration here: a Kind (control.go, a number never used before) and one line below, Serve(kind,
//     executor.DataPlane.M) (ServeAnswer for an answer; a function unpacking the body where the method takes
//     several arguments), listed in planeOps;
//  5. its test: a call through the op that reaches the Node (plane_test.go), and the row in
//     docs/architecture.md's table of frames.
//
// Nothing else: package tenantexec serves every PlaneOp on its Node (PlaneRoutes), and the checks find a missing
// end: TestOpsListsEveryOperation (declared, not listed), TestEveryOperationHasACaller (never sent by package
// tenant), each side's TestEveryOperationHasItsHandler (CheckHandlers), test/docs' TestArchitectureNamesEveryFrame
// (not on the map), and the compiler (a DataPlane method without its Node or Plane end).
var (
	// gpuserver -> executor, answered by the executor's data plane (plane.go): no handler of their own.
	OpDeregister = Serve(KindDeregister, func(d executor.DataPlane, ctx context.Context, n Name) error {
		return d.Deregister(ctx, n.Function)
	})
	OpSwapIn = Serve(KindSwapIn, func(d executor.DataPlane, ctx context.Context, s SwapIn) error {
		if err := d.Register(s.Function); err != nil { // as the in-process actuator does before a swap
			return err
		}
		return d.SwapIn(ctx, s.Function, s.GPU, s.Source)
	})
	OpEvict = Serve(KindEvict, func(d executor.DataPlane, ctx context.Context, e Evict) error {
		return d.Evict(ctx, e.Function, e.GPU)
	})
	OpWaitReady = Serve(KindWaitReady, func(d executor.DataPlane, ctx context.Context, n Name) error {
		return d.WaitReady(ctx, n.Function)
	})
	OpMarkUnhealthy = Serve(KindMarkUnhealthy, func(d executor.DataPlane, _ context.Context, m MarkUnhealthy) error {
		if m.GPU < 0 || m.GPU >= d.GPUs() {
			return fmt.Errorf("%w: gpu %d", ErrProtocol, m.GPU)
		}
		d.MarkUnhealthy(m.GPU, fmt.Errorf("the gpuserver took it out of service: %s", m.Cause))
		return nil
	})
	OpComputeShares = ServeAnswer(KindComputeShares, executor.DataPlane.ComputeShares) // compute.go

	// gpuserver -> executor, answered by package tenantexec's own handlers (start.go, session.go, chunks.go,
	// control.go): what carries descriptors or the executor process's own bookkeeping.
	OpStart    = Op[Start, Started]{KindStart, ToExecutor}
	OpSession  = Op[Session, None]{KindSession, ToExecutor} // files: [connection, ring memfd]
	OpRegister = Op[Function, None]{KindRegister, ToExecutor}
	OpAcquire  = Op[Acquire, None]{KindAcquire, ToExecutor}
	OpRelease  = Op[Release, Released]{KindRelease, ToExecutor}
	OpExpire   = Op[Expire, None]{KindExpire, ToExecutor}
	OpStatus   = Op[None, Status]{KindStatus, ToExecutor}
	OpReclaim  = Op[Reclaim, Reclaimed]{KindReclaim, ToExecutor}

	// executor -> gpuserver.
	OpBorrow          = Op[Borrow, Lent]{KindBorrow, ToGPUServer} // answer's files: one per chunk
	OpReturn          = Op[Return, None]{KindReturn, ToGPUServer}
	OpReserveImages   = Op[ImageBytes, None]{KindReserveImages, ToGPUServer}
	OpReleaseImages   = Op[ImageBytes, None]{KindReleaseImages, ToGPUServer}
	OpBindImplicit    = Op[Name, Bound]{KindBindImplicit, ToGPUServer}
	OpReleaseImplicit = Op[Release, None]{KindReleaseImplicit, ToGPUServer}
	EventSessionEnded = Event[SessionEnded]{KindSessionEnded, ToGPUServer}
	EventGPUFailed    = Event[GPUFailed]{KindGPUFailed, ToGPUServer}
	EventFault        = Event[Fault]{KindFault, ToGPUServer} // the executor exits after it
	EventEvicted      = Event[Evicted]{KindEvicted, ToGPUServer}
)

// planeOps lists the data-plane operations above (PlaneRoutes serves them).
func planeOps() []planeOp {
	return []planeOp{OpDeregister, OpSwapIn, OpEvict, OpWaitReady, OpMarkUnhealthy, OpComputeShares}
}

// Ops lists every operation above, for the checks that each has its handler (ops_test.go checks that it lists
// every one declared).
func Ops() []Info {
	var out []Info
	for _, o := range planeOps() {
		out = append(out, o.Info())
	}
	return append(out,
		OpStart.Info(), OpSession.Info(), OpRegister.Info(), OpAcquire.Info(), OpRelease.Info(), OpExpire.Info(),
		OpStatus.Info(), OpReclaim.Info(),
		OpBorrow.Info(), OpReturn.Info(), OpReserveImages.Info(), OpReleaseImages.Info(), OpBindImplicit.Info(),
		OpReleaseImplicit.Info(), EventSessionEnded.Info(), EventGPUFailed.Info(), EventFault.Info(),
		EventEvicted.Info(),
	)
}

// Dir says which side sends an operation's requests (the other side handles them).
type Dir uint8

// Directions of an operation.
const (
	ToExecutor  Dir = 1 // the gpuserver asks, the executor answers
	ToGPUServer Dir = 2 // the executor asks or tells, the gpuserver answers
)

func (d Dir) String() string {
	switch d {
	case ToExecutor:
		return "gpuserver->executor"
	case ToGPUServer:
		return "executor->gpuserver"
	}
	return fmt.Sprintf("Dir(%d)", uint8(d))
}

// None is the body of a request or an answer that carries nothing (an empty body on the wire).
type None struct{}

// Info describes an operation.
type Info struct {
	Kind   Kind
	Dir    Dir
	OneWay bool
}

// Op is a request kind answered with a body of type Ans: Call sends it, Handle answers it.
type Op[Req, Ans any] struct {
	Kind Kind
	Dir  Dir
}

// Info describes the operation.
func (o Op[Req, Ans]) Info() Info { return Info{Kind: o.Kind, Dir: o.Dir} }

// Call sends req and waits for the answer.
func (o Op[Req, Ans]) Call(ctx context.Context, p *Peer, req Req) (Ans, error) {
	ans, files, err := o.CallFiles(ctx, p, req, nil)
	closeFiles(files)
	return ans, err
}

// CallFiles sends req with files (which stay the caller's) and waits for the answer and the descriptors that came
// with it (the caller's to close).
func (o Op[Req, Ans]) CallFiles(ctx context.Context, p *Peer, req Req, files []*os.File) (Ans, []*os.File, error) {
	var ans Ans
	var resp any = &ans
	if isNone[Ans]() {
		resp = nil
	}
	got, err := p.Call(ctx, o.Kind, body(req), files, resp)
	return ans, got, err
}

// Handle makes the handler of the operation of h, which answers each request (or an error).
func (o Op[Req, Ans]) Handle(h func(ctx context.Context, req Req) (Ans, error)) Route {
	return o.HandleFiles(func(ctx context.Context, req Req, files []*os.File) (Ans, []*os.File, error) {
		closeFiles(files)
		ans, err := h(ctx, req)
		return ans, nil, err
	})
}

// HandleFiles makes the handler of the operation of h, which owns the request's descriptors and answers with
// descriptors of its own (the peer closes them once sent).
func (o Op[Req, Ans]) HandleFiles(h func(ctx context.Context, req Req, files []*os.File) (Ans, []*os.File,
	error)) Route {
	return Route{Info: o.Info(), Handler: func(ctx context.Context, f Frame) (any, []*os.File, error) {
		req, err := decode[Req](f)
		if err != nil {
			closeFiles(f.Files)
			return nil, nil, err
		}
		ans, files, err := h(ctx, req, f.Files)
		if err != nil {
			return nil, files, err
		}
		return body(ans), files, nil
	}}
}

// Event is a one-way frame with a body of type Body: Notify sends it, Handle takes it (an error is only logged).
type Event[Body any] struct {
	Kind Kind
	Dir  Dir
}

// Info describes the event.
func (e Event[Body]) Info() Info { return Info{Kind: e.Kind, Dir: e.Dir, OneWay: true} }

// Notify sends the event.
func (e Event[Body]) Notify(p *Peer, b Body) error { return p.Notify(e.Kind, b, nil) }

// Handle makes the handler of the event.
func (e Event[Body]) Handle(h func(ctx context.Context, b Body) error) Route {
	return Route{Info: e.Info(), Handler: func(ctx context.Context, f Frame) (any, []*os.File, error) {
		closeFiles(f.Files)
		b, err := decode[Body](f)
		if err != nil {
			return nil, nil, err
		}
		return nil, nil, h(ctx, b)
	}}
}

// Route is the handler of one operation.
type Route struct {
	Info    Info
	Handler Handler
}

// Routes makes the handler table of the side that answers the operations of direction dir (ToExecutor: the
// executor's). Two handlers of one kind, or a handler of an operation of the other direction, are a programming
// error: Routes panics (CheckHandlers, in each side's tests, finds the handlers missing).
func Routes(dir Dir, rs ...Route) map[Kind]Handler {
	out := make(map[Kind]Handler, len(rs))
	for _, r := range rs {
		if r.Info.Dir != dir {
			panic(fmt.Sprintf("handoff: a handler of kind %d (%v) among the %v handlers", r.Info.Kind, r.Info.Dir, dir))
		}
		if _, dup := out[r.Info.Kind]; dup {
			panic(fmt.Sprintf("handoff: two handlers of kind %d", r.Info.Kind))
		}
		out[r.Info.Kind] = r.Handler
	}
	return out
}

// CheckHandlers says which operations of direction dir (Ops) table has no handler for, and which of its handlers
// answer no such operation: each side's tests check its table, so that an operation is never declared without
// its handler.
func CheckHandlers(dir Dir, table map[Kind]Handler) error {
	var errs []error
	want := map[Kind]bool{}
	for _, o := range Ops() {
		if o.Dir != dir {
			continue
		}
		want[o.Kind] = true
		if table[o.Kind] == nil {
			errs = append(errs, fmt.Errorf("kind %d (%v) has no handler", o.Kind, dir))
		}
	}
	for k := range table {
		if !want[k] {
			errs = append(errs, fmt.Errorf("kind %d has a handler but is no %v operation of Ops", k, dir))
		}
	}
	return errors.Join(errs...)
}

func isNone[T any]() bool {
	var v T
	_, ok := any(v).(None)
	return ok
}

// body is what travels for v: nothing for None.
func body[T any](v T) any {
	if isNone[T]() {
		return nil
	}
	return v
}

// decode reads a request's body of type T (None reads nothing).
func decode[T any](f Frame) (T, error) {
	var v T
	if isNone[T]() {
		return v, nil
	}
	if err := json.Unmarshal(f.Body, &v); err != nil {
		return v, fmt.Errorf("%w: kind %d: %w", ErrProtocol, f.Kind, err)
	}
	return v, nil
}
