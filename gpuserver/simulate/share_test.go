package simulate

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

const oneGPUNode = `name: one-v100
gpus:
- {name: V100, memory_bytes: 17179869184, pcie_switch: 0, copy_engines: 2, h2d_bytes_per_sec: 12e9}
switch_uplink_bytes_per_sec: [12e9]
nvlink_bytes_per_sec: [[0]]
transfer_latency_sec: 0
`

// shareRun runs arrivals (function index, offset in ms) of two functions on one prewarmed GPU under policy:
// function 0 runs model a (20 ms, u 0.4: request 0.2, limit 0.4), function 1 model b (30 ms, u 0.3: request 0.2,
// limit 0.3).
func shareRun(t *testing.T, policy SharePolicy, arrivals [][2]int) Result {
	t.Helper()
	node, err := topology.Parse([]byte(oneGPUNode))
	if err != nil {
		t.Fatal(err)
	}
	models := []Model{
		{Name: "a", WeightsBytes: 100 << 20, Native: 20 * time.Millisecond, Remote: 20 * time.Millisecond,
			SLO: time.Second, Percentile: 98},
		{Name: "b", WeightsBytes: 100 << 20, Native: 30 * time.Millisecond, Remote: 30 * time.Millisecond,
			SLO: time.Second, Percentile: 98},
	}
	var arr []Arrival
	for _, a := range arrivals {
		arr = append(arr, Arrival{At: time.Duration(a[1]) * time.Millisecond, Function: a[0]})
	}
	cfg := Config{Models: models, Functions: 2, Node: node, Policy: controller.PolicyFaaSGPU, Seed: 1,
		Prewarm: true, Arrivals: arr, Minutes: 1,
		Sharing: Sharing{Policy: policy, Profile: map[string]ShareProfile{"a": {U: 0.4}, "b": {U: 0.3}}}}
	res, err := Run(cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func latencies(res Result) map[int][]time.Duration {
	out := map[int][]time.Duration{}
	for _, o := range res.PerRequest {
		out[o.Function] = append(out[o.Function], o.Latency)
	}
	return out
}

func near(t *testing.T, what string, got time.Duration, want float64) {
	t.Helper()
	if math.Abs(float64(got)-want) > float64(20*time.Microsecond) {
		t.Errorf("%s: %v, want %v", what, got, time.Duration(want))
	}
}

// Two co-runners, one request each at once, finish at the times their shares give them: a at 20 ms / (min(1,
// 0.2/0.4) / 1.1), b at its rate beside a until then and alone after.
func TestCoRunnersFinishAtShareWeightedTimes(t *testing.T) {
	ms := float64(time.Millisecond)
	slow := 1 + DefaultCoLocationSlowdown
	for _, tc := range []struct {
		policy       SharePolicy
		rateA, rateB float64 // progress per unit of time, beside each other (before the slowdown)
		aloneB       float64
	}{
		{ShareStatic, 0.2 / 0.4, 0.2 / 0.3, 0.2 / 0.3},
		{ShareGShare, 0.2, 0.2, 0.2}, // the GPU whole for a 0.2 slice: t / 0.2
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			res := shareRun(t, tc.policy, [][2]int{{0, 0}, {1, 0}})
			lat := latencies(res)
			endA := 20 * ms * slow / tc.rateA
			near(t, "a", lat[0][0], endA)
			leftB := 30*ms - endA*tc.rateB/slow
			near(t, "b", lat[1][0], endA+leftB/tc.aloneB)
		})
	}
	t.Run("exclusive", func(t *testing.T) { // one after the other, at their exclusive times
		lat := latencies(shareRun(t, ShareExclusive, [][2]int{{0, 0}, {1, 0}}))
		if lat[0][0] == 20*time.Millisecond {
			near(t, "b after a", lat[1][0], 50*ms)
		} else {
			near(t, "b first", lat[1][0], 30*ms)
			near(t, "a after b", lat[0][0], 50*ms)
		}
	})
}

