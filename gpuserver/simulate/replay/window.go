// Package replay measures the simulator's fidelity: it drives a running `faas-gpu up` on the timed virtual GPU
// with the arrivals of a trace window and sums up what the node answered in the simulator's own figures
// (simulate.Result), so that `faas-gpu replay` can print them beside the simulator's prediction for exactly the
// same arrivals, functions, models, SLOs and node (docs/bench/fidelity.md).
//
// The pieces, in the order the command uses them: Window picks the trace's rows, start minute and length and
// draws the arrivals as the simulator does (window.go); Functions gives every function its model, name, SLO and
// memory quota as the simulator assigns them, and Deployment and WriteBuildContext deploy them as GPU functions
// whose model size and GPU time per request follow the model table (functions.go, function/handler.py); Fire
// sends the arrivals open loop at the gateway and records each request's latency and status (fire.go);
// Summarize turns the records into a simulate.Result, and Compare says by how many points two results differ
// (result.go).
package replay

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
)

// ErrInvalidWindow is wrapped by errors about a window's settings.
var ErrInvalidWindow = errors.New("invalid replay window")

// Window is the part of a trace a replay runs: the trace's rows (its functions, in order), from StartMinute for
// Length, with the arrivals drawn from Seed.
type Window struct {
	Trace       *simulate.Trace
	Rows        []int
	StartMinute int
	Length      time.Duration
	Seed        uint64
}

// ParseRows reads a row list: comma-separated indices and inclusive ranges, e.g. "287,0-19" (rows in that
// order, each at most once).
func ParseRows(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	add := func(r int) error {
		if seen[r] {
			return fmt.Errorf("%w: rows: %d given twice", ErrInvalidWindow, r)
		}
		seen[r] = true
		out = append(out, r)
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b-a > 100000 {
			return nil, fmt.Errorf("%w: rows: %q is not a row index or a range lo-hi of them", ErrInvalidWindow, part)
		}
		for r := a; r <= b; r++ {
			if err := add(r); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Sub is the trace of the window's rows only (function i is row Rows[i]).
func (w Window) Sub() (*simulate.Trace, error) {
	if w.Trace == nil || len(w.Rows) == 0 {
		return nil, fmt.Errorf("%w: needs a trace and at least one row", ErrInvalidWindow)
	}
	sub := &simulate.Trace{}
	for _, r := range w.Rows {
		if r >= len(w.Trace.Counts) {
			return nil, fmt.Errorf("%w: row %d: the trace has %d rows", ErrInvalidWindow, r, len(w.Trace.Counts))
		}
		sub.Functions = append(sub.Functions, w.Trace.Functions[r])
		sub.Counts = append(sub.Counts, w.Trace.Counts[r])
	}
	return sub, nil
}

// Arrivals draws the window's arrivals the way `faas-gpu sim --trace` does (each minute's count spread as a
// Poisson process within the minute, from the seed; simulate.TraceArrivals) over the whole minutes the window
// covers, and keeps those before Length: function i of the result is the window's row Rows[i].
func (w Window) Arrivals(models []simulate.Model) ([]simulate.Arrival, error) {
	if w.Length <= 0 || w.Length > 24*time.Hour {
		return nil, fmt.Errorf("%w: length %v: must be in (0, 24h]", ErrInvalidWindow, w.Length)
	}
	sub, err := w.Sub()
	if err != nil {
		return nil, err
	}
	if w.StartMinute < 0 || w.StartMinute >= sub.Minutes() {
		return nil, fmt.Errorf("%w: start minute %d: the trace has %d minutes", ErrInvalidWindow, w.StartMinute,
			sub.Minutes())
	}
	minutes := int(math.Ceil(w.Length.Minutes()))
	all, err := simulate.TraceArrivals(simulate.Config{Trace: sub, Models: models, Functions: len(w.Rows),
		Minutes: minutes, StartMinute: w.StartMinute, Seed: w.Seed})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidWindow, err)
	}
	out := make([]simulate.Arrival, 0, len(all))
	for _, a := range all {
		if a.At < w.Length {
			out = append(out, a)
		}
	}
	return out, nil
}
