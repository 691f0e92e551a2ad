package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// faultServer is a gpuserver on four simulated V100s with an executor process per tenant whose simulated GPUs
// share within one process what an H100 does (as `faas-gpu up` runs them: a fault poisons every context of the
// executor), its log in logs, and two functions of two tenants: the faulting va.ns1 and vb.ns2.
func faultServer(ctx context.Context, t *testing.T, backoff FaultBackoff) (*Server, *testkit.Buffer) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	tc, _ := tenantConfig(t)
	tc.BackoffMax = 200 * time.Millisecond // the executor of a tenant that keeps faulting restarts at once
	logs := &testkit.Buffer{}
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc, SimProcessWide: true,
		FaultBackoff: backoff, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gpuserver logs:\n%s", logs.String())
		}
	})
	for _, fn := range []string{"va.ns1", "vb.ns2"} {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	return s, logs
}

// faultOnce starts a process of va.ns1 (its last one died with its executor), checks that it computes, then runs
// a request whose kernel follows a bad pointer while three more requests of it acquire at once. It answers the
// GPU of the faulting request.
func faultOnce(ctx context.Context, t *testing.T, s *Server) int {
	t.Helper()
	p := startFn(t, s, "va.ns1", faultyPy)
	defer func() { _ = p.Process().Kill() }()
	if l, _, err := request(ctx, s, p, "va.ns1", "good"); l != sumWant || err != nil {
		t.Fatalf("va.ns1 before its fault: %q %v\n%s", l, err, p.Stderr())
	}
	b, err := s.Pool().Acquire(ctx, "va.ns1")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 { // calls at once: they reach the executor while its contexts are poisoned
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, err := s.Pool().Acquire(ctx, "va.ns1"); err == nil {
				_ = s.Pool().Release(ctx, c.ID)
			}
		}()
	}
	_ = p.Send("bad")
	l, lerr := p.next()
	rerr := s.Pool().Release(ctx, b.ID)
	wg.Wait()
	if lerr == nil && (strings.HasPrefix(l, "sum") || l == "no fault") || rerr == nil {
		t.Fatalf("the faulting request answered %q (%v), its release %v: want an error", l, lerr, rerr)
	}
	return b.GPU
}

const sumWant = "sum 1.0496e+06" // faultyPy's answer: 2 * (1 + ... + 1024)

// healthyGPUs counts the GPUs in service in the pool's status.
func healthyGPUs(ctx context.Context, s *Server) int {
	n := 0
	for _, g := range s.Pool().Status(ctx).GPUs {
		if g.Healthy {
			n++
		}
	}
	return n
}

// functionStatus is fn's entry in the pool's status.
func functionStatus(ctx context.Context, t *testing.T, s *Server, fn string) pool.FunctionStatus {
	t.Helper()
	for _, f := range s.Pool().Status(ctx).Functions {
		if f.Name == fn {
			return f
		}
	}
	t.Fatalf("%s is not in the pool's status", fn)
	return pool.FunctionStatus{}
}

// acquireHTTP posts an acquire of fn with its token on the API and answers the status and Retry-After.
func acquireHTTP(t *testing.T, s *Server, fn string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", s.Socket())
	}}}
	req, _ := http.NewRequest(http.MethodPost, "http://gpuserver/v1/functions/"+fn+"/acquire",
		strings.NewReader(`{"timeout_ms": 5000}`))
	req.Header.Set("Authorization", "Bearer "+s.Token(fn))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// TestFaultLoopKeepsEveryGPUInService: measured against `faas-gpu up` on the simulated node, each kernel fault of
