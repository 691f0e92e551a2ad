// Command gentrace writes the replay traces of shim/testdata/trace (replay-<model>-b<batch>.tsv) from two inputs:
// the shim's call log of one dry forward pass on the CPU (the order of the remoted calls, their record sizes, the
// driver calls answered in the shim between them and the shape of the client's gaps: `make replay-calllog`), and
// the figures of the same pass on a real GPU (shim/testdata/trace/h100-passes.tsv). Until `make gpu-trace` records
// per-kernel GPU times and issue gaps on a GPU, these are the only figures there are; the derivation, written
// into each trace's notes and into shim/testdata/trace/README.md:
//
//   - The native pass is launch-bound (the H100's passes were: 20 ms of CPU per 19 ms pass), so the native
//     client's issue time is the native p50 less the final synchronize (NativeSync), and the CPU the native
//     process spent beside the issuing thread is its CPU per pass less that p50.
//   - Through the shim the issuing thread's time is the shim's CPU per pass less the same beside-thread CPU.
//   - The client's own time (the gaps) is the shim issue time less the shim's nominal costs (-shim-local per call
//     answered in the shim, -shim-call per remoted call), spread over the calls in the shape of the dry run's gaps
//     (each less its local calls' nominal cost, clipped at the 99th percentile).
//   - The native driver costs -native-call per remoted call (cuLaunchKernel's host overhead) and NativeLocal per
//     local call, the latter solved so that the native issue time comes out.
//   - The pass's GPU time G is fitted to the shim p50 with the shim's batching of that run (-batch-records,
//     -batch-bytes): the GPU runs each launch once its batch is published and the previous launch ended, and the
//     pass ends -overshoot (the backend's timer-polled synchronize: half of Go's 1.1 ms sub-millisecond timer) after
//     the later of the GPU's end and the synchronize. G is spread evenly over the launches (memsets: 0).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/test/bench/replay/trace"
)

type config struct {
	calllogs, reference, out, profiles         string
	nativeCall, nativeSync, shimLocal, shimCal time.Duration
	overshoot                                  time.Duration
	batchRecords, batchBytes                   int
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gentrace:", err)
		os.Exit(2)
	}
}

func run(args []string, stdout io.Writer) error {
	var c config
	fs := flag.NewFlagSet("gentrace", flag.ContinueOnError)
	fs.StringVar(&c.calllogs, "calllogs", "", "directory of the dry run's call logs (calllog-<model>-b<batch>.tsv)")
	fs.StringVar(&c.reference, "reference", "shim/testdata/trace/h100-passes.tsv", "the GPU's figures per pass")
	fs.StringVar(&c.out, "out", "shim/testdata/trace", "directory the traces are written to")
	fs.StringVar(&c.profiles, "profiles", "", "directory of gpu-profile-<model>-b<batch>.tsv (make gpu-trace): "+
		"per-launch GPU times and issue gaps recorded on a GPU, used where present")
	fs.DurationVar(&c.nativeCall, "native-call", 2500*time.Nanosecond, "native driver CPU per remoted call")
	fs.DurationVar(&c.nativeSync, "native-sync", 10*time.Microsecond, "native synchronize after the GPU finished")
	fs.DurationVar(&c.shimLocal, "shim-local", 50*time.Nanosecond, "nominal shim CPU per locally answered call")
	fs.DurationVar(&c.shimCal, "shim-call", 300*time.Nanosecond, "nominal shim CPU per remoted async call")
	fs.DurationVar(&c.overshoot, "overshoot", 550*time.Microsecond, "the reference run's synchronize overshoot")
	fs.IntVar(&c.batchRecords, "batch-records", 1024, "the reference run's shim: records per published batch")
	fs.IntVar(&c.batchBytes, "batch-bytes", 256<<10, "the reference run's shim: bytes per published batch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.calllogs == "" {
		return errors.New("-calllogs: required")
	}
	refs, err := readReference(c.reference)
	if err != nil {
		return fmt.Errorf("-reference: %w", err)
	}
	for _, r := range refs {
		log, err := readCallLog(filepath.Join(c.calllogs, fmt.Sprintf("calllog-%s-b%d.tsv", r.model, r.batch)))
		if err != nil {
			return fmt.Errorf("-calllogs: %w", err)
		}
		var prof []profiled
		if c.profiles != "" {
			path := filepath.Join(c.profiles, fmt.Sprintf("gpu-profile-%s-b%d.tsv", r.model, r.batch))
			if _, err := os.Stat(path); err == nil {
				if prof, err = readProfile(path); err != nil {
					return fmt.Errorf("-profiles: %w", err)
				}
			}
		}
		t, err := build(c, r, log, prof)
		if err != nil {
			return fmt.Errorf("%s b%d: %w", r.model, r.batch, err)
		}
		path := filepath.Join(c.out, fmt.Sprintf("replay-%s-b%d.tsv", r.model, r.batch))
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = t.Write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		tot := t.Totals()
		pass, issue, _ := t.Native()
		fmt.Fprintf(stdout, "%s: %d calls, GPU %s ms, native issue %s ms (pass %s), shim issue %s ms\n", path,
			len(t.Calls), trace.Ms(tot.GPU), trace.Ms(issue), trace.Ms(pass), trace.Ms(t.ShimIssue(c.shimLocal,
				c.shimCal)))
	}
	return nil
}

