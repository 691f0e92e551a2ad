package tenant

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// The executor-client end of a data-plane operation (handoff.PlaneOp): a tenant.Plane method is one line that
// sends the op to the executor it concerns, the function's (toFunction), a tenant's (toTenant) or every running
// one (toEvery); the executor answers it on its executor.Node (handoff.PlaneRoutes). The recipe for adding an
// operation is in gpuserver/tenant/handoff/ops.go.

// toFunction sends a data-plane operation to function's executor (waiting for it to be up) and waits for the
// answer.
func toFunction[Req any](ctx context.Context, pl *Plane, function string, op handoff.PlaneOp[Req, handoff.None],
	req Req) error {
	_, err := askFunction(ctx, pl, function, op, req)
	return err
}

// askFunction is toFunction for an operation that answers a body.
func askFunction[Req, Ans any](ctx context.Context, pl *Plane, function string, op handoff.PlaneOp[Req, Ans],
	req Req) (Ans, error) {
	p, err := pl.procOf(function)
	if err != nil {
		var none Ans
		return none, err
	}
	return call(ctx, p, op.Op, req)
}

// toTenant sends a data-plane operation to tenant's executor (waiting for it to be up): ErrExecutorDown when the
// tenant has none (no function of it is registered).
func toTenant[Req any](ctx context.Context, pl *Plane, tenant string, op handoff.PlaneOp[Req, handoff.None],
	req Req) error {
	pl.mu.Lock()
	p := pl.procs[tenant]
	pl.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w: tenant %s has no executor", ErrExecutorDown, tenant)
	}
	_, err := call(ctx, p, op.Op, req)
	return err
}

// everyTimeout bounds each executor's answer to toEvery.
const everyTimeout = 10 * time.Second

// toEvery sends a data-plane operation to every executor that is running now (one that is not will be told by its
// start, or never needs it) and joins their errors.
func toEvery[Req any](ctx context.Context, pl *Plane, op handoff.PlaneOp[Req, handoff.None], req Req) error {
	pl.mu.Lock()
	procs := pl.procList()
	pl.mu.Unlock()
	var errs []error
	for _, p := range procs {
		g := p.current()
		if g == nil {
			continue
		}
		peer := g.live()
		if peer == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, everyTimeout)
		if _, err := op.Call(cctx, peer, req); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", p.tenant, err))
		}
		cancel()
	}
	return errors.Join(errs...)
}
