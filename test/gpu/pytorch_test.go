// Package gpu holds the GPU suite's end-to-end checks that need a real NVIDIA GPU (run by `make gpu-test` on a
// machine with a driver, CUDA and PyTorch); without FAAS_GPU_TEST_CUDA=1 they skip with a reason.
package gpu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/nvml"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
)

type torchResult struct {
	Model  string    `json:"model"`
	Device string    `json:"device"`
	Torch  string    `json:"torch"`
	CUDA   string    `json:"cuda"`
	P50MS  float64   `json:"p50_ms"`
	Output []float64 `json:"output"`
}

// runTorch runs torch_shim.py for one model with the given extra environment and returns its result and stderr.
func runTorch(t *testing.T, model string, env []string) (torchResult, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "torch_shim.py", model, "50")
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var r torchResult
	if err == nil {
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		err = json.Unmarshal([]byte(lines[len(lines)-1]), &r)
	}
	return r, stderr.String(), err
}

// TestGPUPyTorchThroughTheShim runs unchanged PyTorch (torchvision ResNet-152 and a BERT-base encoder, random
// weights) natively and through the shim on the gpuserver's cuda backend, side by side on the same GPU: outputs
// must be allclose and latency within 1.1x of native. The shim's debug log (calls cuGetProcAddress did not
// resolve, export tables asked for) goes to the report, so a failing run says what to implement next.
func TestGPUPyTorchThroughTheShim(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("GPU suite: set FAAS_GPU_TEST_CUDA=1 on a machine with an NVIDIA GPU, CUDA and PyTorch (make gpu-test)")
	}
	if err := exec.Command("python3", "-c", "import torch, torchvision; assert torch.cuda.is_available()").Run(); err != nil {
		t.Skipf("PyTorch with CUDA and torchvision not importable: %v", err)
	}
	node, err := nvml.Discover(gonvml.New(), "local")
	if err != nil {
		t.Fatalf("NVML discovery: %v", err)
	}
	dev, err := cuda.Open("")
	if err != nil {
		t.Fatalf("cuda backend: %v", err)
	}
	dir := t.TempDir()
	srv, err := server.Start(context.Background(), server.Config{Socket: filepath.Join(dir, "gpuserver.sock"),
		Node: node, RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: shmDir(t), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	shim, err := filepath.Abs("../../shim/build")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("make", "-s", "-C", "../../shim").CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}

	var report strings.Builder
	fmt.Fprintf(&report, "# Unchanged PyTorch through the shim\n\nWritten by `make gpu-test` (test/gpu) on %s.\n\n",
		time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&report, "| model | device | torch / CUDA | native p50 ms | shim p50 ms | shim/native | max abs diff | result |\n|---|---|---|---|---|---|---|---|\n")
	for _, model := range []string{"resnet152", "bert-base"} {
		t.Run(model, func(t *testing.T) {
			name := "torch-" + model
			if err := srv.Pool().Register(context.Background(), pool.FunctionSpec{Name: name, MemoryBytes: 16 << 30}); err != nil {
				t.Fatal(err)
			}
			native, _, err := runTorch(t, model, nil)
			if err != nil {
				t.Fatalf("native run: %v", err)
			}
			remote, logs, err := runTorch(t, model, []string{"LD_LIBRARY_PATH=" + shim, "FAAS_GPU_SHIM_DEBUG=1",
				"FAAS_GPU_REMOTING_SOCKET=" + srv.RemotingSocket(), "FAAS_GPU_FUNCTION=" + name,
				"FAAS_GPU_TOKEN=" + srv.Token(name)})
			if err != nil {
				fmt.Fprintf(&report, "| %s | %s | %s / %s | %.2f | - | - | - | shim run failed: %v |\n", model,
					native.Device, native.Torch, native.CUDA, native.P50MS, err)
				fmt.Fprintf(&report, "\nShim log of %s (last 4 KiB):\n\n```\n%s\n```\n", model, tail(logs, 4096))
				t.Errorf("through the shim: %v\n%s", err, tail(logs, 4096))
				return
			}
			diff := maxAbsDiff(native.Output, remote.Output)
			ratio := remote.P50MS / native.P50MS
			ok := diff <= 1e-3*(1+maxAbs(native.Output)) && ratio <= 1.1
			fmt.Fprintf(&report, "| %s | %s | %s / %s | %.2f | %.2f | %.3f | %.2e | %v |\n", model, native.Device,
				native.Torch, native.CUDA, native.P50MS, remote.P50MS, ratio, diff, map[bool]string{true: "pass", false: "FAIL"}[ok])
			if !ok {
				t.Errorf("%s: shim/native latency %.3f (limit 1.1), max abs diff %.2e", model, ratio, diff)
			}
		})
	}
	if path := os.Getenv("FAAS_GPU_GPU_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	t.Log("\n" + report.String())
}

func maxAbsDiff(a, b []float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(a[i]-b[i]))
	}
	return m
}

func maxAbs(a []float64) float64 {
	var m float64
	for _, v := range a {
		m = math.Max(m, math.Abs(v))
	}
	return m
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// shmDir is a repository dir on /dev/shm: the real driver page-locks the model images, which Linux refuses for
// files on disk.
func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "faas-gpu-test-")
	if err != nil {
		t.Fatalf("a repository on /dev/shm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
