package cuda

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// TestRuntimeAPIProgram builds testdata/runtime.cu with the pinned nvcc (sm_90, the static cudart) and runs it
// through the shim on the simulated node, whose reference kernels compute its kernels: cudaMalloc, cudaMemcpy,
// <<<>>> launches, streams, events, pinned memory, memsets, cudaMemcpyToSymbol/FromSymbol on __device__ globals,
// cudaDeviceSynchronize. The program checks every result exactly and prints ok.
func TestRuntimeAPIProgram(t *testing.T) {
	env := requireTier(t)
	cuda := pyenv.CUDA(env)
	bin := filepath.Join(t.TempDir(), "runtime")
	cmd := exec.Command(pyenv.NVCC(env), "-arch=sm_90", "-o", bin, "testdata/runtime.cu", "-L"+filepath.Join(cuda, "lib"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nvcc: %v\n%s", err, out)
	}
	n := startNode(t, sim.KernelsReference)
	out := n.run(t, bin)
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") || !strings.Contains(out, "sm_90, 132 SMs") {
		t.Fatalf("runtime program:\n%s", out)
	}
	if got := n.dev.DryLaunches(); got != 0 {
		t.Errorf("%d launches not executed in reference mode", got)
	}
}
