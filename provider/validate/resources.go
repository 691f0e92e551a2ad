package validate

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
)

// Resources checks a deployment's limits and requests (see resources); errors wrap provider.ErrInvalid and name
// the field. Deployment checks them too.
func Resources(fd types.FunctionDeployment) error {
	if err := resources("limits", fd.Limits); err != nil {
		return err
	}
	return resources("requests", fd.Requests)
}

// resources checks a deployment's limits or requests (field names them) as Kubernetes would read them, so that a
// value no engine can use is refused at deploy with 400 naming it instead of being kept silently (the local backend)
// or failing later at the API server (a cluster): memory is a byte quantity (128Mi, 1G, 1.5Gi), cpu a number of
// cores or millicores (0.5, 2, 500m), a GPU count a whole number. Empty values are unset.
func resources(field string, r *types.FunctionResources) error {
	if r == nil {
		return nil
	}
	for _, q := range []struct {
		name, value string
		check       func(string) error
	}{
		{"memory", r.Memory, memoryQuantity},
		{"cpu", r.CPU, cpuQuantity},
		{"nvidia.com/gpu", r.NvidiaGPU, deviceCount},
		{"amd.com/gpu", r.AmdGPU, deviceCount},
		{"intel.com/gpu", r.IntelGPU, deviceCount},
	} {
		if err := text(field+"."+q.name, q.value, MaxResource); err != nil {
			return err
		}
		if q.value == "" {
			continue
		}
		if err := q.check(strings.TrimSpace(q.value)); err != nil {
			return invalid("%s.%s: %v", field, q.name, err)
		}
	}
	return nil
}

func memoryQuantity(v string) error {
	_, err := gpuspec.ParseQuantity(v)
	return err
}

// cpuQuantity accepts a positive decimal number of cores, or of millicores with the suffix m.
func cpuQuantity(v string) error {
	num := strings.TrimSuffix(v, "m")
	r, ok := new(big.Rat).SetString(num)
	if !ok || num == "" || strings.Trim(num, "0123456789.") != "" || strings.Count(num, ".") > 1 {
		return fmt.Errorf("%q is not a CPU quantity (cores or millicores, e.g. 0.5, 2, 500m)", clip(v))
	}
	if r.Sign() <= 0 {
		return fmt.Errorf("%q must be greater than zero", clip(v))
	}
	return nil
}

// deviceCount accepts a whole number of devices.
func deviceCount(v string) error {
	if _, err := strconv.ParseUint(v, 10, 16); err != nil {
		return fmt.Errorf("%q is not a whole number of devices", clip(v))
	}
	return nil
}
