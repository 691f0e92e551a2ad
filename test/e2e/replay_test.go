package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestReplayAgainstSimulator runs `faas-gpu replay` end to end on 20 s of Torpor's trace with three functions: a
// real up on the timed virtual GPU, the functions deployed and called on time, the simulator run on the same
// arrivals. Both sides print the schema of `faas-gpu sim --json`, and every request is accounted for: the
// simulator was given as many as were sent, each sent one was answered (200, or refused with 429/503), none
// lost, and the gpuserver saw every one that reached it.
func TestReplayAgainstSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	shimDir(t)
	root := repoRoot(t)
	trace := filepath.Join(root, "..", "shared", "workloads", "torpor-203fn-31min.csv")
	models := filepath.Join(root, "..", "shared", "workloads", "models-torpor-v100.csv")
	if !fileExists(trace) || !fileExists(models) {
		t.Skipf("the shared workloads are not beside the repository (%s)", trace)
	}
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = root
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("faas-gpu %v: %v\n%s", args[0], err, stderr.String())
		}
		t.Logf("faas-gpu %s:\n%s", args[0], stderr.String())
		return stdout.Bytes()
	}
	start := time.Now()
	out := run("replay", "--trace", trace, "--models", models, "--functions", "3", "--length", "20s",
		"--work-dir", t.TempDir())
	t.Logf("replay took %v", time.Since(start))
	var rep struct {
		Window     struct{ Requests int64 }   `json:"window"`
		Replay     map[string]json.RawMessage `json:"replay"`
		Simulator  map[string]json.RawMessage `json:"simulator"`
		Accounting struct {
			Sent, OK, Refused, Failed, Lost int64
		} `json:"accounting"`
		Difference map[string]map[string]any `json:"difference"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("replay's JSON: %v\n%s", err, out)
	}

	// The schema of sim --json, on both sides.
	var sim map[string]json.RawMessage
	if err := json.Unmarshal(run("sim", "--json", "--trace", trace, "--models", models, "--functions", "3",
		"--minutes", "1",
		// The replay deploys each function as one instance without scale labels, as up does: the simulator's
		// schema for that mode (no autoscaler block).
		"--autoscale-instances=false"), &sim); err != nil {
		t.Fatal(err)
	}
	type result map[string]json.RawMessage
	policies := func(side string, m map[string]json.RawMessage) []result {
		var ps []result
		if err := json.Unmarshal(m["policies"], &ps); err != nil || len(ps) == 0 {
			t.Fatalf("%s: policies: %v %s", side, err, m["policies"])
		}
		return ps
	}
	simKeys, simResultKeys := keys(sim), keys(policies("sim", sim)[0])
	for side, m := range map[string]map[string]json.RawMessage{"replay": rep.Replay, "simulator": rep.Simulator} {
		if got := keys(m); !slices.Equal(got, simKeys) {
			t.Errorf("%s: keys %v, sim --json has %v", side, got, simKeys)
		}
		for _, p := range policies(side, m) {
			if got := keys(p); !slices.Equal(got, simResultKeys) {
				t.Errorf("%s: result keys %v, sim --json has %v", side, got, simResultKeys)
			}
		}
	}

	// Every request accounted for.
	a := rep.Accounting
	if a.Sent == 0 || a.Sent != rep.Window.Requests || a.Sent != a.OK+a.Refused || a.Lost != 0 || a.Failed != 0 {
		t.Errorf("accounting %+v of %d requests in the window: want sent = ok + refused, none failed or lost", a,
			rep.Window.Requests)
	}
	requests := func(r result) int64 {
		var n int64
		if err := json.Unmarshal(r["requests"], &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	replayed := policies("replay", rep.Replay)
	if len(replayed) != 2 {
		t.Fatalf("replay: %d results, want the client's and the gpuserver's", len(replayed))
	}
	if got := requests(policies("simulator", rep.Simulator)[0]); got != a.Sent {
		t.Errorf("the simulator ran %d requests, the client sent %d", got, a.Sent)
	}
	if got := requests(replayed[0]); got != a.Sent {
		t.Errorf("the client's view counts %d requests of %d sent", got, a.Sent)
	}
	if got := requests(replayed[1]); got != a.OK+a.Refused {
		t.Errorf("the gpuserver saw %d requests, the client had %d answered or refused", got, a.OK+a.Refused)
	}
	for _, view := range []string{"end_to_end", "gpuserver"} {
		if _, ok := rep.Difference[view]["requests_on_time_points"]; !ok {
			t.Errorf("difference %s: %v", view, rep.Difference[view])
		}
	}
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
