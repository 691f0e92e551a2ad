// Package simulate replays an invocation trace through the gpuserver's controller on a virtual clock and a
// modelled node (gpuserver/topology's link model), so that every policy figure comes from the code that ships.
//
// Traces and model profiles are the CSV formats of the project's shared workloads: a trace has one row per
// function and one column per minute of invocation counts (Torpor's "function,minute_1,..." or the Azure 2019
// "HashOwner,HashApp,HashFunction,Trigger,480,..." layout); a model profile is Torpor's Table 4 layout
// (model,weights_mb,native_ms,remoting_ms,swap_pcie_ms,swap_nvlink_ms,heavy,slo_ms,slo_percentile) or Clockwork's
// (model,input_kb,output_kb,weights_mb,h2d_transfer_ms,exec_b1_ms,...).
package simulate

import (
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidInput is wrapped by errors about traces, model profiles and simulation settings.
var ErrInvalidInput = errors.New("invalid simulation input")

// Trace holds invocation counts per function and minute.
type Trace struct {
	Functions []string
	Counts    [][]int // [function][minute]
}

// Minutes is the length of the trace.
func (t *Trace) Minutes() int {
	if len(t.Counts) == 0 {
		return 0
	}
	return len(t.Counts[0])
}

// LoadTrace reads a trace CSV file.
func LoadTrace(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	return ParseTrace(f)
}

// ParseTrace reads a trace: the minute columns are those whose header is a number or "minute_N"; the function's
// name is the last non-minute column before them that is not "Trigger".
func ParseTrace(r io.Reader) (*Trace, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%w: trace: %w", ErrInvalidInput, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%w: trace: needs a header and at least one function row", ErrInvalidInput)
	}
	head := rows[0]
	first, nameCol := -1, 0
	for i, h := range head {
		h = strings.TrimSpace(h)
		_, numErr := strconv.Atoi(strings.TrimPrefix(h, "minute_"))
		if numErr == nil {
			first = i
			break
		}
		if h != "Trigger" {
			nameCol = i
		}
	}
	if first < 0 {
		return nil, fmt.Errorf("%w: trace: no minute columns in the header", ErrInvalidInput)
	}
	t := &Trace{}
	for n, row := range rows[1:] {
		if len(row) != len(head) {
			return nil, fmt.Errorf("%w: trace line %d: %d fields, header has %d", ErrInvalidInput, n+2, len(row), len(head))
		}
		counts := make([]int, 0, len(row)-first)
		for i, s := range row[first:] {
			v, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || v < 0 {
				return nil, fmt.Errorf("%w: trace line %d column %q: %q is not a count", ErrInvalidInput, n+2, head[first+i], s)
			}
			counts = append(counts, v)
		}
		t.Functions = append(t.Functions, row[nameCol])
		t.Counts = append(t.Counts, counts)
	}
	return t, nil
}

// Model is the profile of one model on the reference GPU (V100).
type Model struct {
	Name         string
	WeightsBytes uint64
	// Native is the execution time in a function's own process; Remote through the gpuserver.
	Native, Remote time.Duration
	// SwapPCIe and SwapNVLink are the measured request latencies when the model is swapped in (pipelined); 0 when
	// not measured.
	SwapPCIe, SwapNVLink time.Duration
	// H2D is the measured host-to-device transfer time of the weights; 0 when not measured.
	H2D time.Duration
	// SLO and Percentile of functions running the model; 0 when the profile gives none.
	SLO        time.Duration
	Percentile float64
}

// LoadModels reads a model profile CSV file.
func LoadModels(path string) ([]Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open models: %w", err)
	}
	defer f.Close()
	return ParseModels(f)
}

