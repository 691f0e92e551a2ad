// Package trace reads and writes replay traces: the remoted calls of one steady-state forward pass in the order a
// client makes them, each with the client's own time before it, the driver calls it made meanwhile and the GPU
// time of its work, plus the constants of the native driver that the native pass is computed with. The format
// (shim/testdata/trace/README.md, "Replay traces"):
//
//	# faas-gpu replay trace 1
//	# <key>\t<value>            header lines (Header's fields, by their tsv names)
//	<call>\t<gap_ns>\t<local>\t<gpu_ns>\t<record_bytes>
//
// call is cuLaunchKernel, cuLaunchKernelEx, cuMemsetD8Async or cuCtxSynchronize (the last line, once); gap_ns the
// client's time between the return of the previous remoted call (or the start of the pass) and this call, not
// counting the driver calls it made meanwhile; local the number of those driver calls (answered in the shim
// through the shim, by the driver natively); gpu_ns the GPU time of the call's work; record_bytes the size of the
// record the shim writes for it.
package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Magic is a trace's first line.
const Magic = "# faas-gpu replay trace 1"

// Kinds of calls a trace holds.
const (
	Launch   = "cuLaunchKernel"
	LaunchEx = "cuLaunchKernelEx"
	Memset   = "cuMemsetD8Async"
	Sync     = "cuCtxSynchronize"
)

// Limits of a trace a reader accepts.
const (
	MaxCalls       = 1 << 20
	MaxGap         = time.Second
	MaxGPU         = time.Second
	MaxLocal       = 1 << 20
	MaxRecordBytes = 1 << 20
)

// ErrFormat is wrapped by every error of Parse.
var ErrFormat = errors.New("replay trace")

// Call is one remoted call.
type Call struct {
	Kind        string
	Gap         time.Duration // client time before the call, driver calls not counted
	Local       int           // driver calls made in the gap
	GPU         time.Duration // GPU time of the call's work
	RecordBytes int           // the shim's record for it
}

// Header describes a trace and carries the native driver's constants.
type Header struct {
	Model  string // resnet152, bert-base
	Batch  int
	GPU    string // the GPU the figures come from
	Source string // how the trace was made
	// NativeCall is the native driver's CPU time per remoted call (a launch or memset), NativeLocal per driver
	// call the shim answers locally, NativeSync the time of the final synchronize once the GPU finished.
	NativeCall, NativeLocal, NativeSync time.Duration
	// Reference figures of the same pass on a real GPU (0 when unknown): p50 natively and through the shim.
	NativeP50, ShimP50 time.Duration
	// Notes are free-text lines of the derivation, written as "# note\t..." lines.
	Notes []string
}

// Trace is one pass.
type Trace struct {
	Header
	Calls []Call
}

func (t *Trace) Name() string { return fmt.Sprintf("%s b%d", t.Model, t.Batch) }

// Parse reads a trace.
func Parse(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	t := &Trace{}
	line := 0
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: line %d: %s", ErrFormat, line, fmt.Sprintf(format, a...))
	}
	for sc.Scan() {
		line++
		text := sc.Text()
		if line == 1 {
			if text != Magic {
				return nil, bad("first line %q, want %q", text, Magic)
			}
			continue
		}
		if text == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(text, "# "); ok {
			key, value, ok := strings.Cut(rest, "\t")
			if !ok {
				continue // a comment
			}
			if err := t.set(key, value); err != nil {
				return nil, bad("%s: %v", key, err)
			}
			continue
		}
		f := strings.Split(text, "\t")
		if len(f) != 5 {
			return nil, bad("%d fields, want 5 (call gap_ns local gpu_ns record_bytes)", len(f))
		}
		var c Call
		switch c.Kind = f[0]; c.Kind {
		case Launch, LaunchEx, Memset, Sync:
		default:
			return nil, bad("call %q", c.Kind)
		}
		if len(t.Calls) > 0 && t.Calls[len(t.Calls)-1].Kind == Sync {
			return nil, bad("a call after the synchronize")
		}
		var err error
		if c.Gap, err = nanos(f[1], MaxGap); err != nil {
			return nil, bad("gap_ns: %v", err)
		}
		if c.Local, err = count(f[2], MaxLocal); err != nil {
			return nil, bad("local: %v", err)
		}
		if c.GPU, err = nanos(f[3], MaxGPU); err != nil {
			return nil, bad("gpu_ns: %v", err)
		}
		if c.RecordBytes, err = count(f[4], MaxRecordBytes); err != nil {
			return nil, bad("record_bytes: %v", err)
		}
		if len(t.Calls) == MaxCalls {
			return nil, bad("more than %d calls", MaxCalls)
		}
		t.Calls = append(t.Calls, c)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrFormat, line+1, err)
	}
	switch {
	case line == 0:
		return nil, fmt.Errorf("%w: empty", ErrFormat)
	case len(t.Calls) == 0 || t.Calls[len(t.Calls)-1].Kind != Sync:
		return nil, fmt.Errorf("%w: the pass must end with one %s", ErrFormat, Sync)
	case t.Model == "" || t.Batch <= 0:
		return nil, fmt.Errorf("%w: model and batch are required", ErrFormat)
	}
	return t, nil
}

