package remoting

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestDriverCallsOfProtocol11 runs shim/test/driver_calls.c through the shim against a server on a simulated
// H100 node: pitched 2D/3D copies, 16-bit and 2D memsets, stream memory operations (a wait nothing can satisfy,
// a write outside the function's memory), kernel names, modules, enumeration and parameter info, attribute reads
// (cached) and sets (checked), the occupancy calculator, cuLaunchKernelEx with a cluster and a completion event
// (and a cluster that does not divide the grid), tensor maps (memoised, alignment and extent checked, address
// replaced) and pointer attributes.
func TestDriverCallsOfProtocol11(t *testing.T) {
	topo, err := topology.Preset("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: topo})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(dev, memory.Config{MaxBytesPerGPU: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := repository.Open(repository.Config{Dir: t.TempDir(), Registrar: dev})
	if err != nil {
		t.Fatal(err)
	}
	xn, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	funcs := registry{"calls": {pool.FunctionSpec{Name: "calls", MemoryBytes: 256 << 20}, "tok-calls"}}
	srv, err := NewServer(Config{Device: dev, Node: xn, Functions: funcs, Binder: &binder{current: map[string]int{}}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "remoting.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		bg := context.Background()
		for _, err := range []error{xn.Close(bg), repo.Close(), mem.Close(bg), dev.Close(bg)} {
			if err != nil {
				t.Error(err)
			}
		}
	}()
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
