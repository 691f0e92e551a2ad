package replay

import (
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
)

// Accounting says what became of the requests sent: every one is answered 200, refused (429 or 503), answered
// with another status (failed), or lost (no answer; the client's error). Sent = OK + Refused + Failed + Lost.
type Accounting struct {
	Sent    int64 `json:"sent"`
	OK      int64 `json:"ok"`
	Refused int64 `json:"refused"`
	Failed  int64 `json:"failed"`
	Lost    int64 `json:"lost"`
	// Statuses counts the answers by HTTP status.
	Statuses map[int]int64 `json:"statuses"`
	// LagP99 and LagMax are how late the client sent the requests against their arrival times (milliseconds):
	// the open loop's own delay on a loaded machine.
	LagP99 float64 `json:"send_lag_p99_ms"`
	LagMax float64 `json:"send_lag_max_ms"`
	// Errors holds up to 5 of the lost requests' errors.
	Errors []string `json:"errors,omitempty"`
}

// Account counts the records.
func Account(recs []Record) Accounting {
	a := Accounting{Sent: int64(len(recs)), Statuses: map[int]int64{}}
	lags := make([]float64, 0, len(recs))
	for _, r := range recs {
		lags = append(lags, float64(r.Lag)/float64(time.Millisecond))
		switch {
		case r.Status == 0:
			a.Lost++
			if len(a.Errors) < 5 {
				a.Errors = append(a.Errors, r.Err)
			}
			continue
		case r.Status == http.StatusOK:
			a.OK++
		case r.Refused():
			a.Refused++
		default:
			a.Failed++
		}
		a.Statuses[r.Status]++
	}
	sort.Float64s(lags)
	a.LagP99 = quantile(lags, 0.99)
	if len(lags) > 0 {
		a.LagMax = lags[len(lags)-1]
	}
	return a
}

// Summarize gives the client's view of a replay in the simulator's figures (simulate.Result): a request is on
// time when it was answered 200 within its function's SLO, measured from sending it to the end of its answer
// (so the gateway, the function's process and the HTTP hops count, which the simulator does not model); refused
// ones count as requests not on time, as in the simulator. Swaps, evictions and GPU busy are not the client's to
// see: the caller fills them from the gpuserver (Observe).
func Summarize(name, node string, fns []Function, recs []Record, length time.Duration) simulate.Result {
	res := simulate.Result{Name: name, Node: node, Functions: len(fns), Requests: int64(len(recs)),
		SimulatedSeconds: length.Seconds()}
	total, onTime := make([]int64, len(fns)), make([]int64, len(fns))
	var norm []float64
	for _, r := range recs {
		total[r.Function]++
		slo := fns[r.Function].SLO
		switch {
		case r.Refused():
			res.Rejected++
		case r.Status == http.StatusOK:
			norm = append(norm, float64(r.Latency)/float64(slo))
			if r.Latency <= slo {
				onTime[r.Function]++
				res.RequestsOnTime++
			}
		}
	}
	fill(&res, fns, total, onTime)
	sort.Float64s(norm)
	res.P50, res.P95, res.P98, res.P99 = quantile(norm, 0.50), quantile(norm, 0.95), quantile(norm, 0.98),
		quantile(norm, 0.99)
	return res
}

// fill sets res's function counts from each function's requests and requests on time (the simulator's rule: a
// function meets its SLO with at least its percentile of its requests, refused ones included, on time).
func fill(res *simulate.Result, fns []Function, total, onTime []int64) {
	for i, t := range total {
		if t == 0 {
			continue
		}
		met := float64(onTime[i]) >= fns[i].Percentile/100*float64(t)-1e-9
		res.FunctionsWithTraffic++
		if met {
			res.FunctionsSLOMet++
		}
		if t >= simulate.BusyRequests {
			res.FunctionsBusy++
			if met {
				res.FunctionsBusyMet++
			}
		}
	}
	if res.FunctionsWithTraffic > 0 {
		res.FunctionsSLOMetShare = float64(res.FunctionsSLOMet) / float64(res.FunctionsWithTraffic)
	}
}