// reference is one pass's figures on the GPU.
type reference struct {
	model                                  string
	batch                                  int
	nativeP50, shimP50, nativeCPU, shimCPU time.Duration
	local                                  int
	gpu                                    string
}

func readReference(path string) ([]reference, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []reference
	sc := bufio.NewScanner(f)
	gpu := ""
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			if strings.Contains(line, "H100") && gpu == "" {
				gpu = "NVIDIA H100 80GB HBM3"
			}
			continue
		}
		fs := strings.Split(line, "\t")
		if len(fs) != 7 {
			return nil, fmt.Errorf("%s:%d: %d fields, want 7", path, n, len(fs))
		}
		r := reference{model: fs[0], gpu: gpu}
		var err error
		if r.batch, err = strconv.Atoi(fs[1]); err != nil {
			return nil, fmt.Errorf("%s:%d: batch: %w", path, n, err)
		}
		for i, p := range []*time.Duration{&r.nativeP50, &r.shimP50, &r.nativeCPU, &r.shimCPU} {
			v, err := strconv.ParseFloat(fs[2+i], 64)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("%s:%d: field %d: %q", path, n, 3+i, fs[2+i])
			}
			*p = time.Duration(v * 1e6)
		}
		if r.local, err = strconv.Atoi(fs[6]); err != nil {
			return nil, fmt.Errorf("%s:%d: local_calls: %w", path, n, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// logged is one call of the shim's call log.
type logged struct {
	kind       string
	begin, end int64
	bytes      int
	local      int64
}

func readCallLog(path string) ([]logged, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []logged
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		fs := strings.Split(line, "\t")
		if len(fs) != 6 {
			return nil, fmt.Errorf("%s:%d: %d fields, want 6", path, n, len(fs))
		}
		var l logged
		l.kind = fs[2]
		vals := []*int64{&l.begin, &l.end, &l.local}
		for i, s := range []string{fs[0], fs[1], fs[5]} {
			if *vals[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
		}
		if l.bytes, err = strconv.Atoi(fs[3]); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) < 2 || out[len(out)-1].kind != trace.Sync {
		return nil, fmt.Errorf("%s: %d calls, the last not a %s", path, len(out), trace.Sync)
	}
	return out, nil
}

// profiled is one call of a GPU profile (test/gpu/profile_torch.py): when the client issued it, how long the call
// took, and the GPU time of its work.
type profiled struct {
	kind               string // kernel, memset, memcpy, sync
	start, dur, gpuDur time.Duration
}

func readProfile(path string) ([]profiled, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []profiled
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	us := func(s string) (time.Duration, error) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || v > 1e7 {
			return 0, fmt.Errorf("%q is not a time in microseconds", s)
		}
		return time.Duration(v * 1e3), nil
	}
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		fs := strings.Split(line, "\t")
		if len(fs) < 7 {
			return nil, fmt.Errorf("%s:%d: %d fields, want 7", path, n, len(fs))
		}
		p := profiled{kind: fs[3]}
		for i, d := range []*time.Duration{&p.start, &p.dur, nil, &p.gpuDur} {
			if d == nil {
				continue
			}
			if *d, err = us([]string{fs[1], fs[2], "", fs[5]}[i]); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
		}
		out = append(out, p)
	}
	return out, sc.Err()
}