func nanos(s string, limit time.Duration) (time.Duration, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > int64(limit) {
		return 0, fmt.Errorf("%q is not a number of nanoseconds in [0, %d]", s, int64(limit))
	}
	return time.Duration(v), nil
}

func count(s string, limit int) (int, error) {
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 || v > limit {
		return 0, fmt.Errorf("%q is not a count in [0, %d]", s, limit)
	}
	return v, nil
}

func (t *Trace) set(key, value string) error {
	var err error
	switch key {
	case "model":
		t.Model = value
	case "batch":
		t.Batch, err = count(value, 1<<16)
	case "gpu":
		t.GPU = value
	case "source":
		t.Source = value
	case "note":
		t.Notes = append(t.Notes, value)
	case "native_call_ns":
		t.NativeCall, err = nanos(value, MaxGap)
	case "native_local_ns":
		t.NativeLocal, err = nanos(value, MaxGap)
	case "native_sync_ns":
		t.NativeSync, err = nanos(value, MaxGap)
	case "native_p50_ns":
		t.NativeP50, err = nanos(value, MaxGap)
	case "shim_p50_ns":
		t.ShimP50, err = nanos(value, MaxGap)
	default:
		return fmt.Errorf("unknown header key")
	}
	return err
}

// Write writes t in the trace format.
func (t *Trace) Write(w io.Writer) error {
	b := bufio.NewWriter(w)
	fmt.Fprintln(b, Magic)
	for _, kv := range [][2]string{{"model", t.Model}, {"batch", strconv.Itoa(t.Batch)}, {"gpu", t.GPU},
		{"source", t.Source}} {
		fmt.Fprintf(b, "# %s\t%s\n", kv[0], kv[1])
	}
	for _, kv := range []struct {
		k string
		v time.Duration
	}{{"native_call_ns", t.NativeCall}, {"native_local_ns", t.NativeLocal}, {"native_sync_ns", t.NativeSync},
		{"native_p50_ns", t.NativeP50}, {"shim_p50_ns", t.ShimP50}} {
		fmt.Fprintf(b, "# %s\t%d\n", kv.k, int64(kv.v))
	}
	for _, n := range t.Notes {
		fmt.Fprintf(b, "# note\t%s\n", n)
	}
	fmt.Fprintln(b, "# columns: call gap_ns local gpu_ns record_bytes")
	for _, c := range t.Calls {
		fmt.Fprintf(b, "%s\t%d\t%d\t%d\t%d\n", c.Kind, int64(c.Gap), c.Local, int64(c.GPU), c.RecordBytes)
	}
	return b.Flush()
}

// Totals of a trace.
type Totals struct {
	Launches, Memsets, Local, RecordBytes int
	App, GPU                              time.Duration // client time (gaps) and GPU time
}

// Totals sums the trace.
func (t *Trace) Totals() Totals {
	var s Totals
	for _, c := range t.Calls {
		switch c.Kind {
		case Launch, LaunchEx:
			s.Launches++
		case Memset:
			s.Memsets++
		}
		s.Local += c.Local
		s.RecordBytes += c.RecordBytes
		s.App += c.Gap
		s.GPU += c.GPU
	}
	return s
}

// Native is the pass as the native driver runs it: the client issues each call after its gap and its driver
// calls (NativeLocal each), the call itself costing NativeCall; the GPU starts a call's work when it is issued or
// when its previous work ended, whichever is later; the pass ends at the later of the synchronize's issue and the
// GPU's end, plus NativeSync. It returns the pass time, the client's issue time (to the synchronize) and the GPU's
// end.
func (t *Trace) Native() (pass, issue, gpuEnd time.Duration) {
	var now time.Duration
	for _, c := range t.Calls {
		now += c.Gap + time.Duration(c.Local)*t.NativeLocal
		if c.Kind == Sync {
			issue = now
			return max(now, gpuEnd) + t.NativeSync, issue, gpuEnd
		}
		now += t.NativeCall
		gpuEnd = max(now, gpuEnd) + c.GPU
	}
	return max(now, gpuEnd), now, gpuEnd // unreachable for a parsed trace
}

// ShimIssue is the client's issue time through the shim when each local call costs local and each remoted call
// call (the shim's own costs), gaps as recorded.
func (t *Trace) ShimIssue(local, call time.Duration) time.Duration {
	var now time.Duration
	for _, c := range t.Calls {
		now += c.Gap + time.Duration(c.Local)*local
		if c.Kind == Sync {
			return now
		}
		now += call
	}
	return now
}

// Round rounds a duration to ns in a float, for reports.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

// Ms formats d in milliseconds with two decimals.
func Ms(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', 2, 64) }
