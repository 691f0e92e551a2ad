package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayScalesInstancesLikeTheSimulator runs `faas-gpu replay --scale-labels max=2` on a hot function (10
// requests a second of a 40 ms kernel, about as many in flight at once as its one instance serves): up's
// autoscaler scales the real function to its second replica within the window and the simulator's autoscaler,
// given the same labels, does too; the report compares their instances over time, and every request is
// accounted for.
func TestReplayScalesInstancesLikeTheSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	shimDir(t)
	root := repoRoot(t)
	dir := t.TempDir()
	trace, models := filepath.Join(dir, "trace.csv"), filepath.Join(dir, "models.csv")
	if err := os.WriteFile(trace, []byte("function,minute_1\nhot,600\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(models, []byte("model,weights_mb,native_ms,remoting_ms,swap_pcie_ms,swap_nvlink_ms,"+
		"heavy,slo_ms,slo_percentile\nhot,16,40,40,45,42,false,500,98\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "replay", "--trace", trace, "--models", models, "--functions", "1", "--length", "30s",
		"--scale-labels", "max=2", "--sample-every", "500ms", "--work-dir", filepath.Join(dir, "work"))
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("faas-gpu replay: %v\n%s", err, stderr.String())
	}
	t.Logf("faas-gpu replay:\n%s", stderr.String())
	var rep struct {
		Window     struct{ Requests int64 } `json:"window"`
		Accounting struct {
			Sent, OK, Refused, Failed, Lost int64
		} `json:"accounting"`
		Instances *struct {
			Labels    map[string]string `json:"labels"`
			Functions []struct {
				Function string `json:"function"`
				Points   []json.RawMessage
				RealPeak int `json:"real_ready_peak"`
				SimPeak  int `json:"sim_ready_peak"`
				SimUps   int `json:"sim_scale_ups"`
				RealUps  int `json:"real_scale_ups"`
			} `json:"functions"`
		} `json:"instances"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("replay's JSON: %v\n%s", err, stdout.String())
	}
	if in := rep.Instances; in == nil || in.Labels["com.openfaas.scale.max"] != "2" || len(in.Functions) != 1 {
		t.Fatalf("instances %+v: want the labels and the hot function's series", in)
	}
	f := rep.Instances.Functions[0]
	if !strings.HasPrefix(f.Function, "fn-0000-hot") || len(f.Points) < 10 {
		t.Errorf("series of %q with %d points, want fn-0000-hot sampled every 500 ms over 30 s", f.Function,
			len(f.Points))
	}
	if f.RealPeak != 2 || f.RealUps < 1 || f.SimPeak != 2 || f.SimUps < 1 {
		t.Errorf("%+v: want both sides scaled up to the 2 replicas the labels allow", f)
	}
	a := rep.Accounting
	if a.Sent == 0 || a.Sent != rep.Window.Requests || a.Sent != a.OK+a.Refused+a.Failed || a.Lost != 0 {
		t.Errorf("accounting %+v of %d requests", a, rep.Window.Requests)
	}
}