func build(c config, r reference, log []logged, prof []profiled) (*trace.Trace, error) {
	beside := r.nativeCPU - r.nativeP50 // CPU of the native process beside its issuing thread
	if beside < 0 {
		beside = 0
	}
	issueNative := r.nativeP50 - c.nativeSync
	issueShim := r.shimCPU - beside
	t := &trace.Trace{Header: trace.Header{Model: r.model, Batch: r.batch, GPU: r.gpu, NativeCall: c.nativeCall,
		NativeSync: c.nativeSync, NativeP50: r.nativeP50, ShimP50: r.shimP50,
		Source: "synthesized by test/bench/replay/gentrace from a dry run's call log and the GPU's per-pass " +
			"figures (no per-kernel GPU times or recorded gaps yet: make gpu-trace)"}}
	// locals per gap; the first gap gets what the log does not place
	locals := make([]int, len(log))
	placed := 0
	for i := 1; i < len(log); i++ {
		locals[i] = int(log[i].local - log[i-1].local)
		placed += locals[i]
	}
	locals[0] = max(r.local-placed, 0)
	// the gaps' shape (the dry run's without the local calls' nominal cost, or the GPU profile's), clipped at the
	// 99th percentile
	raw := make([]float64, len(log))
	var work []time.Duration // GPU time per call, from the profile
	if prof != nil {
		var calls []profiled
		for _, p := range prof {
			if p.kind != "sync" {
				calls = append(calls, p)
			}
		}
		if len(calls) != len(log)-1 {
			return nil, fmt.Errorf("the GPU profile has %d launches, memsets and copies, the call log %d async calls",
				len(calls), len(log)-1)
		}
		for i := 1; i < len(calls); i++ {
			raw[i] = max(float64(calls[i].start-calls[i-1].start-calls[i-1].dur), 0)
		}
		for _, p := range calls {
			work = append(work, p.gpuDur)
		}
	} else {
		for i := 1; i < len(log); i++ {
			raw[i] = max(float64(log[i].begin-log[i-1].end)-float64(locals[i])*float64(c.shimLocal), 0)
		}
	}
	sorted := slices.Clone(raw[1:])
	slices.Sort(sorted)
	p99, median := sorted[len(sorted)*99/100], sorted[len(sorted)/2]
	raw[0] = median
	var sum float64
	for i := range raw {
		raw[i] = min(raw[i], p99)
		sum += raw[i]
	}
	remoted := len(log) - 1 // async calls; the synchronize's own cost is not the client's issue time
	totalLocal := placed + locals[0]
	app := issueShim - time.Duration(totalLocal)*c.shimLocal - time.Duration(remoted)*c.shimCal
	if app <= 0 || sum <= 0 {
		return nil, fmt.Errorf("no client time left: shim issue %v", issueShim)
	}
	launches := 0
	for i, l := range log {
		call := trace.Call{Kind: l.kind, Gap: time.Duration(raw[i] / sum * float64(app)), Local: locals[i],
			RecordBytes: l.bytes}
		switch l.kind {
		case trace.Launch, trace.LaunchEx:
			launches++
		case trace.Memset, trace.Sync:
		default:
			return nil, fmt.Errorf("call %d: %s is not a call a replay makes", i, l.kind)
		}
		t.Calls = append(t.Calls, call)
	}
	// the native driver's cost per local call, so that the native issue time comes out
	var appSum time.Duration
	for _, cl := range t.Calls {
		appSum += cl.Gap
	}
	nativeLocal := (issueNative - appSum - time.Duration(remoted)*c.nativeCall) / time.Duration(max(totalLocal, 1))
	if nativeLocal < 0 {
		return nil, fmt.Errorf("the native issue time %v is below the client's own time %v plus the driver's "+
			"launches: lower -native-call", issueNative, appSum)
	}
	t.NativeLocal = nativeLocal
	// G: measured per call on the GPU where profiled, else fitted to the shim p50 under the reference run's batching
	var g, per time.Duration
	gpuNote := ""
	if work != nil {
		for i := range work {
			t.Calls[i].GPU = work[i]
			g += work[i]
		}
		t.Source = "made by test/bench/replay/gentrace from a dry run's call log, a GPU profile (per-call GPU times " +
			"and the shape of the issue gaps) and the GPU's per-pass figures"
		gpuNote = fmt.Sprintf("GPU time %s ms measured per call on the GPU (gpu-profile-%s-b%d.tsv)", trace.Ms(g),
			r.model, r.batch)
	} else {
		lo, hi := time.Duration(0), r.shimP50
		for range 60 {
			mid := (lo + hi) / 2
			if shimModel(c, t, mid, launches) < r.shimP50 {
				lo = mid
			} else {
				hi = mid
			}
		}
		g = lo
		per = g / time.Duration(max(launches, 1))
		for i := range t.Calls {
			if k := t.Calls[i].Kind; k == trace.Launch || k == trace.LaunchEx {
				t.Calls[i].GPU = per
			}
		}
		gpuNote = fmt.Sprintf("GPU time %s ms fitted to the shim p50 (batches of %d records / %d bytes, synchronize "+
			"overshoot %v), spread over %d launches: %v each", trace.Ms(g), c.batchRecords, c.batchBytes,
			c.overshoot, launches, per)
	}
	pass, _, gpuEnd := t.Native()
	t.Notes = append(t.Notes,
		fmt.Sprintf("reference (%s): native p50 %s ms, shim p50 %s ms, client CPU per pass native %s ms, shim %s ms",
			r.gpu, trace.Ms(r.nativeP50), trace.Ms(r.shimP50), trace.Ms(r.nativeCPU), trace.Ms(r.shimCPU)),
		fmt.Sprintf("native issue = native p50 - native_sync = %s ms; CPU beside the issuing thread = native CPU - "+
			"native p50 = %s ms; shim issue = shim CPU - that = %s ms", trace.Ms(issueNative), trace.Ms(beside),
			trace.Ms(issueShim)),
		fmt.Sprintf("client time (gaps) = shim issue - %d local calls x %v - %d remoted calls x %v = %s ms, in the "+
			"shape of the %s's gaps (clipped at p99 %.1f us)", totalLocal, c.shimLocal, remoted, c.shimCal,
			trace.Ms(appSum), map[bool]string{true: "GPU profile", false: "dry run"}[prof != nil], p99/1e3),
		fmt.Sprintf("native_local_ns solved: (native issue - gaps - %d x native_call_ns) / %d local calls",
			remoted, totalLocal),
		gpuNote,
		fmt.Sprintf("native pass from the trace: %s ms (GPU ends at %s ms)", trace.Ms(pass), trace.Ms(gpuEnd)))
	return t, nil
}

// shimModel is the reference run's shim pass with GPU time g spread over the launches: records published in
// batches, the GPU running each launch once its batch is published, the synchronize overshooting.
func shimModel(c config, t *trace.Trace, g time.Duration, launches int) time.Duration {
	per := g / time.Duration(max(launches, 1))
	var now, gpu time.Duration
	var pending []time.Duration // GPU times of records written, not yet published
	bytes, records := 0, 0
	publish := func() {
		for _, d := range pending {
			gpu = max(gpu, now) + d
		}
		pending, bytes, records = pending[:0], 0, 0
	}
	for _, cl := range t.Calls {
		now += cl.Gap + time.Duration(cl.Local)*c.shimLocal
		if cl.Kind == trace.Sync {
			publish()
			return max(now, gpu) + c.overshoot
		}
		now += c.shimCal
		d := time.Duration(0)
		if cl.Kind == trace.Launch || cl.Kind == trace.LaunchEx {
			d = per
		}
		pending = append(pending, d)
		bytes += cl.RecordBytes
		records++
		if records >= c.batchRecords || bytes >= c.batchBytes {
			publish()
		}
	}
	return now
}
