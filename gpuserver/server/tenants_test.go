package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
)

func TestMain(m *testing.M) {
	tenantexec.RunIfChild() // this test binary is also the tenants' executor process
	os.Exit(m.Run())
}

// tenantConfig runs the tenants' executors as this test binary; their logs go to the returned buffer.
func tenantConfig(t *testing.T) (*TenantConfig, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("executor logs:\n%s", logs.String())
		}
	})
	return &TenantConfig{Command: []string{os.Args[0]}, Env: []string{tenantexec.EnvChild + "=1"}, Stderr: logs,
		LogLevel: "debug"}, logs
}

// fnProcess is a function process through the shim, driven line by line (faultyPy's commands).
type fnProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *syncBuffer
}

func buildShim(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	shim, _ := filepath.Abs("../../shim")
	if out, err := exec.Command("make", "-s", "-C", shim).CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}
	return shim
}

// startFn starts a function process of fn running script (faultyPy's protocol: "ready", then a line per command).
func startFn(t *testing.T, s *Server, fn, script string) *fnProcess {
	t.Helper()
	shim := buildShim(t)
	dir, _ := filepath.Abs("../../functions/vector-add")
	cmd := exec.Command("python3", "-c", script)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(shim, "build"), "FN_DIR="+dir,
		"FAAS_GPU_REMOTING_SOCKET="+s.RemotingSocket(), "FAAS_GPU_FUNCTION="+fn, "FAAS_GPU_TOKEN="+s.Token(fn),
		"PYTHONDONTWRITEBYTECODE=1")
	p := &fnProcess{t: t, cmd: cmd, stderr: &syncBuffer{}}
	cmd.Stderr = p.stderr
	p.in, _ = cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewScanner(stdout)
	t.Cleanup(func() { _ = p.in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if l, err := p.next(); l != "ready" || err != nil {
		t.Fatalf("%s said %q (%v)\n%s", fn, l, err, p.stderr.String())
	}
	return p
}

// next reads the process's next line.
func (p *fnProcess) next() (string, error) {
	if !p.out.Scan() {
		return "", fmt.Errorf("the function process ended: %v", p.out.Err())
	}
	return p.out.Text(), nil
}

// request runs one request of fn through the pool: acquire, a command, release.
func request(ctx context.Context, s *Server, p *fnProcess, fn, what string) (string, error) {
	b, err := s.Pool().Acquire(ctx, fn)
	if err != nil {
		return "", err
	}
	fmt.Fprintln(p.in, what)
	l, lerr := p.next()
	rerr := s.Pool().Release(ctx, b.ID)
	if lerr != nil {
		return l, lerr
	}
	return l, rerr
}

// TestTenantsServeThroughTheirExecutors: two namespaces' functions on one gpuserver with an executor process per
// tenant: each function process's session is handed to its tenant's executor, computes the right answer on chunks
// the gpuserver lent, and the status shows one executor per tenant.
func TestTenantsServeThroughTheirExecutors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc})
	defer stop(t, s)
	for _, fn := range []string{"va.ns1", "vb.ns2"} {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := startFn(t, s, "va.ns1", faultyPy), startFn(t, s, "vb.ns2", faultyPy)
	const want = "sum 1.0496e+06"
	for i := 0; i < 3; i++ {
		for _, x := range []struct {
			p  *fnProcess
			fn string
		}{{a, "va.ns1"}, {b, "vb.ns2"}} {
			if l, err := request(ctx, s, x.p, x.fn, "good"); l != want || err != nil {
				t.Fatalf("%s request %d: %q %v\n%s", x.fn, i, l, err, x.p.stderr.String())
			}
		}
	}
	st := s.Pool().Status(ctx)
	if len(st.Tenants) != 2 {
		t.Fatalf("tenants in the status: %+v", st.Tenants)
	}
	for _, ts := range st.Tenants {
		if ts.State != "up" || ts.PID == 0 || ts.PID == os.Getpid() || ts.Restarts != 0 {
			t.Errorf("tenant %+v", ts)
		}
	}
	if !strings.HasPrefix(st.Tenants[0].Tenant, "namespace/ns") {
		t.Errorf("tenant names: %+v", st.Tenants)
	}
}
