package handlers

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// MakeDeleteHandler answers DELETE /system/functions with a body {"functionName": ..., "namespace": ...}: it stops
// and removes the function (404 when unknown) and deregisters it from the gpuserver. Success is 202.
func MakeDeleteHandler(b provider.Backend, gpu provider.GPURegistry, inv *invocations, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req types.DeleteFunctionRequest
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, log, r, err)
			return
		}
		if err := names.Function("functionName", req.FunctionName); err != nil {
			writeError(w, log, r, err)
			return
		}
		ns, err := namespace(r.Context(), b, firstNonEmpty(req.Namespace, r.URL.Query().Get("namespace")))
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if err := b.Delete(r.Context(), ns, req.FunctionName); err != nil {
			writeError(w, log, r, err)
			return
		}
		inv.forget(req.FunctionName, ns)
		if gpu != nil {
			if err := gpu.Deregister(r.Context(), gpuspec.FunctionName(req.FunctionName, ns)); err != nil {
				writeError(w, log, r, fmt.Errorf("deregistering %q from the gpuserver: %w", req.FunctionName, err))
				return
			}
		}
		log.Info("function deleted", "function", req.FunctionName)
		w.WriteHeader(http.StatusAccepted)
	}
}
