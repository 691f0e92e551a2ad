package api

import "github.com/faas-gpu/faas-gpu/gpuserver/pool"

// gpuBindings is how many bindings GPU g holds and the sum of their compute requests: its shared bindings when it
// has any, else one exclusive binding while it is busy (faas_gpu_gpu_bindings, faas_gpu_gpu_compute_requested).
func gpuBindings(g pool.GPUStatus) (bindings, requested float64) {
	if len(g.CoRunners) > 0 {
		for _, c := range g.CoRunners {
			requested += c.Request
		}
		return float64(len(g.CoRunners)), requested
	}
	if g.Busy {
		return 1, 1
	}
	return 0, 0
}