// one function (a bad kernel, then calls at once) took a GPU out of service for good, through the executor's own
// swap streams, which the fault had poisoned: after 8 faults healthy GPUs went 7, 6, ... 0 and another tenant's
// vector-add answered 503 "no healthy GPU". Here va.ns1 faults 9 times on a node of 4 GPUs (more faults than
// GPUs). Every fault ends va.ns1's work with an error, never a result; after each, vb.ns2 (another tenant) answers
// exactly; at the end every GPU is in service (the pool's status and /metrics), each GPU a fault was on passed its
// health check after the faulting executor ended, and vb.ns2 still answers exactly. va.ns1 is backed off after its
// 8th fault in the window: its acquire answers 503 with Retry-After on the API (and its calls outside a request
// are refused), the pool's status and /metrics show
// it, a log line names it and its gpu; after its backoff ended it faults once more and is backed off twice as long,
// and vb.ns2 is served all the while; at the end its vector-add through the gpu-python template answers exactly.
func TestFaultLoopKeepsEveryGPUInService(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const threshold, backoff = 8, 2 * time.Second
	s, logs := faultServer(ctx, t, FaultBackoff{Threshold: threshold, Window: time.Minute, Min: backoff,
		Max: 4 * backoff})
	defer stop(t, s)
	b := startFn(t, s, "vb.ns2", faultyPy)
	other := func(when string) {
		t.Helper()
		if l, _, err := request(ctx, s, b, "vb.ns2", "good"); l != sumWant || err != nil {
			t.Fatalf("vb.ns2 %s: %q %v (healthy gpus %d)", when, l, err, healthyGPUs(ctx, s))
		}
	}
	other("before the faults")
	faulted := map[int]bool{}
	for i := 1; i <= threshold; i++ {
		faulted[faultOnce(ctx, t, s)] = true
		other(fmt.Sprintf("after va.ns1's fault %d", i))
	}
	// Backed off: refused on the API with 503 and Retry-After, shown in the status, /metrics and the log.
	testkit.Eventually(t, 30*time.Second, "va.ns1 backed off", func() bool {
		return functionStatus(ctx, t, s, "va.ns1").BackedOff > 0
	})
	if code, ra := acquireHTTP(t, s, "va.ns1"); code != http.StatusServiceUnavailable || ra == "" {
		t.Fatalf("va.ns1's acquire while it is backed off: %d, Retry-After %q; want 503 with Retry-After", code, ra)
	}
	if _, err := s.Pool().Acquire(ctx, "va.ns1"); !errors.Is(err, pool.ErrBackedOff) {
		t.Fatalf("va.ns1's acquire while it is backed off: %v, want ErrBackedOff", err)
	}
	if _, _, err := s.pool.BindImplicit(ctx, "va.ns1"); !errors.Is(err, pool.ErrBackedOff) {
		t.Fatalf("va.ns1's calls outside a request while it is backed off: %v, want ErrBackedOff", err)
	}
	m := scrape(t, s)
	if !strings.Contains(m, `faas_gpu_function_backed_off{function="va.ns1"} 1`) ||
		!strings.Contains(m, fmt.Sprintf(`faas_gpu_function_faults_total{function="va.ns1"} %d`, threshold)) {
		t.Fatalf("metrics of the backed-off function:\n%s", grep(m, "faas_gpu_function_"))
	}
	if l := grep(logs.String(), "function backed off"); !strings.Contains(l, "function=va.ns1") ||
		!strings.Contains(l, "gpu=") {
		t.Fatalf("no log line of the backoff with the function and gpu keys:\n%s", l)
	}
	other("while va.ns1 is backed off")
	if code, _ := acquireHTTP(t, s, "vb.ns2"); code != http.StatusOK {
		t.Fatalf("vb.ns2's acquire while va.ns1 is backed off: %d", code)
	}
	// It faults again as soon as its backoff ends: backed off again, twice as long.
	testkit.Eventually(t, 30*time.Second, "va.ns1's backoff ended", func() bool {
		return functionStatus(ctx, t, s, "va.ns1").BackedOff == 0
	})
	faulted[faultOnce(ctx, t, s)] = true
	testkit.Eventually(t, 30*time.Second, "va.ns1 backed off twice as long", func() bool {
		return functionStatus(ctx, t, s, "va.ns1").BackedOff > backoff
	})
	if f := functionStatus(ctx, t, s, "va.ns1"); f.Faults != threshold+1 {
		t.Fatalf("va.ns1's faults in the status: %d, want %d", f.Faults, threshold+1)
	}
	// Every GPU in service, each GPU a fault was on checked after its executor ended.
	testkit.Eventually(t, 60*time.Second, "every gpu in service and checked", func() bool {
		m := scrape(t, s)
		for g := range faulted {
			if !strings.Contains(m, fmt.Sprintf(`faas_gpu_gpu_health_checks_total{gpu="%d",result="passed"}`, g)) {
				return false
			}
		}
		return healthyGPUs(ctx, s) == 4
	})
	m = scrape(t, s)
	for g := range 4 {
		if !strings.Contains(m, fmt.Sprintf(`faas_gpu_gpu_healthy{gpu="%d"} 1`, g)) {
			t.Fatalf("gpu %d not healthy in /metrics:\n%s", g, grep(m, "faas_gpu_gpu_healthy"))
		}
	}
	if strings.Contains(m, `result="failed"`) {
		t.Fatalf("a health check failed:\n%s", grep(m, "health_checks"))
	}
	other("after the faults")
	// The report's own check: the other tenant's vector-add through the gpu-python template answers exactly.
	testkit.NeedPython(t)
	va := startTemplateFunction(t, s, "vb.ns2", "../../functions/vector-add")
	if code, out := va.post(t, []byte(`{"a":[1,2,3],"b":[10,20,30]}`)); code != 200 ||
		strings.TrimSpace(string(out)) != `{"c": [11.0, 22.0, 33.0]}` {
		t.Fatalf("vb.ns2's vector-add after the faults: %d %s\n%s", code, out, va.stderr)
	}
}

