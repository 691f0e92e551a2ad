package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSimRunsTheProduct: `faas-gpu sim` ran a fixed number of instances; by default it now runs up's autoscaler
// (the table's instances column, the most instances one function had), a static --instances turns it off, bad
// scale labels exit 2 naming the flag as a deploy would name the label, and the flags that model what the product
// cannot do say so in their help.
func TestSimRunsTheProduct(t *testing.T) {
	dir := t.TempDir()
	models := filepath.Join(dir, "models.csv")
	arrivals := filepath.Join(dir, "arrivals.csv")
	if err := os.WriteFile(models, []byte("model,weights_mb,native_ms,remoting_ms,swap_pcie_ms,swap_nvlink_ms,"+
		"heavy,slo_ms,slo_percentile\na,100,50,50,60,55,false,5000,98\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var rows strings.Builder
	rows.WriteString("at_ms,function\n")
	for i := range 200 { // one function, 100 a second for 2 s: five times what one instance serves
		rows.WriteString(strconv.Itoa(i*10) + ",0\n")
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
	code, out := sim("--scale-labels", "max=4", "--instance-start", "100ms")
	if code != 0 || !strings.Contains(out, "instances mean/peak") || !strings.Contains(out, "/4 ") {
		t.Fatalf("autoscaled: exit %d, want the instances column with a peak of 4:\n%s", code, out)
	}
	if code, out := sim("--instances", "2"); code != 0 || !strings.Contains(out, "  - ") {
		t.Fatalf("static instances: exit %d, want no autoscaler figures:\n%s", code, out)
	}
	for _, args := range [][]string{{"--scale-labels", "max=0"}, {"--scale-labels", "min=3,max=2"},
		{"--scale-labels", "min=2"}, {"--scale-labels", "max"}} {
		if code, out := sim(args...); code != 2 || !strings.Contains(out, "-scale-labels") {
			t.Errorf("%v: exit %d, want 2 naming -scale-labels:\n%s", args, code, out)
		}
	}
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	var f simProductFlags
	f.register(fs)
	if u := fs.Lookup("dataplane").Usage; !strings.Contains(u, "does NOT") {
		t.Errorf("-dataplane's help does not say that false is beyond the product: %q", u)
	}
	if u := fs.Lookup("instance-start").Usage; !strings.Contains(u, "TestAutoscalingThroughUp") {
		t.Errorf("-instance-start's help does not say where its default comes from: %q", u)
	}
}
