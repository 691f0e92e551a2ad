package handoff

import (
	"context"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// The data plane's operations (PlaneOp): a method of executor.DataPlane carried over the control socket. Its
// declaration in ops.go binds its kind to the DataPlane method that answers it in the executor, so that the
// executor's route table is the op table (PlaneRoutes): an executor serves every PlaneOp on its executor.Node with
// no handler of its own. The gpuserver's end is a one-line tenant.Plane method that sends the op to the
// function's (or the tenant's, or every) executor. The operations that carry descriptors or bookkeeping of the
// executor process (Start, Session, Register's tenant check, the bindings' Acquire, Release and Expire, Status,
// Reclaim) are plain Ops with handlers in package tenantexec.

// PlaneOp is a gpuserver -> executor operation answered by a method of the executor's data plane.
type PlaneOp[Req, Ans any] struct {
	Op[Req, Ans]
	serve func(d executor.DataPlane, ctx context.Context, req Req) (Ans, error)
}

// Serve declares the operation of kind that the executor answers with m on its data plane; m is a method
// expression (executor.DataPlane.M, for a method M(ctx, Req) error) or a function that unpacks the request's
// body into the method's arguments.
func Serve[Req any](kind Kind, m func(d executor.DataPlane, ctx context.Context, req Req) error) PlaneOp[Req, None] {
	return PlaneOp[Req, None]{Op: Op[Req, None]{Kind: kind, Dir: ToExecutor},
		serve: func(d executor.DataPlane, ctx context.Context, req Req) (None, error) {
			return None{}, m(d, ctx, req)
		}}
}

// ServeAnswer is Serve for a method that answers a body of type Ans.
func ServeAnswer[Req, Ans any](kind Kind, m func(d executor.DataPlane, ctx context.Context, req Req) (Ans,
	error)) PlaneOp[Req, Ans] {
	return PlaneOp[Req, Ans]{Op: Op[Req, Ans]{Kind: kind, Dir: ToExecutor}, serve: m}
}

// Route makes the operation's handler on the data plane that plane returns (asked at each request: an executor
// builds its Node when it starts, after its routes).
func (o PlaneOp[Req, Ans]) Route(plane func() executor.DataPlane) Route {
	return o.Handle(func(ctx context.Context, req Req) (Ans, error) { return o.serve(plane(), ctx, req) })
}

// planeOp is a PlaneOp of any types.
type planeOp interface {
	Info() Info
	Route(plane func() executor.DataPlane) Route
}

// PlaneRoutes makes the handler of every data-plane operation (PlaneOps), each answered on plane's data plane.
func PlaneRoutes(plane func() executor.DataPlane) []Route {
	ops := planeOps()
	out := make([]Route, 0, len(ops))
	for _, o := range ops {
		out = append(out, o.Route(plane))
	}
	return out
}