// TestFailedHealthCheckKeepsTheGPUOut: a fault whose GPU then fails its health check (a real device failure,
// here injected into the gpuserver's simulated device, where the check runs) takes that GPU out of service,
// reported in the pool's status, /metrics (faas_gpu_gpu_healthy 0, a failed check) and the log; the other GPUs
// stay in service and the other tenant is served on them.
func TestFailedHealthCheckKeepsTheGPUOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, logs := faultServer(ctx, t, FaultBackoff{})
	defer stop(t, s)
	b := startFn(t, s, "vb.ns2", faultyPy)
	p := startFn(t, s, "va.ns1", faultyPy)
	if l, _, err := request(ctx, s, p, "va.ns1", "good"); l != sumWant || err != nil {
		t.Fatalf("va.ns1: %q %v", l, err)
	}
	held, err := s.Pool().Acquire(ctx, "va.ns1")
	if err != nil {
		t.Fatal(err)
	}
	gpu := held.GPU
	if err := s.dev.(*sim.Backend).FailGPU(gpu, errors.New("xid 79: the GPU has fallen off the bus")); err != nil {
		t.Fatal(err)
	}
	_ = p.Send("bad")
	_, _ = p.next()
	_ = s.Pool().Release(ctx, held.ID)
	testkit.Eventually(t, 60*time.Second, "the gpu out of service", func() bool {
		return !s.Pool().Status(ctx).GPUs[gpu].Healthy
	})
	m := scrape(t, s)
	if !strings.Contains(m, fmt.Sprintf(`faas_gpu_gpu_healthy{gpu="%d"} 0`, gpu)) ||
		!strings.Contains(m, fmt.Sprintf(`faas_gpu_gpu_health_checks_total{gpu="%d",result="failed"} 1`, gpu)) {
		t.Fatalf("metrics of the gpu that failed its check:\n%s\n%s", grep(m, "faas_gpu_gpu_healthy"),
			grep(m, "health_checks"))
	}
	if l := grep(logs.String(), "failed its health check"); !strings.Contains(l, fmt.Sprintf("gpu=%d", gpu)) ||
		!strings.Contains(l, "fallen off the bus") {
		t.Fatalf("no log line of the failed check:\n%s", l)
	}
	if n := healthyGPUs(ctx, s); n != 3 {
		t.Fatalf("%d gpus in service, want the 3 others", n)
	}
	for range 3 {
		bb, err := s.Pool().Acquire(ctx, "vb.ns2")
		if err != nil {
			t.Fatal(err)
		}
		if bb.GPU == gpu {
			t.Fatalf("vb.ns2 bound to the failed gpu %d", gpu)
		}
		_ = b.Send("good")
		l, err := b.next()
		if rerr := s.Pool().Release(ctx, bb.ID); l != sumWant || err != nil || rerr != nil {
			t.Fatalf("vb.ns2 beside the failed gpu: %q %v %v", l, err, rerr)
		}
	}
}
