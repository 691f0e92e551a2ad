package replay

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
)

const traceCSV = `function,minute_1,minute_2,minute_3
a,5,0,7
b,1,2,3
c,9,9,9
d,0,4,0
`

const modelsCSV = `model,weights_mb,native_ms,remoting_ms,swap_pcie_ms,swap_nvlink_ms,heavy,slo_ms,slo_percentile
small_net,20,12,10,12,11,false,80,98
big,1000,50,40,90,45,true,200,90
`

func load(t *testing.T) (*simulate.Trace, []simulate.Model) {
	t.Helper()
	tr, err := simulate.ParseTrace(strings.NewReader(traceCSV))
	if err != nil {
		t.Fatal(err)
	}
	ms, err := simulate.ParseModels(strings.NewReader(modelsCSV))
	if err != nil {
		t.Fatal(err)
	}
	return tr, ms
}

func TestParseRows(t *testing.T) {
	got, err := ParseRows("287, 0-2,5")
	if err != nil || !slices.Equal(got, []int{287, 0, 1, 2, 5}) {
		t.Fatalf("got %v %v", got, err)
	}
	for _, bad := range []string{"", "x", "3-1", "-2", "1,1", "0-3,2"} {
		if _, err := ParseRows(bad); !errors.Is(err, ErrInvalidWindow) {
			t.Errorf("%q: %v, want ErrInvalidWindow", bad, err)
		}
	}
}