// Observe fills res's swaps and evictions with what the gpuserver counted between two of its statuses.
func Observe(res *simulate.Result, before, after pool.Status) {
	res.Swaps = simulate.Swaps{None: after.Swaps["none"] - before.Swaps["none"],
		NVLink: after.Swaps["nvlink"] - before.Swaps["nvlink"], PCIe: after.Swaps["pcie"] - before.Swaps["pcie"]}
	res.Evictions = evictions(after) - evictions(before)
}

func evictions(st pool.Status) int64 {
	if st.Evictions == nil {
		return 0
	}
	n := st.Evictions.Controller
	for _, v := range st.Evictions.DataPlane {
		n += v
	}
	return n
}

// GPUServerView gives the gpuserver's own view of a replay in the simulator's figures, from two of its
// statuses: each function's requests served, on time (from acquire to release, within the SLO: what the
// simulator models) and refused by the overload control between them. Requests the gateway or the function's
// process answered without reaching the gpuserver are not in it.
func GPUServerView(name, node string, fns []Function, before, after pool.Status, length time.Duration) simulate.Result {
	res := simulate.Result{Name: name, Node: node, Functions: len(fns), SimulatedSeconds: length.Seconds()}
	index := map[string]int{}
	for i, f := range fns {
		index[f.Name] = i
	}
	total, onTime := make([]int64, len(fns)), make([]int64, len(fns))
	add := func(st pool.Status, sign int64) {
		for _, f := range st.Functions {
			name, _ := pool.SplitInstance(f.Name)
			i, ok := index[name]
			if !ok {
				continue
			}
			total[i] += sign * (f.Served + f.Refused)
			onTime[i] += sign * f.OnTime
			res.Requests += sign * (f.Served + f.Refused)
			res.RequestsOnTime += sign * f.OnTime
			res.Rejected += sign * f.Refused
		}
	}
	add(after, 1)
	add(before, -1)
	fill(&res, fns, total, onTime)
	Observe(&res, before, after)
	return res
}

// Difference is by how many points (percent of functions or of requests) one result differs from another: this
// minus that.
type Difference struct {
	// FunctionsSLOMet is the share of functions within their SLO (of those with requests).
	FunctionsSLOMet float64 `json:"functions_slo_met_points"`
	// RequestsOnTime is the share of requests served within their SLO.
	RequestsOnTime float64 `json:"requests_on_time_points"`
	// Refused is the share of requests refused.
	Refused float64 `json:"refused_points"`
	// Swaps is the share of requests whose model was swapped in (over NVLink or PCIe).
	Swaps float64 `json:"swaps_points"`
	// Within says whether every difference is at most Target points.
	Within bool `json:"within_target"`
}

// Target is the agreement the replay is held to, in points.
const Target = 5.0

// Compare gives a - b in points.
func Compare(a, b simulate.Result) Difference {
	share := func(n int64, of int64) float64 {
		if of == 0 {
			return 0
		}
		return 100 * float64(n) / float64(of)
	}
	fshare := func(r simulate.Result) float64 {
		if r.FunctionsWithTraffic == 0 {
			return 0
		}
		return 100 * float64(r.FunctionsSLOMet) / float64(r.FunctionsWithTraffic)
	}
	d := Difference{
		FunctionsSLOMet: fshare(a) - fshare(b),
		RequestsOnTime:  share(a.RequestsOnTime, a.Requests) - share(b.RequestsOnTime, b.Requests),
		Refused:         share(a.Rejected, a.Requests) - share(b.Rejected, b.Requests),
		Swaps:           share(a.Swaps.NVLink+a.Swaps.PCIe, a.Requests) - share(b.Swaps.NVLink+b.Swaps.PCIe, b.Requests),
	}
	for _, p := range []*float64{&d.FunctionsSLOMet, &d.RequestsOnTime, &d.Refused, &d.Swaps} {
		*p = math.Round(*p*100) / 100
	}
	d.Within = math.Abs(d.FunctionsSLOMet) <= Target && math.Abs(d.RequestsOnTime) <= Target &&
		math.Abs(d.Refused) <= Target && math.Abs(d.Swaps) <= Target
	return d
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
