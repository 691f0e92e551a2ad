package simulate

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestInstancesBoundAtOnce: the simulator ran a function's requests on every GPU at once (MaxInFlight 0), which the
// product cannot do; the product binds one request per instance. Four requests of one function arriving together
// on a v100x4 node: with one instance (what a function deployed without com.openfaas.scale.min has) three of them
// wait for the one before; with four instances (each placed on its own, a copy each) none waits and the four are
// bound on four GPUs.
func TestInstancesBoundAtOnce(t *testing.T) {
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	models := []Model{{Name: "m", WeightsBytes: 100e6, Native: msd(50), Remote: msd(50), SLO: msd(5000),
		Percentile: 98}}
	arr := []Arrival{{0, 0}, {0, 0}, {0, 0}, {0, 0}}
	for _, tc := range []struct{ instances, waited, gpus int }{{1, 3, 0}, {4, 0, 4}} {
		res, err := Run(Config{Models: models, Functions: 1, Node: node, Policy: controller.PolicyFaaSGPU,
			Arrivals: arr, Instances: tc.instances, MaxInFlight: DefaultMaxInFlight, Prewarm: true}, true)
		if err != nil {
			t.Fatal(err)
		}
		waited, gpus := 0, map[int]bool{}
		for _, o := range res.PerRequest {
			if o.Wait > 0 {
				waited++
			}
			gpus[o.GPU] = true
		}
		if waited != tc.waited || tc.gpus > 0 && len(gpus) != tc.gpus {
			t.Errorf("%d instances: %d requests waited, on %d GPUs; want %d waited (on %d GPUs)", tc.instances,
				waited, len(gpus), tc.waited, tc.gpus)
		}
	}
}
