package handlers

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/gorilla/mux"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// MakeScaleHandler answers POST /system/scale-function/{name} with a body {"serviceName", "replicas",
// "namespace"}: it sets the desired replica count (404 for an unknown function). Success is 202.
func MakeScaleHandler(b provider.Backend, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := mux.Vars(r)["name"]
		if err := names.Function("function name", name); err != nil {
			writeError(w, log, r, err)
			return
		}
		var req types.ScaleServiceRequest
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, log, r, err)
			return
		}
		if req.ServiceName != "" && req.ServiceName != name {
			writeError(w, log, r, fmt.Errorf("%w: serviceName %q does not match the function %q of the path",
				provider.ErrInvalid, req.ServiceName, name))
			return
		}
		ns, err := namespace(r.Context(), b, firstNonEmpty(req.Namespace, r.URL.Query().Get("namespace")))
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if err := b.Scale(r.Context(), ns, name, req.Replicas); err != nil {
			writeError(w, log, r, err)
			return
		}
		log.Info("function scaled", "function", name, "replicas", req.Replicas)
		w.WriteHeader(http.StatusAccepted)
	}
}
