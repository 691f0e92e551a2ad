package remoting

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestDriverCallsOfProtocol11 runs shim/test/driver_calls.c through the shim against a server on a simulated
// H100 node: pitched 2D/3D copies, 16-bit and 2D memsets, stream memory operations (a wait nothing can satisfy,
// a write outside the function's memory), kernel names, modules, enumeration and parameter info, attribute reads
// (cached) and sets (checked), the occupancy calculator, cuLaunchKernelEx with a cluster and a completion event
// (and a cluster that does not divide the grid), tensor maps (memoised, alignment and extent checked, address
// replaced) and pointer attributes.
func TestDriverCallsOfProtocol11(t *testing.T) {
	dev, xn := simNodeOf(t, "h100x8", sim.KernelsReference, 1<<30)
	funcs := registry{"calls": {pool.FunctionSpec{Name: "calls", MemoryBytes: 256 << 20}, "tok-calls"}}
	srv, err := NewServer(Config{Device: dev, Node: xn, Functions: funcs, Binder: &binder{current: map[string]int{}}})
	if err != nil {
		t.Fatal(err)
	}
	sock := serve(t, srv)
	lib := shimDir(t)
	ptx := filepath.Join(t.TempDir(), "kernels.ptx")
	if err := os.WriteFile(ptx, kernels.PTX(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(lib, "driver_calls"), ptx)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "FAAS_GPU_REMOTING_SOCKET="+sock,
		"FAAS_GPU_FUNCTION=calls", "FAAS_GPU_TOKEN=tok-calls")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("driver_calls: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "not supported by the shim") || strings.Contains(line, "not emulated") {
			t.Error(line)
		}
	}
}
