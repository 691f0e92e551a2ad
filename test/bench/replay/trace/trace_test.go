package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRoundTripAndNativePass(t *testing.T) {
	tr := &Trace{Header: Header{Model: "m", Batch: 2, GPU: "g", Source: "s", NativeCall: 2 * time.Microsecond,
		NativeLocal: 100 * time.Nanosecond, NativeSync: 10 * time.Microsecond, Notes: []string{"a note"}},
		Calls: []Call{
			{Kind: Launch, Gap: 5 * time.Microsecond, Local: 10, GPU: 20 * time.Microsecond, RecordBytes: 136},
			{Kind: Memset, Gap: 1 * time.Microsecond, RecordBytes: 56},
			{Kind: LaunchEx, Gap: 2 * time.Microsecond, Local: 0, GPU: 30 * time.Microsecond, RecordBytes: 3120},
			{Kind: Sync, Gap: 3 * time.Microsecond},
		}}
	var b bytes.Buffer
	if err := tr.Write(&b); err != nil {
		t.Fatal(err)
	}
	got, err := Parse(&b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(tr) {
		t.Fatalf("round trip:\n%v\n%v", got, tr)
	}
	// issue: launch at 5+1+2 = 8 us (GPU 8..28), memset at 8+1+2 = 11 (GPU 28..28), launch-ex at 11+2+2 = 15
	// (GPU 28..58), synchronize issued at 15+3 = 18: the GPU ends at 58, the pass at 68
	pass, issue, gpu := tr.Native()
	if pass != 68*time.Microsecond || issue != 18*time.Microsecond || gpu != 58*time.Microsecond {
		t.Fatalf("native pass %v, issue %v, GPU end %v; want 68us, 18us, 58us", pass, issue, gpu)
	}
	if s := tr.ShimIssue(0, time.Microsecond); s != 14*time.Microsecond {
		t.Fatalf("shim issue %v, want 14us", s)
	}
}

func TestParseRefusesBadTraces(t *testing.T) {
	head := Magic + "\n# model\tm\n# batch\t1\n"
	for name, text := range map[string]string{
		"magic":        "# something else\n",
		"no sync":      head + "cuLaunchKernel\t1\t0\t1\t136\n",
		"after sync":   head + "cuCtxSynchronize\t1\t0\t0\t16\ncuLaunchKernel\t1\t0\t1\t136\n",
		"call":         head + "cuMemcpyHtoD\t1\t0\t1\t136\ncuCtxSynchronize\t1\t0\t0\t16\n",
		"fields":       head + "cuLaunchKernel\t1\t0\t1\ncuCtxSynchronize\t1\t0\t0\t16\n",
		"negative gap": head + "cuLaunchKernel\t-1\t0\t1\t136\ncuCtxSynchronize\t1\t0\t0\t16\n",
		"huge gpu":     head + "cuLaunchKernel\t1\t0\t99999999999\t136\ncuCtxSynchronize\t1\t0\t0\t16\n",
		"header key":   head + "# colour\tblue\ncuCtxSynchronize\t1\t0\t0\t16\n",
		"no model":     Magic + "\ncuCtxSynchronize\t1\t0\t0\t16\n",
		"empty":        "",
	} {
		if _, err := Parse(strings.NewReader(text)); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

// The replay traces hold the passes of the H100 fixtures: as many asynchronous calls as the real driver got.
func TestReplayTracesMatchTheFixtures(t *testing.T) {
	dir := "../../../../shim/testdata/trace"
	paths, _ := filepath.Glob(filepath.Join(dir, "replay-*.tsv"))
	if len(paths) != 4 {
		t.Fatalf("%d replay traces in %s, want 4", len(paths), dir)
	}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := Parse(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		tot := tr.Totals()
		want := fixtureAsync(t, filepath.Join(dir, fmt.Sprintf("pass-%s-b%d.tsv", tr.Model, tr.Batch)))
		if got := tot.Launches + tot.Memsets; got != want {
			t.Errorf("%s: %d launches and memsets, the H100 pass made %d", p, got, want)
		}
		if pass, _, _ := tr.Native(); tr.NativeP50 > 0 && (pass < tr.NativeP50*9/10 || pass > tr.NativeP50*11/10) {
			t.Errorf("%s: native pass %v from the trace, the GPU measured %v", p, pass, tr.NativeP50)
		}
	}
}

func fixtureAsync(t *testing.T, path string) int {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if len(fs) == 3 && (fs[1] == "cuLaunchKernel" || fs[1] == "cuLaunchKernelEx" || fs[1] == "cuMemsetD8Async") {
			c, _ := strconv.Atoi(fs[2])
			n += c
		}
	}
	return n
}
