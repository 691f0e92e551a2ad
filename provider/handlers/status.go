package handlers

import (
	"log/slog"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// MakeStatusHandler answers GET /system/function/{name}[?namespace=]: one function as JSON (with the invocations
// the proxy counted), 404 when unknown.
func MakeStatusHandler(b provider.Backend, inv *invocations, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := mux.Vars(r)["name"]
		if err := names.Function("function name", name); err != nil {
			writeError(w, log, r, err)
			return
		}
		ns, err := namespace(r.Context(), b, r.URL.Query().Get("namespace"))
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		st, err := b.Status(r.Context(), ns, name)
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		inv.fill(&st, ns)
		writeJSON(w, st)
	}
}
