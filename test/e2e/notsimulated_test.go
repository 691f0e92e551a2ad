package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// ctypesFunction lays out <work>/functions/<name>/: test/e2e/testdata/<name>/handler.py beside vector-add's CUDA
// driver wrapper and PTX, with no requirements (up's --functions-dir fallback).
func ctypesFunction(t *testing.T, work, name string) {
	t.Helper()
	root := repoRoot(t)
	dir := filepath.Join(work, "functions", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{
		filepath.Join(root, "test", "e2e", "testdata", name, "handler.py"): "handler.py",
		filepath.Join(root, "functions", "vector-add", "cudadrv.py"):       "cudadrv.py",
		filepath.Join(root, "functions", "vector-add", "kernels.ptx"):      "kernels.ptx",
	} {
		raw, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "requirements.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestKernelsTheSimulatedNodeCannotCompute: on the default simulated node (`make run`: no --sim-kernels), a function
// that launches a kernel the node does not compute (as resnet, bert and llm launch PyTorch's) answers 501 naming
// --sim-kernels=dry, whether its handler lets the CUDA error raise or hides it and returns a result (never a 200
// computed without its kernels); up's log says so once for the function; its reference kernel still answers
// exactly in the same process; the function's log has a line per request.
func TestKernelsTheSimulatedNodeCannotCompute(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and a python function")
	}
	work := t.TempDir()
	ctypesFunction(t, work, "not-simulated")
	root := repoRoot(t)
	stateDir := filepath.Join(work, "state")
	in := startUpIn(t, t.TempDir(), stateDir, 0, "--state-dir", stateDir, "--build-dir", filepath.Join(work, "build"),
		"--templates-dir", filepath.Join(root, "template"), "--functions-dir", filepath.Join(work, "functions"),
		"--gpu-memory", "4Gi", "--shim-dir", shimDir(t))
	deploy(t, in, types.FunctionDeployment{Service: "not-simulated", Image: "not-simulated:latest",
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi"}})
	url := in.url + "/function/not-simulated"
	if out := invokeReady(t, url, `{"kernel": "vector_add"}`); !strings.Contains(out, "[11.0, 22.0]") {
		t.Fatalf("the reference kernel: %s", out)
	}
	for _, body := range []string{`{"kernel": "vector_sum"}`, `{"kernel": "vector_sum", "swallow": true}`,
		`{"kernel": "vector_sum"}`} {
		r := call(t, http.MethodPost, url, body, nil)
		if r.code != http.StatusNotImplemented || !strings.Contains(r.body, "--sim-kernels=dry") ||
			!strings.Contains(r.body, "simulated node cannot compute") {
			t.Fatalf("%s: %d %s, want 501 naming --sim-kernels=dry", body, r.code, r.body)
		}
	}
	if out := invokeReady(t, url, `{"kernel": "vector_add"}`); !strings.Contains(out, "[11.0, 22.0]") {
		t.Fatalf("the reference kernel after the refused ones: %s", out)
	}
	// faas-cli logs: a line per request, with its method, path, status and duration.
	testkit.EventuallyNil(t, 10*time.Second, "a line per request in the function's log", func() error {
		logs := functionLogs(t, in, "not-simulated")
		for _, want := range []string{"POST / 200 ", "POST / 501 "} {
			if !strings.Contains(logs, want) || !strings.Contains(logs, "ms\n") {
				return fmt.Errorf("no %q in:\n%s", want, logs)
			}
		}
		return nil
	})
	const line = "the simulated node cannot compute this function's kernels"
	testkit.EventuallyNil(t, 10*time.Second, "up's log to name --sim-kernels=dry", func() error {
		if !strings.Contains(in.out.String(), line) {
			return os.ErrNotExist
		}
		return nil
	})
	if n := strings.Count(in.out.String(), line); n != 1 {
		t.Errorf("up's log says %q %d times for one function, want once:\n%s", line, n, in.out.String())
	}
	for _, l := range strings.Split(in.out.String(), "\n") {
		if strings.Contains(l, line) && (!strings.Contains(l, "--sim-kernels=dry") || !strings.Contains(l, "not-simulated")) {
			t.Errorf("up's log line does not name the flag and the function: %s", l)
		}
	}
}
