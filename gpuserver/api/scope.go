package api

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// readScope is what a caller of the read APIs (GET /v1/pool, /v1/usage) may see: everything (all: the
// administrator, or a server without an Authenticator), or one tenant's functions, those of the namespace of the
// function whose token the caller presented (pool.Namespace: the provider registers "service.namespace").
type readScope struct {
	all       bool
	function  string // whose token it is
	namespace string
}

// sees reports whether the scope covers function.
func (sc readScope) sees(function string) bool {
	return sc.all || pool.Namespace(function) == sc.namespace
}

// readerScope authenticates a read: no credential answers auth.ErrUnauthenticated, the administrator's token sees
// everything, a function's token its own namespace's functions, any other credential auth.ErrForbidden. The
// function is found among those registered (a function's token is only ever handed to a registered function).
func (s *Server) readerScope(r *http.Request, what string) (readScope, error) {
	if s.auth == nil {
		return readScope{all: true}, nil
	}
	tok := bearer(r)
	switch {
	case tok == "":
		return readScope{}, fmt.Errorf("%w: %s needs a credential (Authorization: Bearer <token>): the "+
			"administrator's, or a function's for its own namespace", auth.ErrUnauthenticated, what)
	case s.auth.IsAdmin(tok):
		return readScope{all: true}, nil
	}
	for _, f := range s.pool.Status(r.Context()).Functions {
		if s.auth.IsFunction(f.Name, tok) {
			return readScope{function: f.Name, namespace: pool.Namespace(f.Name)}, nil
		}
	}
	return readScope{}, fmt.Errorf("%w: the credential does not allow %s", auth.ErrForbidden, what)
}

// scopeStatus is the part of st that sc may see. A tenant's view keeps the node's shape (its GPUs, their health
// and size, the policy, the kernel mode) and its own functions, their counts and their executors; what would tell
// of other tenants is left out (other functions, the GPUs' use and residents beyond its own, node-wide counters)
// or recomputed from its own functions (the queue, the SLO figures, the overload control's refusals).
func scopeStatus(st pool.Status, sc readScope) pool.Status {
	if sc.all {
		return st
	}
	out := pool.Status{Policy: st.Policy, SimKernels: st.SimKernels, Functions: []pool.FunctionStatus{},
		GPUs: make([]pool.GPUStatus, 0, len(st.GPUs))}
	for _, g := range st.GPUs {
		mine := []string{}
		for _, name := range g.Resident {
			if sc.sees(name) {
				mine = append(mine, name)
			}
		}
		out.GPUs = append(out.GPUs, pool.GPUStatus{Index: g.Index, Name: g.Name, MemoryBytes: g.MemoryBytes,
			Healthy: g.Healthy, Resident: mine})
	}
	for _, f := range st.Functions {
		if sc.sees(f.Name) {
			out.Functions = append(out.Functions, f)
			out.Queued += f.Queued
		}
	}
	for _, ts := range st.Tenants {
		if kind, name, _ := strings.Cut(ts.Tenant, "/"); kind == "namespace" && name == sc.namespace ||
			kind == "function" && sc.sees(name) {
			out.Tenants = append(out.Tenants, ts)
		}
	}
	if st.SLO != nil {
		sum := pool.Summarize(out.Functions)
		out.SLO = &sum
	}
	if ov := st.Overload; ov != nil {
		view := pool.OverloadView{Setting: ov.Setting, Capacity: ov.Capacity, Shedding: []string{}}
		for _, name := range ov.Shedding {
			if sc.sees(name) {
				view.Shedding = append(view.Shedding, name)
			}
		}
		for _, f := range out.Functions {
			view.Refused += f.Refused
		}
		out.Overload = &view
	}
	return out
}

// scopeReport is the part of a bill that sc may see: its own namespace's functions.
func scopeReport(rep metering.Report, sc readScope) metering.Report {
	if sc.all {
		return rep
	}
	out := metering.Report{Since: rep.Since, Until: rep.Until, Functions: []metering.Usage{}}
	for _, u := range rep.Functions {
		if sc.sees(u.Name) {
			out.Functions = append(out.Functions, u)
		}
	}
	return out
}