// ParseModels reads a model profile in the Torpor or Clockwork layout.
func ParseModels(r io.Reader) ([]Model, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%w: models: %w", ErrInvalidInput, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("%w: models: needs a header and at least one model", ErrInvalidInput)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[strings.TrimSpace(h)] = i
	}
	need := func(names ...string) error {
		for _, n := range names {
			if _, ok := col[n]; !ok {
				return fmt.Errorf("%w: models: missing column %q", ErrInvalidInput, n)
			}
		}
		return nil
	}
	torpor := false
	if _, ok := col["remoting_ms"]; ok {
		torpor = true
		if err := need("model", "weights_mb", "native_ms", "remoting_ms", "swap_pcie_ms", "swap_nvlink_ms", "slo_ms",
			"slo_percentile"); err != nil {
			return nil, err
		}
	} else if err := need("model", "weights_mb", "h2d_transfer_ms", "exec_b1_ms"); err != nil {
		return nil, err
	}
	var out []Model
	for n, row := range rows[1:] {
		num := func(name string) (float64, error) {
			v, err := strconv.ParseFloat(strings.TrimSpace(row[col[name]]), 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("%w: models line %d column %q: %q is not a non-negative number", ErrInvalidInput,
					n+2, name, row[col[name]])
			}
			return v, nil
		}
		msOf := func(name string) (time.Duration, error) {
			v, err := num(name)
			return time.Duration(v * float64(time.Millisecond)), err
		}
		var m Model
		var errs []error
		m.Name = row[col["model"]]
		w, err := num("weights_mb")
		errs = append(errs, err)
		m.WeightsBytes = uint64(w * 1e6)
		if torpor {
			var e [6]error
			m.Native, e[0] = msOf("native_ms")
			m.Remote, e[1] = msOf("remoting_ms")
			m.SwapPCIe, e[2] = msOf("swap_pcie_ms")
			m.SwapNVLink, e[3] = msOf("swap_nvlink_ms")
			m.SLO, e[4] = msOf("slo_ms")
			m.Percentile, e[5] = num("slo_percentile")
			errs = append(errs, e[:]...)
		} else {
			var e [2]error
			m.H2D, e[0] = msOf("h2d_transfer_ms")
			m.Remote, e[1] = msOf("exec_b1_ms")
			m.Native = m.Remote
			errs = append(errs, e[:]...)
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		if m.WeightsBytes == 0 || m.Remote <= 0 {
			return nil, fmt.Errorf("%w: models line %d: weights and execution time must be > 0", ErrInvalidInput, n+2)
		}
		out = append(out, m)
	}
	return out, nil
}

// LoadArrivals reads an arrivals CSV file (see ParseArrivals).
func LoadArrivals(path string) ([]Arrival, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open arrivals: %w", err)
	}
	defer f.Close()
	return ParseArrivals(f)
}

// ParseArrivals reads explicit arrivals: a header "at_ms,function", then one row per request with its arrival in
// milliseconds from the start (fractions allowed) and the index of its function (0, 1, ...). Rows may come in any
// order; the result is sorted by time (ties by function, then by row).
func ParseArrivals(r io.Reader) ([]Arrival, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%w: arrivals: %w", ErrInvalidInput, err)
	}
	if len(rows) < 1 || len(rows[0]) != 2 || strings.TrimSpace(rows[0][0]) != "at_ms" ||
		strings.TrimSpace(rows[0][1]) != "function" {
		return nil, fmt.Errorf("%w: arrivals: the header must be \"at_ms,function\"", ErrInvalidInput)
	}
	out := make([]Arrival, 0, len(rows)-1)
	for n, row := range rows[1:] {
		at, err := strconv.ParseFloat(strings.TrimSpace(row[0]), 64)
		if err != nil || at < 0 || math.IsInf(at, 0) || math.IsNaN(at) || at > float64(math.MaxInt64/int64(time.Millisecond)) {
			return nil, fmt.Errorf("%w: arrivals line %d column \"at_ms\": %q is not a time in milliseconds >= 0",
				ErrInvalidInput, n+2, row[0])
		}
		fn, err := strconv.Atoi(strings.TrimSpace(row[1]))
		if err != nil || fn < 0 {
			return nil, fmt.Errorf("%w: arrivals line %d column \"function\": %q is not a function index >= 0",
				ErrInvalidInput, n+2, row[1])
		}
		out = append(out, Arrival{At: time.Duration(math.Round(at * float64(time.Millisecond))), Function: fn})
	}
	sortArrivals(out)
	return out, nil
}

// sortArrivals orders arrivals by time, then function, keeping the order of equal ones.
func sortArrivals(as []Arrival) {
	slices.SortStableFunc(as, func(a, b Arrival) int {
		if a.At != b.At {
			return cmp.Compare(a.At, b.At)
		}
		return a.Function - b.Function
	})
}

