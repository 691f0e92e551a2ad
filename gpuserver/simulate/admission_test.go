package simulate

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// overloadArrivals: function 0 (light: 10 ms, deadline 100 ms) every 20 ms and function 1 (heavy: 50 ms,
// deadline 200 ms) every 40 ms for two minutes: 1.75 GPUs of demand on one GPU.
func overloadArrivals() []Arrival {
	var arr []Arrival
	for at := time.Duration(0); at < 2*time.Minute; at += time.Millisecond {
		if at%(20*time.Millisecond) == 0 {
			arr = append(arr, Arrival{At: at, Function: 0})
		}
		if at%(40*time.Millisecond) == 0 {
			arr = append(arr, Arrival{At: at, Function: 1})
		}
	}
	return arr
}

func overloadModels(t *testing.T) []Model {
	t.Helper()
	models, err := ParseModels(strings.NewReader("model,weights_mb,native_ms,remoting_ms,swap_pcie_ms," +
		"swap_nvlink_ms,heavy,slo_ms,slo_percentile\nlight,100,10,10,12,11,false,100,98\nheavy,100,50,50,52,51,false,200,98\n"))
	if err != nil {
		t.Fatal(err)
	}
	return models
}

// TestAdmissionBoundsQueues: at 1.75x the node's capacity, every policy's queue of admitted requests grows
// without the admission rule (p98 of served requests tens of deadlines late) and stays bounded with it (p98 within
// the deadline up to the prediction's error), with more requests on time, the refusals counted as the rule's.
func TestAdmissionBoundsQueues(t *testing.T) {
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	arr := overloadArrivals()
	for _, p := range []controller.Policy{controller.PolicyTorpor, controller.PolicyFIFO, controller.PolicyGShareDQLS,
		controller.PolicyFaaSGPU, controller.PolicyStatic} {
		run := func(adm controller.Admission) Result {
			r, err := Run(Config{Models: overloadModels(t), Functions: 2, Node: node, Arrivals: arr, Prewarm: true,
				Policy: p, Overload: controller.Overload{Mode: controller.OverloadOff}, Admission: adm}, false)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		without, with := run(controller.AdmissionNone), run(controller.AdmissionDeadline)
		if without.P98 < 10 || without.Refused != 0 {
			t.Errorf("%s without the rule: p98 %.1f deadlines, %d refused; want a growing queue and none refused", p,
				without.P98, without.Refused)
		}
		if with.P98 > 1.2 || with.Refused == 0 || with.Refused != with.Rejected {
			t.Errorf("%s with the rule: p98 %.2f deadlines, %d refused of %d rejected; want p98 <= 1.2, refusals "+
				"all the rule's", p, with.P98, with.Refused, with.Rejected)
		}
		if with.RequestsOnTime <= without.RequestsOnTime {
			t.Errorf("%s: %d on time with the rule, %d without", p, with.RequestsOnTime, without.RequestsOnTime)
		}
	}
}

// TestSeededAssignment: round robin gives function i model i mod n; drawn per seed, the assignment is repeatable,
// differs between seeds, and uses every model.
func TestSeededAssignment(t *testing.T) {
	models := make([]Model, 8)
	rr := Config{Models: models}
	a := Config{Models: models, Assign: AssignSeeded, Seed: 1}
	b := Config{Models: models, Assign: AssignSeeded, Seed: 2}
	differ, used := 0, map[int]bool{}
	for i := range 500 {
		if rr.modelOf(i) != i%8 {
			t.Fatalf("round robin: function %d has model %d", i, rr.modelOf(i))
		}
		if a.modelOf(i) != a.modelOf(i) {
			t.Fatal("seeded assignment not repeatable")
		}
		if a.modelOf(i) != b.modelOf(i) {
			differ++
		}
		used[a.modelOf(i)] = true
	}
	if differ < 300 || len(used) != 8 {
		t.Fatalf("seeds 1 and 2 differ on %d of 500 functions, %d models used", differ, len(used))
	}
	bad := Config{Models: models, Functions: 1, Assign: "sorted", Arrivals: []Arrival{}}
	if err := bad.check(); err == nil {
		t.Fatal("assign sorted accepted")
	}
}

// TestGammaArrivals: a function of 600 requests a minute for an hour gets about 36,000 requests whatever the CV,
// with inter-arrival times of about the CV asked for (1: Poisson; 4: bursty).
func TestGammaArrivals(t *testing.T) {
	counts := make([]int, 60)
	for i := range counts {
		counts[i] = 600
	}
	tr := &Trace{Functions: []string{"f"}, Counts: [][]int{counts}}
	for _, cv := range []float64{1, 4} {
		arr, err := TraceArrivals(Config{Trace: tr, Models: make([]Model, 1), Functions: 1, Minutes: 60, Seed: 7,
			ArrivalCV: cv})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(arr); math.Abs(float64(n)-36000) > 0.1*36000 {
			t.Fatalf("cv %v: %d requests, want about 36000", cv, n)
		}
		var sum, sq float64
		for i := 1; i < len(arr); i++ {
			if arr[i].At < arr[i-1].At || arr[i].At >= time.Hour {
				t.Fatalf("cv %v: arrival %d at %v out of order or range", cv, i, arr[i].At)
			}
			g := (arr[i].At - arr[i-1].At).Seconds()
			sum, sq = sum+g, sq+g*g
		}
		n := float64(len(arr) - 1)
		mean := sum / n
		got := math.Sqrt(sq/n-mean*mean) / mean
		if got < 0.8*cv || got > 1.2*cv {
			t.Fatalf("cv %v: inter-arrival cv %.2f", cv, got)
		}
	}
}

// TestBusyFunctionsAndRemotedTimes: functions with at least 50 requests are counted apart; static packing is
// charged native times unless every policy is charged the remoted ones.
func TestBusyFunctionsAndRemotedTimes(t *testing.T) {
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	models := []Model{{Name: "m", WeightsBytes: 100e6, Native: msd(30), Remote: msd(20), SLO: msd(25), Percentile: 98}}
	var arr []Arrival
	for i := range 60 {
		arr = append(arr, Arrival{At: time.Duration(i) * time.Second, Function: 0})
		if i < 10 {
			arr = append(arr, Arrival{At: time.Duration(i)*time.Second + 500*time.Millisecond, Function: 1})
		}
	}
	for _, remoted := range []bool{false, true} {
		r, err := Run(Config{Models: models, Functions: 2, Node: node, Arrivals: arr, Policy: controller.PolicyStatic,
			RemotedTimes: remoted}, true)
		if err != nil {
			t.Fatal(err)
		}
		if r.FunctionsBusy != 1 || r.FunctionsWithTraffic != 2 {
			t.Fatalf("busy %d of %d functions, want 1 of 2", r.FunctionsBusy, r.FunctionsWithTraffic)
		}
		want := msd(30)
		if remoted {
			want = msd(20)
		}
		if lat := r.PerRequest[0].Latency; lat != want {
			t.Fatalf("remoted %v: latency %v, want %v", remoted, lat, want)
		}
		if met := r.FunctionsBusyMet == 1; met != remoted {
			t.Fatalf("remoted %v: busy functions within SLO %d", remoted, r.FunctionsBusyMet)
		}
	}
}
