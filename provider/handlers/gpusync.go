package handlers

import (
	"context"
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
)

// SyncGPU registers every GPU function the backend runs with the gpuserver. Call it when the provider or the
// gpuserver (re)starts, since deploy-time registration does not survive a gpuserver restart. A function whose
// annotations no longer parse is reported and the others are still registered.
func SyncGPU(ctx context.Context, b provider.Backend, gpu provider.GPURegistry) error {
	nss, err := b.Namespaces(ctx)
	if err != nil {
		return fmt.Errorf("listing namespaces: %w", err)
	}
	var errs []error
	for _, ns := range nss {
		fns, err := b.List(ctx, ns)
		if err != nil {
			return fmt.Errorf("listing functions of %s: %w", ns, err)
		}
		for _, fn := range fns {
			var annotations map[string]string
			if fn.Annotations != nil {
				annotations = *fn.Annotations
			}
			spec, isGPU, err := gpuspec.Parse(annotations, gpuspec.FunctionName(fn.Name, firstNonEmpty(fn.Namespace, ns)))
			if err != nil {
				errs = append(errs, fmt.Errorf("function %q: %w", fn.Name, err))
				continue
			}
			if !isGPU {
				continue
			}
			if err := gpu.Register(ctx, spec); err != nil {
				errs = append(errs, fmt.Errorf("registering GPU function %q: %w", fn.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
