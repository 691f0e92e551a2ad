package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSimCommand runs `faas-gpu sim` on explicit arrivals: one node prints the offline bound beside the table, a
// cluster prints the cluster table, and bad flags exit 2 naming the flag.
func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	models := filepath.Join(dir, "models.csv")
	arrivals := filepath.Join(dir, "arrivals.csv")
	if err := os.WriteFile(models, []byte("model,weights_mb,native_ms,remoting_ms,swap_pcie_ms,swap_nvlink_ms,"+
		"heavy,slo_ms,slo_percentile\na,100,10,10,20,12,false,80,98\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var rows strings.Builder
	rows.WriteString("at_ms,function\n")
	for i := range 50 {
		rows.WriteString(strconv.Itoa(i*20) + "," + strconv.Itoa(i%3) + "\n")
	}
	if err := os.WriteFile(arrivals, []byte(rows.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	sim := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(append([]string{"faas-gpu", "sim", "--models", models, "--arrivals", arrivals}, args...), &out,
			&errOut)
		return code, out.String() + errOut.String()
	}
	if code, out := sim("--policies", "faas-gpu,torpor"); code != 0 || !strings.Contains(out, "offline bound: 3/3") ||
		!strings.Contains(out, "torpor") {
		t.Fatalf("one node: exit %d\n%s", code, out)
	}
	if code, out := sim("--admission", "deadline", "--assign", "seeded", "--alpha", "0.01", "--remoted-times",
		"--policies", "torpor,static"); code != 0 || !strings.Contains(out, "functions within SLO") {
		t.Fatalf("admission deadline: exit %d\n%s", code, out)
	}
	if code, out := sim("--overload", "off"); code != 0 || !strings.Contains(out, "functions within SLO") {
		t.Fatalf("overload off: exit %d\n%s", code, out)
	}
	for _, cmd := range []string{"up", "gpuserver"} {
		for _, flag := range []string{"overload", "admission"} {
			var out bytes.Buffer
			if code := run([]string{"faas-gpu", cmd, "--" + flag, "sometimes"}, &out, &out); code != 2 ||
				!strings.Contains(out.String(), "-"+flag) {
				t.Errorf("%s --%s sometimes: exit %d, want 2 naming -%s:\n%s", cmd, flag, code, flag, out.String())
			}
		}
	}
	if code, out := sim("--nodes", "2", "--policies", "faas-gpu,keepalive"); code != 0 ||
		!strings.Contains(out, "GPUs mean") || !strings.Contains(out, "keepalive") {
		t.Fatalf("cluster: exit %d\n%s", code, out)
	}
	for flag, args := range map[string][]string{
		"nodes":         {"--nodes", "-1"},
		"keep-alive":    {"--nodes", "1", "--keep-alive", "0s"},
		"memory-factor": {"--memory-factor", "0.5"},
		"functions":     {"--functions", "2"}, // the arrivals name function 2
		"overload":      {"--overload", "1.5"},
		"admission":     {"--admission", "sometimes"},
		"assign":        {"--assign", "sorted"},
		"arrival-cv":    {"--arrival-cv", "-1"},
		"alpha":         {"--alpha", "2"},
	} {
		if code, out := sim(args...); code != 2 || !strings.Contains(out, "-"+flag) {
			t.Errorf("%v: exit %d, want 2 naming -%s:\n%s", args, code, flag, out)
		}
	}
}
