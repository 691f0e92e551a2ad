package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func TestMain(m *testing.M) {
	tenantexec.RunIfChild()  // this test binary is also the tenants' executor process
	testkit.VerifyNoLeaks(m) // the server's goroutines (API, remoting, pool, executors) end with it
}

// tenantConfig runs the tenants' executors as this test binary; their logs go to the returned buffer.
func tenantConfig(t *testing.T) (*TenantConfig, *testkit.Buffer) {
	t.Helper()
	logs := &testkit.Buffer{}
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
	*testkit.Python
}

// startFn starts a function process of fn running script (faultyPy's protocol: "ready", then a line per command).
func startFn(t *testing.T, s *Server, fn, script string) *fnProcess {
	t.Helper()
	p := startFnProcess(t, s, fn, script)
	if l, err := p.next(); l != "ready" || err != nil {
		t.Fatalf("%s said %q (%v)\n%s", fn, l, err, p.Stderr())
	}
	return p
}

// startFnProcess starts script as a process of fn through the shim, with the vector-add function's folder as
// FN_DIR (cudadrv.py, kernels.ptx).
func startFnProcess(t *testing.T, s *Server, fn, script string) *fnProcess {
	t.Helper()
	dir := filepath.Join(testkit.RepoRoot(t), "functions", "vector-add")
	env := append(testkit.ShimEnv(testkit.Shim(t), s.RemotingSocket(), fn, s.Token(fn)), "FN_DIR="+dir)
	return &fnProcess{testkit.StartPython(t, script, env...)}
}

// next reads the process's next line (within a minute); an error wrapping testkit.ErrEnded when it ended.
func (p *fnProcess) next() (string, error) { return p.LineWithin(time.Minute) }

