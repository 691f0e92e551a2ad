package cuda

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// function is the one function the tests' processes connect as.
const (
	function = "cuda-test"
	token    = "cuda-test-token"
	quota    = 16 << 30
)

// requireTier skips outside make test-cuda (pyenv.TierEnv) and returns the pinned environment's directory.
func requireTier(t *testing.T) string {
	t.Helper()
	return pyenv.Require(t)
}

type registry struct{}

func (registry) Function(name string) (pool.FunctionSpec, string, error) {
	if name != function {
		return pool.FunctionSpec{}, "", pool.ErrUnknownFunction
	}
	return pool.FunctionSpec{Name: name, MemoryBytes: quota}, token, nil
}

// binder binds every call to GPU 0 (an implicit binding: no request is in flight).
type binder struct{}

func (binder) CurrentGPU(string) (int, bool) { return 0, false }
func (binder) BindImplicit(context.Context, string) (int, func(), error) {
	return 0, func() {}, nil
}

// node is a remoting server on a simulated h100x8 node.
type node struct {
	socket string
	dev    *sim.Backend
	srv    *remoting.Server
}

func startNode(t *testing.T, kernels sim.KernelMode) *node {
	t.Helper()
	topo, err := topology.Preset("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: topo, Kernels: kernels})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(dev, memory.Config{MaxBytesPerGPU: 24 << 30})
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
	srv, err := remoting.NewServer(remoting.Config{Device: dev, Node: xn, Functions: registry{}, Binder: binder{}})
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
	t.Cleanup(func() {
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
	})
	return &node{socket: sock, dev: dev, srv: srv}
}

// shimDir builds the shim and returns the folder holding libcuda.so.1.
func shimDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../shim")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("make", "-s", "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}
	return filepath.Join(dir, "build")
}

// env is the environment of a process that uses the shim as libcuda.so.1 against n.
func (n *node) env(t *testing.T, extra ...string) []string {
	return append(append(os.Environ(), "LD_LIBRARY_PATH="+shimDir(t), "FAAS_GPU_REMOTING_SOCKET="+n.socket,
		"FAAS_GPU_FUNCTION="+function, "FAAS_GPU_TOKEN="+token, "PYTHONDONTWRITEBYTECODE=1"), extra...)
}

// run runs a command against n and returns its stdout; it fails the test if the command fails or the shim
// reported a call it does not support or a private-table slot it does not emulate.
func (n *node) run(t *testing.T, name string, args ...string) string {
	t.Helper()
	return n.runEnv(t, nil, name, args...)
}

// runEnv is run with extra environment variables.
func (n *node) runEnv(t *testing.T, extra []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = n.env(t, extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(),
			tail(stderr.String(), 60))
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "is not supported by the shim") || strings.Contains(line, "is not emulated") ||
			strings.Contains(line, "unknown table") {
			t.Errorf("%s: %s", filepath.Base(name), line)
		}
	}
	return stdout.String()
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// python runs a script of testdata with the environment's Python and decodes its last line of output as JSON.
func (n *node) python(t *testing.T, env string, extra []string, script string, v any, args ...string) {
	t.Helper()
	out := n.runEnv(t, extra, filepath.Join(env, "bin", "python3"), append([]string{filepath.Join("testdata", script)},
		args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("%s: last line %q: %v", script, lines[len(lines)-1], err)
	}
}

// stats are the shim's counters (faasGpuShimStats). SyncsAnswered (synchronizations answered in the shim, also
// counted in Local) is read only by the scripts that ask for six counters.
type stats struct {
	Sync, Async, Local, Unsupported, UnknownSlots, SyncsAnswered uint64
}

func (s stats) String() string {
	return fmt.Sprintf("%d sync, %d async, %d answered locally", s.Sync, s.Async, s.Local)
}
