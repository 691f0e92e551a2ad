package api

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

func TestGPUBindingsCountsCoRunners(t *testing.T) {
	for _, tc := range []struct {
		g           pool.GPUStatus
		n, requests float64
	}{
		{pool.GPUStatus{}, 0, 0},
		{pool.GPUStatus{Busy: true}, 1, 1},
		{pool.GPUStatus{Busy: true, CoRunners: []pool.CoRunner{{Function: "a", Request: 0.3, Limit: 1}}}, 1, 0.3},
		{pool.GPUStatus{Busy: true, CoRunners: []pool.CoRunner{{Function: "a", Request: 0.3}, {Function: "b", Request: 0.5}}}, 2, 0.8},
	} {
		if n, r := gpuBindings(tc.g); n != tc.n || r != tc.requests {
			t.Errorf("gpuBindings(%+v) = %v, %v; want %v, %v", tc.g, n, r, tc.n, tc.requests)
		}
	}
}
