package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func startTestServer(t *testing.T, dir string) *Server {
	t.Helper()
	s, err := Start(context.Background(), testServerConfig(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testServerConfig is startTestServer's configuration: a simulated v100x4 node of 4 GiB GPUs, its sockets and key
// in dir.
func testServerConfig(t *testing.T, dir string) Config {
	t.Helper()
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	node, err = node.WithGPUMemory(4 << 30)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		DeviceReserveBytes: 64 << 20}
}

// startV100 starts a server on a simulated v100x4 node, with its sockets, key and repository in a new temporary
// directory and the rest of its configuration from cfg.
func startV100(ctx context.Context, t *testing.T, cfg Config) *Server {
	t.Helper()
	return startPreset(ctx, t, "v100x4", cfg)
}

// startOneGPU is startV100 on a node of one simulated GPU (h200x1), so that a binding held keeps every other
// tenant waiting.
func startOneGPU(ctx context.Context, t *testing.T, cfg Config) *Server {
	t.Helper()
	return startPreset(ctx, t, "h200x1", cfg)
}

// startPreset starts a server on the simulated node preset names, with its sockets, key and repository in a new
// temporary directory and the rest of its configuration from cfg.
func startPreset(ctx context.Context, t *testing.T, preset string, cfg Config) *Server {
	t.Helper()
	node, err := topology.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg.Node = node
	cfg.Socket, cfg.RemotingSocket = filepath.Join(dir, "gpuserver.sock"), filepath.Join(dir, "remoting.sock")
	cfg.KeyFile, cfg.RepositoryDir = filepath.Join(dir, "key"), filepath.Join(dir, "repository")
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func stop(t *testing.T, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRegistrationAnswersTheRemotingTokenAndTracksBindings(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir)
	defer stop(t, s)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", s.Socket())
	}}}
	req, _ := http.NewRequest(http.MethodPost, "http://gpuserver/v1/functions",
		strings.NewReader(`{"name": "resnet", "memory_bytes": 33554432, "slo_ns": 80000000}`))
	req.Header.Set("Authorization", "Bearer "+s.AdminToken())
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var reg api.RegisterResponse
	err = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	if err != nil || reg.Token == "" || reg.Token != s.Token("resnet") || reg.Percentile != 98 {
		t.Fatalf("register answered %+v (%v), want the token and the default percentile", reg, err)
	}
	if s.Token("resnet") == s.Token("bert") {
		t.Fatal("two functions share a token")
	}
	spec, token, err := s.pool.Function("resnet")
	if err != nil || token != reg.Token || spec.SLO != 80*time.Millisecond {
		t.Fatalf("registry: %+v %q %v", spec, token, err)
	}
	if _, _, err := s.pool.Function("bert"); !errors.Is(err, pool.ErrUnknownFunction) {
		t.Fatalf("registry of an unknown function: %v", err)
	}

	// The binder sees a request's GPU from acquire to release.
	c := client.New(s.Socket(), client.WithToken(reg.Token))
	b, err := c.Acquire(context.Background(), "resnet", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if gpu, ok := s.pool.CurrentGPU("resnet"); !ok || gpu != b.GPU {
		t.Fatalf("CurrentGPU = %d %v, want %d", gpu, ok, b.GPU)
	}
	if err := c.Release(context.Background(), b.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.pool.CurrentGPU("resnet"); ok {
		t.Fatal("CurrentGPU after release")
	}
	// An implicit binding (initialisation) goes through the pool too and is released once.
	gpu, release, err := s.pool.BindImplicit(context.Background(), "resnet")
	if err != nil {
		t.Fatal(err)
	}
	// It is no request: were it reported as one, the session would take initialisation for a request (ending
	// it, and releasing the binding its calls run under).
	if cur, ok := s.pool.CurrentGPU("resnet"); ok {
		t.Fatalf("implicit binding on gpu %d reported as a request on gpu %d", gpu, cur)
	}
	if _, active, err := s.Executors().Resident("resnet"); err != nil || active != gpu {
		t.Fatalf("implicit binding on gpu %d: executors have the function active on %d (%v)", gpu, active, err)
	}
	release()
	release()
	// Served and on time count the request alone: initialisation is no request (a function never invoked showed
	// requests served, and "functions within SLO" counted it).
	if st := s.Pool().Status(context.Background()); st.Functions[0].Running != 0 || st.Functions[0].Served != 1 ||
		st.Functions[0].OnTime > 1 {
		t.Fatalf("pool after a request and an implicit binding: %+v, want 1 served", st.Functions[0])
	}
}

func TestTokensSurviveARestartAndStaleSocketsAreReplaced(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir)
	tok := s.Token("resnet")
	if _, err := Start(context.Background(), Config{Socket: s.Socket(), Node: s.cfg.Node}); err == nil ||
		!strings.Contains(err.Error(), "another gpuserver") {
		t.Fatalf("second gpuserver on the same socket: err = %v", err)
	}
	stop(t, s)
	s2 := startTestServer(t, dir)
	defer stop(t, s2)
	if s2.Token("resnet") != tok {
		t.Fatal("token changed across a restart with the same key file")
	}
}
