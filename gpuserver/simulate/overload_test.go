package simulate

import (
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// overloadRun: one GPU holding both models; function 0 (light: 10 ms, deadline 100 ms) gets a request every
// 50 ms and function 1 (heavy: 50 ms, deadline 200 ms) one every 55 ms, for five minutes: 1.1 GPUs of demand.
func overloadRun(t *testing.T, ov controller.Overload) Result {
	t.Helper()
	models, err := ParseModels(strings.NewReader("model,weights_mb,native_ms,remoting_ms,swap_pcie_ms," +
		"swap_nvlink_ms,heavy,slo_ms,slo_percentile\nlight,100,10,10,12,11,false,100,98\nheavy,100,50,50,52,51,false,200,98\n"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	var arr []Arrival
	for at := time.Duration(0); at < 5*time.Minute; at += time.Millisecond {
		if at%(50*time.Millisecond) == 0 {
			arr = append(arr, Arrival{At: at, Function: 0})
		}
		if at%(55*time.Millisecond) == 0 {
			arr = append(arr, Arrival{At: at, Function: 1})
		}
	}
	r, err := Run(Config{Models: models, Functions: 2, Node: node, Arrivals: arr, Prewarm: true,
		Policy: controller.PolicyFaaSGPU, Overload: ov}, true)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestOverloadRaisesBothFigures: on a node that cannot serve everything, the overload control on its default
// serves more requests on time than without it - the heavy function's requests use the capacity left and only
// those that cannot make their deadline are refused - and, once it has measured the demand (its rate estimate
// remembers about 20 s), keeps the light function's requests on time by shedding the heavy one.
func TestOverloadRaisesBothFigures(t *testing.T) {
	auto := overloadRun(t, controller.Overload{})
	off := overloadRun(t, controller.Overload{Mode: controller.OverloadOff})
	settled := func(r Result) (late, n int) {
		for _, o := range r.PerRequest {
			if o.Function == 0 && o.Arrival > time.Minute {
				n++
				if !o.OnTime {
					late++
				}
			}
		}
		return late, n
	}
	if late, n := settled(auto); n == 0 || late > n/50 {
		t.Errorf("auto: %d of the light function's %d requests after the first minute late", late, n)
	}
	if late, n := settled(off); late <= n/50 {
		t.Errorf("off: only %d of the light function's %d requests after the first minute late: not overloaded", late, n)
	}
	t.Logf("auto %d/%d on time, %d refused; off %d", auto.RequestsOnTime, auto.Requests, auto.Rejected, off.RequestsOnTime)
	if auto.RequestsOnTime <= off.RequestsOnTime {
		t.Fatalf("auto: %d functions, %d requests on time, %d refused; off: %d, %d", auto.FunctionsSLOMet,
			auto.RequestsOnTime, auto.Rejected, off.FunctionsSLOMet, off.RequestsOnTime)
	}
	if auto.Rejected == 0 || auto.Shed != auto.Rejected || off.Rejected != 0 {
		t.Fatalf("refusals: auto %d (shed %d), off %d", auto.Rejected, auto.Shed, off.Rejected)
	}
}