// TorporArrivals builds arrivals the way Torpor's node simulator (misc/tools/node_simu.py) draws them from a
// trace: functions rows of the trace drawn uniformly with replacement; for each minute, as many requests as the
// drawn rows' counts for that minute add up to, each request's function drawn in proportion to those counts, and
// the requests spaced by whole-millisecond intervals drawn from a Poisson distribution whose mean spreads them
// over the minute (so arrivals are far more regular than a Poisson process: a coefficient of variation of about
// 0.4 at 700 functions against 1). Time runs on from one minute's last request to the next minute's first.
func TorporArrivals(tr *Trace, functions, minutes int, seed uint64) ([]Arrival, error) {
	if tr == nil || len(tr.Counts) == 0 || functions <= 0 || minutes <= 0 || minutes > maxMinutes {
		return nil, fmt.Errorf("%w: torpor arrivals: need a trace, functions > 0 and minutes in 1..%d",
			ErrInvalidInput, maxMinutes)
	}
	rng := rand.New(rand.NewPCG(seed, 0x70a907))
	rows := make([]int, functions)
	for i := range rows {
		rows[i] = rng.IntN(len(tr.Counts))
	}
	var out []Arrival
	var at time.Duration
	cum := make([]int, functions)
	for m := range minutes {
		total := 0
		for i, r := range rows {
			total += tr.Counts[r][m%tr.Minutes()]
			cum[i] = total
		}
		if total == 0 {
			continue
		}
		mean := 60000 / float64(total)
		for range total {
			at += time.Duration(poisson(rng, mean)) * time.Millisecond
			k := rng.IntN(total)
			f, _ := slices.BinarySearch(cum, k+1)
			out = append(out, Arrival{At: at, Function: f})
		}
	}
	sortArrivals(out)
	return out, nil
}

// poisson draws from a Poisson distribution of mean lambda: Knuth's product of uniforms, in pieces of mean at
// most 500 so that exp(-lambda) does not underflow.
func poisson(rng *rand.Rand, lambda float64) int {
	n := 0
	for lambda > 0 {
		l := min(lambda, 500)
		lambda -= l
		limit, p := math.Exp(-l), 1.0
		for {
			p *= rng.Float64()
			if p <= limit {
				break
			}
			n++
		}
	}
	return n
}

// gammaArrivals appends function fn's arrivals over minutes drawn as a renewal process with Gamma inter-arrival
// times of coefficient of variation cv, time-changed so that its rate follows count(m) per minute: in operational
// time (one unit per expected request) the gaps are Gamma with mean 1 and shape 1/cv^2; a point at operational
// time tau lands in the minute whose cumulative count passes tau, spread linearly within it. The process starts
// in equilibrium (its first gap a uniform share of a gap), so the first minute is not biased.
func gammaArrivals(out []Arrival, rng *rand.Rand, fn int, cv float64, minutes int, count func(m int) int) []Arrival {
	shape := 1 / (cv * cv)
	gap := func() float64 { return gammaDraw(rng, shape) / shape }
	tau := rng.Float64() * gap()
	base := 0.0 // cumulative expected requests before minute m
	for m := range minutes {
		c := float64(count(m))
		for c > 0 && tau < base+c {
			at := time.Duration(m)*time.Minute + time.Duration((tau-base)/c*float64(time.Minute))
			out = append(out, Arrival{At: min(at, time.Duration(m+1)*time.Minute-1), Function: fn})
			tau += gap()
		}
		base += c
	}
	return out
}

// gammaDraw draws from a Gamma distribution of the given shape and scale 1 (Marsaglia and Tsang; a shape under
// 1 is boosted by one and scaled back by U^(1/shape)).
func gammaDraw(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gammaDraw(rng, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// Without returns a copy of the trace without the given rows (indices into Functions), e.g. a dominant
// function, so that a benchmark can report its figures with and without it.
func (t *Trace) Without(rows ...int) *Trace {
	drop := map[int]bool{}
	for _, r := range rows {
		drop[r] = true
	}
	out := &Trace{}
	for i := range t.Counts {
		if !drop[i] {
			out.Functions = append(out.Functions, t.Functions[i])
			out.Counts = append(out.Counts, t.Counts[i])
		}
	}
	return out
}
