package handlers

import (
	"log/slog"
	"net/http"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
)

// MakeUpdateHandler answers PUT /system/functions: it replaces a function's definition (404 for an unknown
// function, so that faas-cli falls back to POST) and registers the function with the gpuserver, or deregisters it
// when it no longer has GPU annotations. Success is 202.
func MakeUpdateHandler(b provider.Backend, gpu provider.GPURegistry, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		fd, spec, isGPU, err := readDeployment(r, b)
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if err := b.Update(r.Context(), fd); err != nil {
			writeError(w, log, r, err)
			return
		}
		if gpu != nil {
			if isGPU {
				err = gpu.Register(r.Context(), spec)
			} else {
				err = gpu.Deregister(r.Context(), gpuspec.FunctionName(fd.Service, fd.Namespace))
			}
			if err != nil {
				writeError(w, log, r, registerError(fd.Service, err))
				return
			}
		}
		log.Info("function updated", "function", fd.Service, "image", fd.Image, "gpu", isGPU)
		w.WriteHeader(http.StatusAccepted)
	}
}
