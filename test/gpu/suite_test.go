package gpu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The GPU suite's dry run (no GPU, no Go binaries needed) runs its CPU steps (the machine, the predictions, the
// comparison) and lists every GPU step with its time limit, the two held-out measurements and this round's checks
// by name among them (several GPUs serving one function, co-running shares, NVSwitch discovery); its steps stay
// inside the 8-minute budget (the limits are cut to it).
func TestSuiteDryRunListsItsStepsWithinTheBudget(t *testing.T) {
	cmd := exec.Command("bash", "suite.sh", "--dry")
	cmd.Env = append(os.Environ(), "SUITE_BUDGET=470")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("suite.sh --dry: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{"=== 0. machine, driver, topology", "=== 1. predictions (before any measurement)",
		"TestGPUPyTorchThroughTheShim (limit 240s) would run", "replay bench natively and through the shim",
		"profile_torch.py", "TestGPULLMThroughTheShim (limit 180s) would run", "=== 6. prediction, measurement, error",
		"=== 7. NVSwitch topology discovery: gpuserver/device/nvml TestCUDADiscoversNVSwitchTopology (limit 60s)",
		"=== 7. several GPUs serving one function at once: gpuserver/executor " +
			"TestCUDAInstancesServeOneFunctionOnSeveralGPUsAtOnce (limit 60s)",
		"=== 7. co-running functions and their achieved shares", "budget of 470s", "dry: nothing ran on a GPU",
		"resnet50-b1", "llm-decode-graphs"} {
		if !strings.Contains(s, want) {
			t.Errorf("suite.sh --dry does not print %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "FAILED") {
		t.Errorf("a CPU step of the dry run failed:\n%s", s)
	}
}

// compare.sh puts each prediction beside its measurement: the error of the point, inside the band or not, and the
// passes the run did not measure.
func TestCompareShowsPredictionMeasurementAndError(t *testing.T) {
	meas := filepath.Join(t.TempDir(), "measured.tsv")
	if err := os.WriteFile(meas, []byte("resnet152-b1\t0.7500\t18.90\t14.17\nllm-decode-graphs\t1.0800\t5.00\t5.40\n"),
		0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "compare.sh", "predictions.tsv", meas).CombinedOutput()
	if err != nil {
		t.Fatalf("compare.sh: %v\n%s", err, out)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines[f[0]] = l
		}
	}
	for pass, want := range map[string][]string{
		"resnet152-b1":      {"0.750", "+5.6%", "yes"},
		"llm-decode-graphs": {"1.080", "+5.9%", "NO"},
		"bert-base-b8":      {"not run"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[pass], w) {
				t.Errorf("%s: %q lacks %q\n%s", pass, lines[pass], w, out)
			}
		}
	}
}
