package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/nvml"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// Tenants isolated by process (docs/tenants.md) at the level the GPU suite checks them: a gpuserver whose tenants
// each run in an executor process of their own (this test binary), function processes through the shim. The same
// scenarios run on the simulated GPU in every `make test` (modelling what an H100 shares inside one process) and on
// a real GPU in the GPU suite (FAAS_GPU_TEST_CUDA=1: make gpu-test), where they are the checks that one process per
// tenant makes hold what contexts of one process did not.

func TestMain(m *testing.M) {
	tenantexec.RunIfChild()  // this test binary is also the tenants' executor process
	testkit.VerifyNoLeaks(m) // swaps' finishers end with their node
}

func TestTenantExecutorsCannotReachEachOther(t *testing.T) {
	tenantsCannotReachEachOther(t, simTenantServer(t))
}
func TestCUDAKernelsCannotReachAnotherTenant(t *testing.T) {
	tenantsCannotReachEachOther(t, cudaTenantServer(t))
}
func TestTenantFaultEndsOnlyItsExecutor(t *testing.T) { faultEndsOnlyItsTenant(t, simTenantServer(t)) }
func TestCUDAKernelFaultPoisonsOnlyItsContext(t *testing.T) {
	faultEndsOnlyItsTenant(t, cudaTenantServer(t))
}

// tenantServer is a gpuserver with executor processes per tenant, and where its repository is.
type tenantServer struct {
	*server.Server
	repo string
	logs *testkit.Buffer
}

// needPython skips in short mode and without python3, and builds the shim; it returns the shim's folder.
func needPython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs executor processes and Python processes through the shim")
	}
	testkit.NeedPython(t)
	return testkit.Shim(t)
}

func simTenantServer(t *testing.T) *tenantServer {
	t.Helper()
	needPython(t)
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: node, ProcessWide: true})
	if err != nil {
		t.Fatal(err)
	}
	return startTenantServer(t, dev, node)
}

func cudaTenantServer(t *testing.T) *tenantServer {
	t.Helper()
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	needPython(t)
	node, err := nvml.Discover(gonvml.New(), "local")
	if err != nil {
		t.Fatalf("NVML discovery: %v", err)
	}
	dev, err := cuda.Open("")
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CUDA=1 but the driver cannot be opened: %v", err)
	}
	t.Logf("GPU: %s", dev.GPUs()[0].Name)
	return startTenantServer(t, dev, node)
}

func startTenantServer(t *testing.T, dev device.Backend, node topology.Node) *tenantServer {
	t.Helper()
	dir := t.TempDir()
	logs := &testkit.Buffer{}
	ts := &tenantServer{repo: filepath.Join(dir, "repository"), logs: logs}
	s, err := server.Start(context.Background(), server.Config{Socket: filepath.Join(dir, "gpuserver.sock"),
		Node: node, RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: ts.repo, Device: dev, DeviceReserveBytes: 256 << 20,
		Tenants: &server.TenantConfig{Command: []string{os.Args[0]}, Env: []string{tenantexec.EnvChild + "=1"},
			Stderr: logs, LogLevel: "debug"}})
	if err != nil {
		t.Fatal(err)
	}
	ts.Server = s
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("executor logs:\n%s", logs.String())
		}
	})
	ctx := context.Background()
	for _, fn := range []string{"victim.ns1", "attacker.ns2"} {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	return ts
}

// fnProc is a function process running ../tenant/testdata/tenant_fn.py through the shim.
type fnProc struct {
	*testkit.Python
	model  uint64
	global uint64
}

func (s *tenantServer) startFn(t *testing.T, fn string) *fnProc {
	t.Helper()
	shim := needPython(t)
	script, err := os.ReadFile("../tenant/testdata/tenant_fn.py")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(testkit.RepoRoot(t), "functions", "vector-add")
	p := &fnProc{Python: testkit.StartPython(t, string(script),
		append(testkit.ShimEnv(shim, s.RemotingSocket(), fn, s.Token(fn)), "FN_DIR="+dir)...)}
	line, ok := p.Line()
	if !ok {
		t.Fatalf("%s ended at start\n%s", fn, p.Stderr())
	}
	if _, err := fmt.Sscanf(line, "ready %d %d", &p.model, &p.global); err != nil {
		t.Fatalf("%s said %q", fn, line)
	}
	return p
}

// request runs one request of fn: acquire, a command to its process, its answer, release.
func (s *tenantServer) request(t *testing.T, p *fnProc, fn, what string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := s.Pool().Acquire(ctx, fn)
	if err != nil {
		return "", err
	}
	_ = p.Send(what)
	line, ok := p.Line()
	if !ok {
		line = "(the process ended)"
	}
	return line, s.Pool().Release(ctx, b.ID)
}