// request runs one request of fn through the pool: acquire, a command, release. sent says whether the command
// reached the process (an acquire that failed sends none).
func request(ctx context.Context, s *Server, p *fnProcess, fn, what string) (line string, sent bool, err error) {
	b, err := s.Pool().Acquire(ctx, fn)
	if err != nil {
		return "", false, err
	}
	_ = p.Send(what)
	l, lerr := p.next()
	rerr := s.Pool().Release(ctx, b.ID)
	if lerr != nil {
		return l, true, lerr
	}
	return l, true, rerr
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
			if l, _, err := request(ctx, s, x.p, x.fn, "good"); l != want || err != nil {
				t.Fatalf("%s request %d: %q %v\n%s", x.fn, i, l, err, x.p.Stderr())
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

// TestKillOneTenantUnderLoad: requests stream to two tenants; the executor of one is killed with SIGKILL in the
// middle. The other tenant sees no error at all; the killed tenant's requests in flight fail (never a wrong
// answer), its function process (whose session died with the executor) is started again as its supervisor
// would, and it answers correctly again within 5 s of the kill, its model restored from its image.
func TestKillOneTenantUnderLoad(t *testing.T) {
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
	const want = "sum 1.0496e+06"
	a, b := startFn(t, s, "va.ns1", faultyPy), startFn(t, s, "vb.ns2", faultyPy)
	for _, x := range []struct {
		p  *fnProcess
		fn string
	}{{a, "va.ns1"}, {b, "vb.ns2"}} {
		if l, _, err := request(ctx, s, x.p, x.fn, "good"); l != want || err != nil {
			t.Fatalf("%s: %q %v", x.fn, l, err)
		}
	}
	pid := s.Tenants().PID("namespace/ns1")
	if pid == 0 {
		t.Fatal("no executor for namespace/ns1")
	}

	type result struct {
		served, failed, wrong int
		recovered             time.Duration // from the kill to the first right answer after it
	}
	killed := make(chan time.Time, 1)
	stopLoad := make(chan struct{})
	resB := make(chan result, 1)
	go func() { // tenant ns2: a steady stream
		var r result
		for {
			select {
			case <-stopLoad:
				resB <- r
				return
			default:
			}
			l, _, err := request(ctx, s, b, "vb.ns2", "good")
			switch {
			case err != nil:
				r.failed++
				t.Errorf("ns2's request failed: %v", err)
				if errors.Is(err, testkit.ErrEnded) {
					resB <- r
					return
				}
			case l != want:
				r.wrong++
			default:
				r.served++
			}
		}
	}()
	var ra result
	var killAt time.Time
	dumped := false
	deadline := time.Now().Add(30 * time.Second)
	for ra.recovered == 0 && time.Now().Before(deadline) {
		if killAt.IsZero() && ra.served >= 20 {
			killAt = time.Now()
			if err := syscallKill(pid); err != nil {
				t.Fatal(err)
			}
			killed <- killAt
		}
		l, sent, err := request(ctx, s, a, "va.ns1", "good")
		switch {
		case err != nil:
			ra.failed++
			if killAt.IsZero() {
				t.Fatalf("ns1 failed before the kill: %v", err)
			}
			if !killAt.IsZero() && time.Since(killAt) > 5*time.Second && !dumped {
				dumped = true
				buf := make([]byte, 1<<22)
				t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
			}
			if ra.failed < 3 || ra.failed%50 == 0 {
				t.Logf("ns1 after the kill: %v; tenants %+v", err, s.Pool().Status(ctx).Tenants)
			}
			if sent && !errors.Is(err, testkit.ErrEnded) {
				_, _ = a.next() // the answer of the command, if it comes
			}
			if sent {
				// its session died with the executor: start the function process again, as the template's
				// supervisor does when it exits
				_ = a.Process().Kill()
				a = startFn(t, s, "va.ns1", faultyPy)
			}
		case l != want:
			ra.wrong++
			t.Errorf("ns1 answered %q", l)
		default:
			ra.served++
			if !killAt.IsZero() {
				ra.recovered = time.Since(killAt)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // ns2 keeps streaming a little after ns1 recovered
	close(stopLoad)
	rb := <-resB
	t.Logf("ns1: %d served, %d failed, recovered %v after the kill; ns2: %d served, %d failed, %d wrong", ra.served,
		ra.failed, ra.recovered, rb.served, rb.failed, rb.wrong)
	if rb.failed != 0 || rb.wrong != 0 || rb.served == 0 {
		t.Errorf("ns2 (not killed): %d served, %d failed, %d wrong", rb.served, rb.failed, rb.wrong)
	}
	if ra.recovered == 0 || ra.recovered > 5*time.Second {
		t.Errorf("ns1 recovered %v after its executor was killed (want within 5s)", ra.recovered)
	}
	if ra.wrong != 0 {
		t.Errorf("ns1 answered wrongly %d times", ra.wrong)
	}
	st := s.Pool().Status(ctx)
	for _, ts := range st.Tenants {
		if ts.Tenant == "namespace/ns1" && (ts.Restarts != 1 || !strings.Contains(ts.LastExit, "killed")) {
			t.Errorf("ns1's executor status: %+v", ts)
		}
		if ts.Tenant == "namespace/ns2" && (ts.Restarts != 0 || ts.Generation != 1) {
			t.Errorf("ns2's executor status: %+v", ts)
		}
	}
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// TestKernelFaultEndsOnlyItsTenant: a kernel of namespace ns1 follows a bad pointer. The faulting call answers an
// error, the request's release says its binding broke (503, never a result computed on lost memory), ns1's
// executor ends (on a real GPU the fault poisons every context of its process) and is restarted; ns2's executor
// never notices and keeps answering; ns1's function, started again, answers correctly from its image.
func TestKernelFaultEndsOnlyItsTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, logs := tenantConfig(t)
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc})
	defer stop(t, s)
	for _, fn := range []string{"va.ns1", "vb.ns2"} {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	const want = "sum 1.0496e+06"
	a, b := startFn(t, s, "va.ns1", faultyPy), startFn(t, s, "vb.ns2", faultyPy)
	for _, x := range []struct {
		p  *fnProcess
		fn string
	}{{a, "va.ns1"}, {b, "vb.ns2"}} {
		if l, _, err := request(ctx, s, x.p, x.fn, "good"); l != want || err != nil {
			t.Fatalf("%s: %q %v", x.fn, l, err)
		}
	}
	pid2 := s.Tenants().PID("namespace/ns2")
	l, _, err := request(ctx, s, a, "va.ns1", "bad")
	if err == nil || strings.HasPrefix(l, "sum") || l == "no fault" {
		t.Fatalf("the faulting request answered %q, %v: want an error", l, err)
	}
	t.Logf("the faulting request: %q, %v", l, err)
	if l, _, err := request(ctx, s, b, "vb.ns2", "good"); l != want || err != nil {
		t.Fatalf("ns2 after ns1's fault: %q %v", l, err)
	}
	if got := s.Tenants().PID("namespace/ns2"); got != pid2 {
		t.Fatalf("ns2's executor changed (%d -> %d)", pid2, got)
	}
	_ = a.Process().Kill() // its session died with its executor: start it again, as its supervisor would
	a = startFn(t, s, "va.ns1", faultyPy)
	if l, _, err := request(ctx, s, a, "va.ns1", "good"); l != want || err != nil {
		t.Fatalf("ns1 after its executor's restart: %q %v", l, err)
	}
	for _, ts := range s.Pool().Status(ctx).Tenants {
		switch ts.Tenant {
		case "namespace/ns1":
			if ts.Faults != 1 || ts.Restarts != 1 || !strings.Contains(ts.LastExit, "fault") {
				t.Errorf("ns1's executor: %+v", ts)
			}
		case "namespace/ns2":
			if ts.Faults != 0 || ts.Restarts != 0 {
				t.Errorf("ns2's executor: %+v", ts)
			}
		}
	}
	if st := s.Tenants().Status(); !st[0].Healthy || !st[1].Healthy {
		t.Errorf("gpus after the fault: %+v", st)
	}
	if !strings.Contains(logs.String(), "a kernel of the tenant faulted") {
		t.Errorf("the executor did not log the fault")
	}
}

// TestTemplateRestartsWhenItsExecutorDies: the gpu-python template serving vector-add, its tenant's executor
// killed twice: once while nothing is bound, once while a binding of the function is held (its release says the
// binding broke and that the function's process must start again: restart in the API's answer). Each time the
// template's next request answers 503, never a result, and the template exits (75) so that its supervisor starts it
// with a new CUDA session; started again, it answers exactly. Before, a template whose session died answered 500
// from its handler's CUDA errors for good.
func TestTemplateRestartsWhenItsExecutorDies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the gpu-python template through the shim and executor processes")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc})
	defer stop(t, s)
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: "vector-add.ns1", MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"a":[1,2,3],"b":[10,20,30]}`)
	const want = `{"c": [11.0, 22.0, 33.0]}`
	for round := 0; round < 2; round++ {
		f := startTemplateFunction(t, s, "vector-add.ns1", "../../functions/vector-add")
		if code, out := f.post(t, body); code != 200 || strings.TrimSpace(string(out)) != want {
			t.Fatalf("round %d before the kill: %d %s\n%s", round, code, out, f.stderr)
		}
		pid := s.Tenants().PID("namespace/ns1")
		if round == 0 { // idle
			if err := syscallKill(pid); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 60*time.Second, "the executor restarted", func() bool {
				p := s.Tenants().PID("namespace/ns1")
				return p != 0 && p != pid
			})
		} else { // in the middle of a request: the executor is killed while the request holds its binding
			b, err := s.Pool().Acquire(ctx, "vector-add.ns1")
			if err != nil {
				t.Fatal(err)
			}
			if err := syscallKill(pid); err != nil {
				t.Fatal(err)
			}
			err = s.Pool().Release(ctx, b.ID)
			if !errors.Is(err, pool.ErrBindingBroken) || !errors.Is(err, pool.ErrFunctionLost) {
				t.Fatalf("the release of a binding held on a killed executor: %v", err)
			}
		}
		code, out := f.post(t, body)
		if code != 503 || strings.Contains(string(out), `"c"`) {
			t.Fatalf("round %d after the kill: %d %s, want 503\n%s", round, code, out, f.stderr)
		}
		select {
		case <-f.exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the template did not exit after its session was lost\n%s", round, f.stderr)
		}
		if st := f.cmd.ProcessState.ExitCode(); st != 75 {
			t.Fatalf("round %d: the template exited %d, want 75\n%s", round, st, f.stderr)
		}
	}
	f := startTemplateFunction(t, s, "vector-add.ns1", "../../functions/vector-add")
	if code, out := f.post(t, body); code != 200 || strings.TrimSpace(string(out)) != want {
		t.Fatalf("after the restarts: %d %s\n%s", code, out, f.stderr)
	}
}

// TestTenantLimitAndIdleExecutors: with --max-tenants 1 a function of a second tenant is refused at registration
// (429: pool.ErrLimit, naming the limit); once the first tenant's last function is deregistered its executor stops
// (it holds no context any more) and the second tenant gets one.
func TestTenantLimitAndIdleExecutors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs executor processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	tc.MaxTenants = 1
	s := startV100(ctx, t, Config{DeviceReserveBytes: 64 << 20, Tenants: tc})
	defer stop(t, s)
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: "a.ns1", MemoryBytes: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	err := s.Pool().Register(ctx, pool.FunctionSpec{Name: "b.ns2", MemoryBytes: 16 << 20})
	if !errors.Is(err, pool.ErrLimit) || !strings.Contains(err.Error(), "max-tenants") {
		t.Fatalf("a second tenant beyond --max-tenants 1: %v, want ErrLimit naming the flag", err)
	}
	for _, f := range s.Pool().Status(ctx).Functions {
		if f.Name == "b.ns2" {
			t.Fatal("the refused function is registered in the pool")
		}
	}
	if pid := s.Tenants().PID("namespace/ns1"); pid == 0 {
		t.Fatal("ns1 has no executor")
	}
	if err := s.Pool().Deregister(ctx, "a.ns1"); err != nil {
		t.Fatal(err)
	}
	if st := s.Pool().Status(ctx); len(st.Tenants) != 0 {
		t.Fatalf("tenants after the last function left: %+v", st.Tenants)
	}
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: "b.ns2", MemoryBytes: 16 << 20}); err != nil {
		t.Fatalf("ns2 once ns1's executor stopped: %v", err)
	}
	if pid := s.Tenants().PID("namespace/ns2"); pid == 0 {
		t.Fatal("ns2 has no executor")
	}
}

// imagesPy loads and unloads module images of a given size through the shim: "load <MiB> <tag>" answers the
// result of cuModuleLoadData of a PTX image of that size (distinct per tag), "unload" unloads the last one.
const imagesPy = `
import ctypes, os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
mods = []
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    if w[0] == "load":
        head = b".version 7.0\n.target sm_50\n.address_size 64\n// " + w[2].encode() + b"\n"
        img = head + b"//" + b"x" * (int(w[1]) * 1024 * 1024) + b"\n"
        m = ctypes.c_void_p()
        r = cuda.lib.cuModuleLoadData(ctypes.byref(m), img)
        if r == 0:
            mods.append(m)
        print("load %d" % r, flush=True)
    elif w[0] == "unload":
        print("unload %d" % cuda.lib.cuModuleUnload(mods.pop()), flush=True)
`

// TestModuleImagesBoundedOverTheExecutors: the node's bound on module images (MaxModuleBytes) was kept by each
// remoting server, and with an executor process per tenant each executor had a bound of its own: the node held up to
// MaxTenants times its bound (32 x 4 GiB by default). Now every executor reserves its images' bytes with the
// gpuserver: three tenants' functions load 3 MiB images under an 8 MiB bound for the node, the third is refused
// (CUDA_ERROR_OUT_OF_MEMORY) although its executor holds nothing, and loads once the first gave its image back.
func TestModuleImagesBoundedOverTheExecutors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	tc.MaxModuleBytes = 8 << 20
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc})
	defer stop(t, s)
	fns := []string{"a.ns1", "b.ns2", "c.ns3"}
	var ps []*fnProcess
	for _, fn := range fns {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, startFn(t, s, fn, imagesPy))
	}
	say := func(i int, what string) string {
		t.Helper()
		if err := ps[i].Send(what); err != nil {
			t.Fatalf("%s: %v\n%s", fns[i], err, ps[i].Stderr())
		}
		l, err := ps[i].next()
		if err != nil {
			t.Fatalf("%s: %v\n%s", fns[i], err, ps[i].Stderr())
		}
		return l
	}
	for i, want := range []string{"load 0", "load 0", "load 2"} {
		if got := say(i, "load 3 "+fns[i]); got != want {
			t.Fatalf("%s loading a 3 MiB image beside %d others' under an 8 MiB bound: %q, want %q", fns[i], i, got, want)
		}
	}
	if got := say(0, "unload"); got != "unload 0" {
		t.Fatalf("unload: %q", got)
	}
	testkit.Eventually(t, 60*time.Second, "the third tenant's image loads once the first's is gone", func() bool {
		return say(2, "load 3 again") == "load 0"
	})
}
