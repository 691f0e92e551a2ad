package handlers

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

var repo = filepath.Join("..", "..")

// gpuServer runs the real gpuserver API over a first-come-first-served pool of two simulated GPUs on a Unix socket.
func gpuServer(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpus")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpuserver.sock")
	p, err := pool.NewFCFS([]pool.GPU{
		{Name: "Tesla V100-SXM2-32GB (simulated)", MemoryBytes: 32 << 30},
		{Name: "Tesla V100-SXM2-32GB (simulated)", MemoryBytes: 32 << 30},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h, err := api.New(instancesOfOne{p}, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return sock
}

// instancesOfOne binds every instance of a function (pool.InstanceKey: the local backend's replicas name theirs) as
// the function itself, one at a time: what a first-come-first-served pool without the gpuserver's instance
// bookkeeping (gpuserver/server, instances.go) can do. These tests are about the provider, not instances.
type instancesOfOne struct{ pool.Pool }

func (p instancesOfOne) Acquire(ctx context.Context, key string) (pool.Binding, error) {
	fn, _ := pool.SplitInstance(key)
	return p.Pool.Acquire(ctx, fn)
}

// recordingRegistry passes calls to the real gpuserver client and records them.
type recordingRegistry struct {
	next provider.GPURegistry
	mu   sync.Mutex
	regs []pool.FunctionSpec
	dels []string
}

func (r *recordingRegistry) Register(ctx context.Context, spec pool.FunctionSpec) error {
	r.mu.Lock()
	r.regs = append(r.regs, spec)
	r.mu.Unlock()
	return r.next.Register(ctx, spec)
}

func (r *recordingRegistry) Deregister(ctx context.Context, name string) error {
	r.mu.Lock()
	r.dels = append(r.dels, name)
	r.mu.Unlock()
	return r.next.Deregister(ctx, name)
}

func (r *recordingRegistry) calls() ([]pool.FunctionSpec, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pool.FunctionSpec(nil), r.regs...), append([]string(nil), r.dels...)
}

type fixture struct {
	srv     *httptest.Server
	backend *local.Backend
	gpu     *recordingRegistry
	socket  string
	build   string // the backend's build dir
	// user and password, when set, go with every request as basic auth.
	user, password string
}

// newFixture serves the handlers over a real local backend, with the repository's example functions and the probe
// test function built into a temporary build dir, and a real gpuserver API on a Unix socket.
func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureWith(t, nil)
}

// newFixtureWith is newFixture with the handlers' Config changed by tweak (nil: none).
func newFixtureWith(t testing.TB, tweak func(*Config)) *fixture {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the local backend runs functions with it")
	}
	dir := t.TempDir()
	build := filepath.Join(dir, "build")
	tpl := filepath.Join(repo, "template", "gpu-python")
	for name, handler := range map[string]string{
		"echo":      filepath.Join(repo, "functions", "echo"),
		"hello-gpu": filepath.Join(repo, "functions", "hello-gpu"),
		"probe":     filepath.Join(repo, "provider", "local", "testdata", "probe"),
	} {
		if err := shrinkwrap.Assemble(tpl, handler, filepath.Join(build, name)); err != nil {
			t.Fatal(err)
		}
	}
	sock := gpuServer(t)
	b, err := local.New(context.Background(), local.Config{StateDir: filepath.Join(dir, "state"), BuildDir: build,
		Env: map[string]string{"FAAS_GPU_SOCKET": sock}, BackoffMin: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	reg := &recordingRegistry{next: client.New(sock)}
	cfg := Config{Backend: b, Secrets: b, Logs: b, GPU: reg, ProxyTimeout: 2 * time.Minute,
		ReadyTimeout: 60 * time.Second, // generous: python starts slowly on a loaded machine
		Info:         types.ProviderInfo{Name: "faas-gpu", Orchestration: "local", Version: &types.VersionInfo{Release: "test"}}}
	if tweak != nil {
		tweak(&cfg)
	}
	srv := httptest.NewServer(New(cfg))
	t.Cleanup(srv.Close)
	f := &fixture{srv: srv, backend: b, gpu: reg, socket: sock, build: build}
	if cfg.Auth != nil {
		f.user, f.password = cfg.Auth.User, cfg.Auth.Password
	}
	return f
}

// do sends a request with an optional body (a string is sent as is, anything else as JSON) and returns the status,
// headers and body. A body to /system/ goes with Content-Type: application/json, as faas-cli sends every one.
func (f *fixture) do(t testing.TB, method, path string, body any) (int, http.Header, string) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = strings.NewReader(string(data))
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil && strings.HasPrefix(path, "/system/") {
		req.Header.Set("Content-Type", "application/json")
	}
	if f.user != "" {
		req.SetBasicAuth(f.user, f.password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(out)
}

// expect fails unless the request answers want (and, when contains is set, a body containing it).
func (f *fixture) expect(t testing.TB, method, path string, body any, want int, contains string) string {
	t.Helper()
	code, _, out := f.do(t, method, path, body)
	if code != want || !strings.Contains(out, contains) {
		t.Fatalf("%s %s = %d %q, want %d containing %q", method, path, code, out, want, contains)
	}
	return out
}

// deploy deploys the way faas-cli does: PUT, then POST when PUT answers 404.
func (f *fixture) deploy(t testing.TB, fd types.FunctionDeployment) {
	t.Helper()
	code, _, out := f.do(t, http.MethodPut, "/system/functions", fd)
	if code == http.StatusNotFound {
		code, _, out = f.do(t, http.MethodPost, "/system/functions", fd)
	}
	if code != http.StatusAccepted {
		t.Fatalf("deploying %s: %d %s", fd.Service, code, out)
	}
}

func (f *fixture) waitReady(t testing.TB, name string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // generous: python starts slowly on a loaded machine
	for {
		code, _, out := f.do(t, http.MethodGet, "/system/function/"+name, nil)
		var st types.FunctionStatus
		if code == http.StatusOK && json.Unmarshal([]byte(out), &st) == nil && st.AvailableReplicas == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s to have %d ready replicas: %d %s", name, n, code, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func gpuAnnotations(memory string) *map[string]string {
	return &map[string]string{"com.openfaas.gpu.memory": memory, "com.openfaas.gpu.slo": "80ms"}
}

func deployment(name string) types.FunctionDeployment {
	return types.FunctionDeployment{Service: name, Image: name + ":latest"}
}