// imageHostAddress is where the victim's executor holds the bytes of device address ptr of its image: its mapping
// of the chunk file holding them (images are stored as content-addressed chunks) or of the flat image file, from
// the image's sidecar and /proc/<pid>/maps.
func (s *tenantServer) imageHostAddress(t *testing.T, fn string, ptr uint64) uint64 {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(s.repo, "*", fn+".meta.json"))
	if len(matches) != 1 {
		t.Fatalf("images of %s: %v", fn, matches)
	}
	raw, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Segments []struct {
			Ptr, Size, Offset uint64
			Chunks            []string
		} `json:"segments"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", s.Tenants().PID("namespace/ns1")))
	if err != nil {
		t.Fatal(err)
	}
	mapped := func(file string) uint64 {
		for _, line := range strings.Split(string(maps), "\n") {
			if strings.HasSuffix(line, file) {
				start, _ := strconv.ParseUint(line[:strings.IndexByte(line, '-')], 16, 64)
				return start
			}
		}
		t.Fatalf("the victim's executor does not map %s", file)
		return 0
	}
	const chunk = 2 << 20 // repository.DefaultChunkBytes
	for _, sg := range meta.Segments {
		if ptr < sg.Ptr || ptr >= sg.Ptr+sg.Size {
			continue
		}
		off := ptr - sg.Ptr
		if len(sg.Chunks) > 0 {
			return mapped(filepath.Join(filepath.Dir(matches[0]), "chunks", sg.Chunks[off/chunk])) + off%chunk
		}
		return mapped(strings.TrimSuffix(matches[0], ".meta.json")+".img") + sg.Offset + off
	}
	t.Fatalf("%#x is in no segment of %s's image", ptr, fn)
	return 0
}

const (
	victimSum = "sum 1.0496e+06" // the victim's model, doubled
)

// tenantsCannotReachEachOther: the attacker (namespace ns2) launches kernels that read the victim's (ns1) device
// address, module global and image in host memory, each from a new process (a fault ends the attacker's
// executor). Each read faults in the attacker's own executor; the victim answers exactly every time and its
// executor never changes.
func tenantsCannotReachEachOther(t *testing.T, s *tenantServer) {
	victim := s.startFn(t, "victim.ns1")
	if l, err := s.request(t, victim, "victim.ns1", "good"); l != victimSum || err != nil {
		t.Fatalf("the victim's first request: %q %v", l, err)
	}
	pid := s.Tenants().PID("namespace/ns1")
	host := s.imageHostAddress(t, "victim.ns1", victim.model)
	for _, c := range []struct {
		what string
		addr uint64
	}{{"device memory", victim.model}, {"module global", victim.global}, {"image in host memory", host}} {
		attacker := s.startFn(t, "attacker.ns2")
		l, err := s.request(t, attacker, "attacker.ns2", fmt.Sprintf("read %d", c.addr))
		t.Logf("the attacker reading the victim's %s at %#x: %q (release: %v)", c.what, c.addr, l, err)
		if !strings.HasPrefix(l, "fault") || err == nil {
			t.Errorf("the attacker read the victim's %s as %q (release %v): want a fault in its own executor", c.what,
				l, err)
		}
		if l, err := s.request(t, victim, "victim.ns1", "good"); l != victimSum || err != nil {
			t.Errorf("the victim after the attack on its %s: %q %v", c.what, l, err)
		}
	}
	if got := s.Tenants().PID("namespace/ns1"); got != pid {
		t.Errorf("the victim's executor changed (%d -> %d)", pid, got)
	}
}

// faultEndsOnlyItsTenant: a kernel of ns1 follows a bad pointer: the call fails, the request's release says its
// binding broke, ns1's executor ends and is restarted; ns2 (bound to the same GPU right after) answers exactly
// from its executor, which never changed; ns1, started again, answers exactly; every GPU stays in service.
func faultEndsOnlyItsTenant(t *testing.T, s *tenantServer) {
	a, b := s.startFn(t, "victim.ns1"), s.startFn(t, "attacker.ns2")
	for _, x := range []struct {
		p  *fnProc
		fn string
	}{{a, "victim.ns1"}, {b, "attacker.ns2"}} {
		if l, err := s.request(t, x.p, x.fn, "good"); l != victimSum || err != nil {
			t.Fatalf("%s: %q %v", x.fn, l, err)
		}
	}
	pid2 := s.Tenants().PID("namespace/ns2")
	l, err := s.request(t, a, "victim.ns1", "read 4096")
	if strings.HasPrefix(l, "sum") || err == nil {
		t.Fatalf("a kernel on a bad address: %q (release %v): want an error", l, err)
	}
	if l, err := s.request(t, b, "attacker.ns2", "good"); l != victimSum || err != nil {
		t.Fatalf("ns2 after ns1's fault: %q %v", l, err)
	}
	if got := s.Tenants().PID("namespace/ns2"); got != pid2 {
		t.Fatalf("ns2's executor changed (%d -> %d)", pid2, got)
	}
	a = s.startFn(t, "victim.ns1") // its session died with its executor: started again, as its supervisor would
	if l, err := s.request(t, a, "victim.ns1", "good"); l != victimSum || err != nil {
		t.Fatalf("ns1 after its executor's restart: %q %v", l, err)
	}
	for _, st := range s.Tenants().Status() {
		if !st.Healthy {
			t.Errorf("gpu %d out of service after a tenant's fault: %s", st.GPU, st.Error)
		}
	}
}
