package simulate

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

func preset(t *testing.T, name string) topology.Node {
	t.Helper()
	node, err := topology.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// TestAutoscalerReachesMaxAndReturnsToMin: the simulator ran a fixed number of instances per function; the
// product's autoscaler (provider/autoscale, driven by `up`) varies them. One function whose requests take 100 ms
// each, 50 a second for 30 s (five times what one instance serves), then nothing until one request at 150 s, with
// the labels min 1, max 8 and the product's window (40 s), interval (1 s) and instance start (2 s): the simulated
// clock's autoscaler decides up within the first second, reaches max, the new instances serve no sooner than 2 s
// after they were asked for, the requests are bound on all four GPUs by eight instances, and once the load is gone
// the function goes back to one instance after the window, and not before.
func TestAutoscalerReachesMaxAndReturnsToMin(t *testing.T) {
	models := []Model{{Name: "m", WeightsBytes: 100e6, Native: msd(100), Remote: msd(100), SLO: msd(60000),
		Percentile: 98}}
	var arr []Arrival
	for at := time.Duration(0); at < 30*time.Second; at += 20 * time.Millisecond {
		arr = append(arr, Arrival{At: at})
	}
	arr = append(arr, Arrival{At: 150 * time.Second})
	policy, err := autoscale.Parse(map[string]string{autoscale.LabelMin: "1", autoscale.LabelMax: "8"}, nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Product(Config{Models: models, Functions: 1, Node: preset(t, "v100x4"),
		Policy: controller.PolicyFaaSGPU, Arrivals: arr, Scaling: policy}), true)
	if err != nil {
		t.Fatal(err)
	}
	ev := res.Scaling
	if len(ev) == 0 || ev[0].From != 1 || ev[0].To <= 1 || ev[0].At > time.Second {
		t.Fatalf("first decision %+v, want up from 1 within the first second (of %d)", ev, len(ev))
	}
	reachedMax, lastUp := time.Duration(-1), time.Duration(0)
	var downTo1 []ScaleEvent
	for _, e := range ev {
		if e.To > e.From {
			lastUp = e.At
		}
		if e.To == 8 && reachedMax < 0 {
			reachedMax = e.At
		}
		if e.To == 1 && e.From > 1 {
			downTo1 = append(downTo1, e)
		}
	}
	if reachedMax < 0 || reachedMax > 30*time.Second {
		t.Errorf("never reached max 8 under the load: decisions %+v", ev)
	}
	// 8 started by the load (1 + 7), and none for the request at 150 s: one request in flight wants
	// ceil(1 / (1 x 1.0)) = 1 instance, the product's formula with its default target and proportion.
	if a := res.Autoscaler; a == nil || a.Peak != 8 || a.Started != 8 || a.Ups != 1 || a.Downs < 1 {
		t.Errorf("autoscaler %+v, want a peak of 8 instances, 8 started, 1 up, a down", a)
	}
	// The backlog drains within seconds of the load's end (8 instances on 4 GPUs serve 40 a second); the window
	// (40 s) must pass after the last count above 1 was wanted before the function is back at 1 (in one step or
	// two, as the counts wanted over the window fall).
	if len(downTo1) != 1 || downTo1[0].At < 30*time.Second+autoscale.DefaultScaleDownWindow ||
		downTo1[0].At > 150*time.Second {
		t.Errorf("scale-downs to 1: %+v, want one after %s (load end + window) and before 150 s (last up at %s)",
			downTo1, 30*time.Second+autoscale.DefaultScaleDownWindow, lastUp)
	}
	instances, gpus := map[string]bool{}, map[int]bool{}
	for _, o := range res.PerRequest {
		instances[o.Instance], gpus[o.GPU] = true, true
		if o.Instance != "fn-0000-m@0" && o.Arrival+o.Wait < ev[0].At+DefaultInstanceStart {
			t.Fatalf("request %d bound on new instance %s at %s, before it was ready (%s + %s)", o.ID, o.Instance,
				o.Arrival+o.Wait, ev[0].At, DefaultInstanceStart)
		}
	}
	if len(instances) != 8 || len(gpus) != 4 {
		t.Errorf("served by %d instances on %d GPUs, want 8 on 4", len(instances), len(gpus))
	}
	if last := res.PerRequest[len(res.PerRequest)-1]; last.Instance == "fn-0000-m@0" {
		// the only instance left is the first (the newest stop first), and it served the last request
	} else {
		t.Errorf("the request at 150 s went to %s, want the first instance, the one left", last.Instance)
	}
}

// hotHour is an hour of 12 functions on v100x4: function 0 carries 25 requests a second of a 1.3 GB model taking
// 60 ms each (1.5 GPUs of work, like the Azure trace's function 287 with bert_qa), the others one request every 5 s
// (of the same model or of a 100 MB one taking 10 ms).
func hotHour(seed uint64) ([]Model, []Arrival) {
	models := []Model{{Name: "hot", WeightsBytes: 1340e6, Native: msd(60), Remote: msd(60), SLO: msd(200),
		Percentile: 98}, {Name: "cv", WeightsBytes: 100e6, Native: msd(10), Remote: msd(10), SLO: msd(80),
		Percentile: 98}}
	rng := rand.New(rand.NewPCG(seed, 7))
	var arr []Arrival
	for fn := range 12 {
		rate := 0.2
		if fn == 0 {
			rate = 25
		}
		for at := time.Duration(0); ; {
			at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if at >= time.Hour {
				break
			}
			arr = append(arr, Arrival{At: at, Function: fn})
		}
	}
	slices.SortStableFunc(arr, func(a, b Arrival) int { return int(a.At - b.At) })
	return models, arr
}

// TestHotHourServedBySeveralInstances: an hour with a hot function needing 1.5 GPUs. With one instance (what the
// simulator ran by default before the autoscaler: one request bound at a time) the hot function cannot keep its
// SLO; the product's autoscaler gives it several instances, bound on several GPUs at once, and it keeps it.
func TestHotHourServedBySeveralInstances(t *testing.T) {
	models, arr := hotHour(1)
	cfg := Product(Config{Models: []Model{models[0], models[1]}, Functions: 12, Node: preset(t, "v100x4"),
		Policy: controller.PolicyFaaSGPU, Arrivals: arr, Assign: AssignRoundRobin})
	// Round robin over the two models gives function 0 the hot one and every odd function a CV model; the even
	// ones run the hot model at one request every 5 s.
	static := cfg
	static.Autoscale, static.Instances = false, 1
	one, err := Run(static, true)
	if err != nil {
		t.Fatal(err)
	}
	auto, err := Run(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	hot := func(r Result) (onTime, total int, instances, gpus int) {
		in, g := map[string]bool{}, map[int]bool{}
		for _, o := range r.PerRequest {
			if o.Function != 0 {
				continue
			}
			total++
			if o.OnTime && !o.Rejected {
				onTime++
			}
			if !o.Rejected {
				in[o.Instance], g[o.GPU] = true, true
			}
		}
		return onTime, total, len(in), len(g)
	}
	on1, total, in1, _ := hot(one)
	onA, _, inA, gA := hot(auto)
	t.Logf("hot function: %d requests; one instance %d on time (%d instances); autoscaled %d on time, %d "+
		"instances on %d GPUs, %+v", total, on1, in1, onA, inA, gA, auto.Autoscaler)
	if float64(on1) >= 0.98*float64(total) {
		t.Errorf("one instance kept the hot function's SLO (%d of %d on time): the load is too light to test",
			on1, total)
	}
	if inA < 2 || gA < 2 || float64(onA) < 0.98*float64(total) {
		t.Errorf("autoscaled: hot function %d of %d on time on %d instances and %d GPUs, want >= 98%% on several",
			onA, total, inA, gA)
	}
}

// TestDataPlaneEvictsUnderPressure: the executors hold 0.9 of what was free after the gpuserver's context. The
// controller placed against each GPU's whole memory, so three models that it fit on a 4 GiB GPU but the data plane
// did not (3 x 1.25 GB quotas in 3.2 GiB of chunks) were evicted by the data plane on its own (28 pressure
// evictions, none of the controller's). Now the controller plans with the chunks' capacity, as the gpuserver gives
// it: the same requests swap as often, but the evictions are the controller's own (its choice of victim), none
// under pressure. Without the data plane the three stay resident.
func TestDataPlaneEvictsUnderPressure(t *testing.T) {
	node, err := preset(t, "h200x1").WithGPUMemory(4 << 30)
	if err != nil {
		t.Fatal(err)
	}
	models := []Model{{Name: "m", WeightsBytes: 1e9, Native: msd(10), Remote: msd(10), SLO: msd(10000),
		Percentile: 98}}
	var arr []Arrival
	for i := range 30 { // functions 0, 1, 2, 0, 1, 2, ... one at a time
		arr = append(arr, Arrival{At: time.Duration(i) * time.Second, Function: i % 3})
	}
	for _, dp := range []bool{false, true} {
		res, err := Run(Config{Models: models, Functions: 3, Node: node, Policy: controller.PolicyFaaSGPU,
			Arrivals: arr, MaxInFlight: DefaultMaxInFlight, DataPlane: dp}, false)
		if err != nil {
			t.Fatal(err)
		}
		pressure := res.DataPlaneEvictions[executor.EvictPressure]
		t.Logf("data plane %v: swaps %+v, evictions controller %d, data plane %v", dp, res.Swaps, res.Evictions,
			res.DataPlaneEvictions)
		switch {
		case !dp && (pressure != 0 || res.Swaps.PCIe != 3):
			t.Errorf("without the data plane: %d pressure evictions and %d swaps, want 0 and 3", pressure,
				res.Swaps.PCIe)
		case dp && (pressure != 0 || res.Swaps.PCIe != 30 || res.Evictions != 28):
			t.Errorf("with the data plane: %d pressure evictions, %d swaps, %d by the controller; want 0, 30, 28 "+
				"(two copies fit in the chunks, and the controller plans with them)", pressure, res.Swaps.PCIe,
				res.Evictions)
		}
		if res.RequestsOnTime != 30 {
			t.Errorf("data plane %v: %d of 30 requests on time", dp, res.RequestsOnTime)
		}
	}
}

// TestProductDefaults: Product turns on the instances, autoscaler and data plane `up` runs, with the product's
// defaults (min 1, max 10, target 1 in flight per instance, proportion 1.0, the measured instance start).
func TestProductDefaults(t *testing.T) {
	cfg := Product(Config{MaxInFlight: 0, Instances: 4})
	if cfg.MaxInFlight != DefaultMaxInFlight || !cfg.Autoscale || !cfg.DataPlane || cfg.Instances != 0 {
		t.Errorf("Product: %+v", cfg)
	}
	if err := cfg.autoscaleDefaults(); err != nil {
		t.Fatal(err)
	}
	p := cfg.Scaling
	if p.Min != 1 || p.Max != 10 || p.Target != 1 || p.Proportion != 1 || p.Zero || !p.Autoscaled ||
		cfg.InstanceStart != DefaultInstanceStart {
		t.Errorf("scaling %+v, start %s: want min 1, max 10, target 1, proportion 1, no zero, 2 s", p,
			cfg.InstanceStart)
	}
}

// TestDataPlaneModelOverTheChunksIsRefused: a model whose quota is under the GPU's memory but over the executors'
// chunks was placed by the controller (it planned with the GPU's memory) and its swap-in failed in the data plane
// (executor.ErrNoMemory on the product). Now the controller plans with the chunks' capacity: it refuses the
// requests itself (the model fits no GPU) and no swap fails. Without the data plane both are served.
func TestDataPlaneModelOverTheChunksIsRefused(t *testing.T) {
	node, err := preset(t, "h200x1").WithGPUMemory(4 << 30)
	if err != nil {
		t.Fatal(err)
	}
	models := []Model{{Name: "big", WeightsBytes: 2.9e9, Native: msd(10), Remote: msd(10), SLO: msd(10000),
		Percentile: 98}} // a 3.4 GiB quota: under the 4 GiB the controller plans with, over the 3.1 GiB of chunks
	arr := []Arrival{{At: 0}, {At: time.Second}}
	for _, dp := range []bool{false, true} {
		res, err := Run(Config{Models: models, Functions: 1, Node: node, Policy: controller.PolicyFaaSGPU,
			Arrivals: arr, MaxInFlight: DefaultMaxInFlight, DataPlane: dp}, false)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if dp {
			want = 2
		}
		if res.Rejected != want || res.DataPlaneEvictions[ReasonSwapFailed] != 0 || res.RequestsOnTime != 2-want {
			t.Errorf("data plane %v: %d rejected, %d on time, data plane %v; want %d rejected and no failed swap",
				dp, res.Rejected, res.RequestsOnTime, res.DataPlaneEvictions, want)
		}
	}
}
