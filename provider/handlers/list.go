package handlers

import (
	"log/slog"
	"net/http"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
)

// MakeListHandler answers GET /system/functions[?namespace=]: every function with its replicas, available replicas
// and annotations, and the invocations the proxy counted, as a JSON array.
func MakeListHandler(b provider.Backend, inv *invocations, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ns, err := namespace(r.Context(), b, r.URL.Query().Get("namespace"))
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		fns, err := b.List(r.Context(), ns)
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if fns == nil {
			fns = []types.FunctionStatus{}
		}
		for i := range fns {
			inv.fill(&fns[i], ns)
		}
		writeJSON(w, fns)
	}
}
