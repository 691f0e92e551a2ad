package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplayFlagsExitTwoNamingTheFlag: replay's and up's --sim-time-scale's bad settings are usage errors naming
// the flag, found before anything starts (the run itself: test/e2e TestReplayAgainstSimulator).
func TestReplayFlagsExitTwoNamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	trace, models := filepath.Join(dir, "trace.csv"), filepath.Join(dir, "models.csv")
	if err := os.WriteFile(trace, []byte("function,minute_1\na,0\nb,3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(models, []byte("model,weights_mb,h2d_transfer_ms,exec_b1_ms\nm,10,1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := []string{"--trace", trace, "--models", models}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{args: []string{"up", "--sim-time-scale", "-1"}, want: "-sim-time-scale"},
		{args: []string{"replay", "--models", models, "--functions", "2"}, want: "-trace"},
		{args: []string{"replay", "--trace", trace, "--functions", "2"}, want: "-models"},
		{args: append([]string{"replay"}, in...), want: "-functions"},
		{args: append([]string{"replay", "--rows", "0,x"}, in...), want: "-rows"},
		{args: append([]string{"replay", "--rows", "0-2"}, in...), want: "row 2"},
		{args: append([]string{"replay", "--rows", "0-1", "--functions", "3"}, in...), want: "-functions"},
		{args: append([]string{"replay", "--functions", "1"}, in...), want: "no arrivals"},
		{args: append([]string{"replay", "--functions", "2", "--start-minute", "1"}, in...), want: "start minute"},
		{args: append([]string{"replay", "--functions", "2", "--node", "v100x99"}, in...), want: "-node"},
		{args: append([]string{"replay", "--functions", "2", "--length", "0s"}, in...), want: "length"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"faas-gpu"}, tc.args...), &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