// TestWindowArrivalsAreTheSimulators: a window of the trace's first rows over whole minutes draws exactly the
// arrivals `faas-gpu sim --trace` replays; a shorter window is their prefix; other rows are those rows' arrivals.
func TestWindowArrivalsAreTheSimulators(t *testing.T) {
	tr, ms := load(t)
	want, err := simulate.TraceArrivals(simulate.Config{Trace: tr, Models: ms, Functions: 4, Minutes: 2,
		StartMinute: 1, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	w := Window{Trace: tr, Rows: []int{0, 1, 2, 3}, StartMinute: 1, Length: 2 * time.Minute, Seed: 7}
	got, err := w.Arrivals(ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 7+5+18+4 || !slices.Equal(got, want) {
		t.Fatalf("window: %d arrivals, sim: %d (want equal)", len(got), len(want))
	}
	w.Length = 90 * time.Second
	short, err := w.Arrivals(ms)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(short); n == 0 || n >= len(want) || !slices.Equal(short, want[:n]) ||
		short[n-1].At >= w.Length {
		t.Errorf("90 s: %d arrivals, not a prefix of the 2 minutes' %d before 90 s", n, len(want))
	}
	w = Window{Trace: tr, Rows: []int{2, 3}, Length: 3 * time.Minute, Seed: 7}
	got, err = w.Arrivals(ms)
	if err != nil {
		t.Fatal(err)
	}
	per := map[int]int{}
	for _, a := range got {
		per[a.Function]++
	}
	if per[0] != 27 || per[1] != 4 {
		t.Errorf("rows 2,3: %v arrivals per function, want 27 (row c) and 4 (row d)", per)
	}
	for _, bad := range []Window{{Trace: tr, Rows: []int{4}, Length: time.Minute},
		{Trace: tr, Rows: []int{0}, StartMinute: 3, Length: time.Minute}, {Trace: tr, Rows: []int{0}}} {
		if _, err := bad.Arrivals(ms); !errors.Is(err, ErrInvalidWindow) {
			t.Errorf("%+v: %v, want ErrInvalidWindow", bad, err)
		}
	}
}

// TestFunctionsAreTheSimulators: models round-robin, the simulator's names (as DNS names), SLOs and quotas.
func TestFunctionsAreTheSimulators(t *testing.T) {
	_, ms := load(t)
	fns, err := Functions(ms, 3)
	if err != nil {
		t.Fatal(err)
	}
	if fns[0].Name != "fn-0000-small-net" || fns[1].Model.Name != "big" || fns[2].Model.Name != "small_net" {
		t.Fatalf("functions %+v", fns)
	}
	if fns[1].SLO != 200*time.Millisecond || fns[1].Percentile != 90 || fns[1].QuotaBytes != 1193<<20 {
		t.Errorf("big: %+v (want SLO 200ms, percentile 90, quota ceil(1e9*1.25/MiB) MiB)", fns[1])
	}
	d := fns[1].Deployment(1, DeployOptions{})
	if d.Image != Image || d.EnvVars[EnvExecNS] != "40000000" || d.EnvVars[EnvModelBytes] != "1000000000" ||
		(*d.Annotations)["com.openfaas.gpu.memory"] != "1193Mi" || (*d.Annotations)["com.openfaas.gpu.slo"] != "200ms" {
		t.Errorf("deployment %+v %v", d, *d.Annotations)
	}
	if d := fns[1].Deployment(3, DeployOptions{}); (*d.Annotations)["com.openfaas.gpu.slo"] != "600ms" || d.EnvVars[EnvExecNS] != "40000000" {
		t.Errorf("in slow motion, 3 times: %v %v (want the SLO scaled, the GPU time not: the GPU scales it)",
			*d.Annotations, d.EnvVars)
	}
}

// TestSummarizeCountsAsTheSimulatorDoes: a request is on time answered 200 within its SLO; a refused one is a
// request not on time; a function meets its SLO with its percentile of requests on time.
func TestSummarizeCountsAsTheSimulatorDoes(t *testing.T) {
	_, ms := load(t)
	fns, _ := Functions(ms, 2) // SLO 80 ms at 98%, 200 ms at 90%
	var recs []Record
	for range 10 {
		recs = append(recs, Record{Function: 1, Status: 200, Latency: 100 * time.Millisecond})
	}
	recs[0].Status = http.StatusTooManyRequests // 9 of 10 on time: 90% meets
	recs = append(recs, Record{Function: 0, Status: 200, Latency: 50 * time.Millisecond},
		Record{Function: 0, Status: 200, Latency: 90 * time.Millisecond}, // late: 1 of 2 misses 98%
		Record{Function: 0, Status: 0, Err: "lost"})
	r := Summarize("x", "v100x4", fns, recs, time.Minute)
	if r.Requests != 13 || r.RequestsOnTime != 10 || r.Rejected != 1 || r.FunctionsWithTraffic != 2 ||
		r.FunctionsSLOMet != 1 {
		t.Errorf("result %+v", r)
	}
	a := Account(recs)
	if a.Sent != 13 || a.OK != 11 || a.Refused != 1 || a.Lost != 1 || a.Failed != 0 || len(a.Errors) != 1 {
		t.Errorf("accounting %+v", a)
	}

	before := pool.Status{Swaps: map[string]int64{"pcie": 2}, Functions: []pool.FunctionStatus{
		{FunctionSpec: pool.FunctionSpec{Name: fns[0].Name}, Served: 5, OnTime: 5}}}
	after := pool.Status{Swaps: map[string]int64{"pcie": 5, "none": 4},
		Evictions: &pool.EvictionCounts{Controller: 1, DataPlane: map[string]int64{"pressure": 2}},
		Functions: []pool.FunctionStatus{
			{FunctionSpec: pool.FunctionSpec{Name: fns[0].Name}, Served: 7, OnTime: 6},
			{FunctionSpec: pool.FunctionSpec{Name: pool.InstanceKey(fns[1].Name, "r1")}, Served: 9, OnTime: 9, Refused: 1},
			{FunctionSpec: pool.FunctionSpec{Name: "not-replayed"}, Served: 100}}}
	g := GPUServerView("g", "v100x4", fns, before, after, time.Minute)
	if g.Requests != 12 || g.RequestsOnTime != 10 || g.Rejected != 1 || g.FunctionsSLOMet != 1 ||
		g.Swaps.PCIe != 3 || g.Swaps.None != 4 || g.Evictions != 3 {
		t.Errorf("gpuserver view %+v", g)
	}
	d := Compare(r, g)
	if d.Within || d.Refused != -0.64 || d.RequestsOnTime != -6.41 {
		t.Errorf("difference %+v", d)
	}
	if d := Compare(g, g); !d.Within || d.FunctionsSLOMet != 0 || d.Swaps != 0 {
		t.Errorf("a result against itself: %+v", d)
	}
}
