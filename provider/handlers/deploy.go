package handlers

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
	"github.com/faas-gpu/faas-gpu/provider/validate"
)

// readDeployment decodes and validates a POST or PUT /system/functions body: JSON, a deployment within
// validate.Deployment's limits (a valid service name, environment a process can start with, ...), an image, a
// namespace the backend serves, a valid queue annotation and valid GPU annotations. isGPU says whether the
// function is a GPU function.
func readDeployment(r *http.Request, b provider.Backend) (fd types.FunctionDeployment, spec pool.FunctionSpec, isGPU bool, err error) {
	if err := decodeJSON(r, &fd); err != nil {
		return fd, spec, false, err
	}
	if err := validate.Deployment(fd); err != nil {
		return fd, spec, false, err
	}
	if fd.Image == "" {
		return fd, spec, false, fmt.Errorf("%w: image is required", provider.ErrInvalid)
	}
	if fd.Namespace, err = namespace(r.Context(), b, firstNonEmpty(fd.Namespace, r.URL.Query().Get("namespace"))); err != nil {
		return fd, spec, false, err
	}
	var annotations map[string]string
	if fd.Annotations != nil {
		annotations = *fd.Annotations
	}
	if err := gpuspec.ValidateQueue(annotations); err != nil {
		return fd, spec, false, err
	}
	spec, isGPU, err = gpuspec.Parse(annotations, gpuspec.FunctionName(fd.Service, fd.Namespace))
	return fd, spec, isGPU, err
}

// MakeDeployHandler answers POST /system/functions: it creates a function (409 when it exists) and registers a GPU
// function with the gpuserver; if that fails, the function is removed again. Success is 202.
func MakeDeployHandler(b provider.Backend, gpu provider.GPURegistry, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		fd, spec, isGPU, err := readDeployment(r, b)
		if err != nil {
			writeError(w, log, r, err)
			return
		}
		if err := b.Deploy(r.Context(), fd); err != nil {
			writeError(w, log, r, err)
			return
		}
		if isGPU && gpu != nil {
			if err := gpu.Register(r.Context(), spec); err != nil {
				err = registerError(fd.Service, err)
				if derr := b.Delete(r.Context(), fd.Namespace, fd.Service); derr != nil {
					err = errors.Join(err, fmt.Errorf("removing it again: %w", derr))
				}
				writeError(w, log, r, err)
				return
			}
		}
		log.Info("function deployed", "function", fd.Service, "image", fd.Image, "gpu", isGPU)
		w.WriteHeader(http.StatusAccepted)
	}
}

// registerError explains a failed registration: a spec the pool refuses (larger than any GPU, or invalid) is the
// deployment's fault and answers 400 naming the annotation; anything else is the gpuserver's.
func registerError(function string, err error) error {
	switch {
	case errors.Is(err, pool.ErrTooLarge):
		return fmt.Errorf("%w: annotation %s: the gpuserver refused function %q: %w", provider.ErrInvalid,
			contract.AnnotationMemory, function, err)
	case errors.Is(err, pool.ErrInvalidSpec):
		return fmt.Errorf("%w: GPU annotations of %q: the gpuserver refused them: %w", provider.ErrInvalid, function, err)
	}
	return fmt.Errorf("registering GPU function %q with the gpuserver: %w", function, err)
}
