package tenant

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// ComputeShares implements executor.DataPlane: each executor gets the grants of its own bindings on the GPU (one
// handoff.OpComputeShares frame per executor; an executor named by no grant gets none), and their reports come
// back joined. A grant of a function no executor runs, or an executor that does not answer, is an error; the
// others' reports still come back (their gates got their grants).
func (pl *Plane) ComputeShares(ctx context.Context, a compute.Allotment) (compute.Report, error) {
	by := map[*proc][]compute.Grant{}
	var order []*proc
	var errs []error
	for _, g := range a.Grants {
		p, err := pl.procOf(g.Binding)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if by[p] == nil {
			order = append(order, p)
		}
		by[p] = append(by[p], g)
	}
	var rep compute.Report
	for _, p := range order {
		r, err := call(ctx, p, handoff.OpComputeShares.Op,
			compute.Allotment{GPU: a.GPU, Period: a.Period, Issue: a.Issue, Grants: by[p]})
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", p.tenant, err))
			continue
		}
		rep.Usage = append(rep.Usage, r.Usage...)
	}
	return rep, errors.Join(errs...)
}
