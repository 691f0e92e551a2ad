package gpuspec

import (
	"fmt"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/provider"
)

// parseShares reads com.openfaas.gpu.compute.request and .limit (0 for one not named). Errors wrap
// provider.ErrInvalid (a 400 at deploy) and name the annotation.
func parseShares(annotations map[string]string) (request, limit float64, err error) {
	read := func(name string) (float64, error) {
		v, ok := annotations[name]
		if !ok {
			return 0, nil
		}
		f, err := contract.ParseShare(v)
		if err != nil {
			return 0, fmt.Errorf("%w: annotation %s: %w", provider.ErrInvalid, name, err)
		}
		return f, nil
	}
	if request, err = read(contract.AnnotationComputeRequest); err != nil {
		return 0, 0, err
	}
	if limit, err = read(contract.AnnotationComputeLimit); err != nil {
		return 0, 0, err
	}
	if err := contract.CheckShares(request, limit); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", provider.ErrInvalid, err)
	}
	return request, limit, nil
}