// Dilu's controller (gpuserver/compute's arbiter, ticked on the virtual clock) scales both co-runners from their
// requests to their limits within one period, since the GPU has room: a runs its first 5 ms at half speed, then
// at full speed beside b (both at the slowdown).
func TestDiluScalesCoRunnersToTheirLimits(t *testing.T) {
	ms := float64(time.Millisecond)
	slow := 1 + DefaultCoLocationSlowdown
	lat := latencies(shareRun(t, ShareDilu, [][2]int{{0, 0}, {1, 0}}))
	p := 5 * ms
	endA := p + (20*ms-p*0.5/slow)*slow
	near(t, "a", lat[0][0], endA)
	leftB := 30*ms - p*(0.2/0.3)/slow - (endA-p)/slow
	near(t, "b", lat[1][0], endA+leftB)
}

// A burst of a's requests while b runs: Dilu's vertical scaling absorbs it (each of a's requests at about its
// exclusive time beside b, never b below its request's rate), where static shares hold a at half speed.
func TestDiluAbsorbsABurst(t *testing.T) {
	arr := [][2]int{{1, 0}}
	for i := range 6 { // a burst: one request of a every 10 ms, two or three of them at once beside b
		arr = append(arr, [2]int{0, 10 * i})
	}
	dilu, static := latencies(shareRun(t, ShareDilu, arr)), latencies(shareRun(t, ShareStatic, arr))
	mean := func(ds []time.Duration) time.Duration {
		var s time.Duration
		for _, d := range ds {
			s += d
		}
		return s / time.Duration(len(ds))
	}
	if len(dilu[0]) != 6 || len(static[0]) != 6 {
		t.Fatalf("served %d and %d of a's 6 requests", len(dilu[0]), len(static[0]))
	}
	t.Logf("a's latencies: dilu %v, static %v; b's: dilu %v, static %v", dilu[0], static[0], dilu[1], static[1])
	if d, s := mean(dilu[0]), mean(static[0]); float64(d) > 0.7*float64(s) {
		t.Errorf("a's burst: mean latency %v with Dilu, %v with static shares: want Dilu below 0.7x", d, s)
	}
	// b's request holds at least its request: 30 ms at 0.2/0.3 of speed and the slowdown, at worst
	slow := 1 + DefaultCoLocationSlowdown
	worst := time.Duration(30 * float64(time.Millisecond) * slow / (0.2 / 0.3))
	if b := dilu[1][0]; b > worst {
		t.Errorf("b beside a's burst: %v, want at most %v (its request's rate)", b, worst)
	}
}

func TestShareProfileAndRule(t *testing.T) {
	p := DefaultShareProfile()
	for _, m := range []string{"densenet169", "densenet201", "inceptionv3", "efficientnet_b0", "resnet50",
		"resnet101", "resnet152", "bert_qa"} {
		if _, ok := p[m]; !ok {
			t.Errorf("no share profile for %s", m)
		}
	}
	for _, tc := range []struct{ u, req, lim float64 }{{0.4, 0.2, 0.4}, {0.3, 0.2, 0.3}, {0.6, 0.3, 0.6},
		{0.2, 0.1, 0.2}, {0.45, 0.3, 0.5}, {1, 0.5, 1}} {
		sp := ShareProfile{U: tc.u}
		if math.Abs(sp.Request()-tc.req) > 1e-9 || math.Abs(sp.Limit()-tc.lim) > 1e-9 {
			t.Errorf("u %v: request %v limit %v, want %v %v", tc.u, sp.Request(), sp.Limit(), tc.req, tc.lim)
		}
	}
	if _, err := ParseShareProfile(strings.NewReader("model,u\nx,1.5\n")); err == nil {
		t.Error("u 1.5 accepted")
	}
	if _, err := ParseSharePolicy("mps"); err == nil {
		t.Error("sharing policy mps accepted")
	}
}
