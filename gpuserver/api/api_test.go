package api_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// serve starts the API for a one-GPU FCFS pool on a real Unix socket and returns a client and the socket path.
func serve(t *testing.T) (*client.Client, string) {
	t.Helper()
	p, err := pool.NewFCFS([]pool.GPU{{Name: "Tesla V100 (simulated)", MemoryBytes: 4 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := api.New(p, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "gpuserver.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	return client.New(sock), sock
}

func TestAcquireReleaseOverUnixSocket(t *testing.T) {
	ctx := context.Background()
	c, _ := serve(t)
	spec := pool.FunctionSpec{Name: "resnet", MemoryBytes: 1 << 30, SLO: 80 * time.Millisecond}
	if err := c.Register(ctx, spec); err != nil {
		t.Fatal(err)
	}
	b, err := c.Acquire(ctx, "resnet", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if b.GPU != 0 || b.Function != "resnet" || b.GPUName == "" || b.ID == "" {
		t.Fatalf("binding = %+v", b)
	}
	// The only GPU is bound: a second acquire times out with 504, mapped back to DeadlineExceeded.
	_, err = c.Acquire(ctx, "resnet", 30*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no GPU became free") {
		t.Fatalf("err = %v, want a deadline error that says why", err)
	}
	if err := c.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, b.ID); !errors.Is(err, pool.ErrUnknownBinding) {
		t.Fatalf("double release err = %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Functions) != 1 || st.Functions[0].Served != 1 || st.Functions[0].Percentile != 98 {
		t.Fatalf("status = %+v", st)
	}
	if err := c.Deregister(ctx, "resnet"); err != nil {
		t.Fatal(err)
	}
	if err := c.Deregister(ctx, "resnet"); err != nil {
		t.Fatalf("deregistering an unknown function is not an error: %v", err)
	}
}

func TestAPIErrors(t *testing.T) {
	ctx := context.Background()
	c, sock := serve(t)
	if _, err := c.Acquire(ctx, "nope", time.Second); !errors.Is(err, pool.ErrUnknownFunction) {
		t.Fatalf("unknown function: err = %v", err)
	}
	if err := c.Register(ctx, pool.FunctionSpec{Name: "big", MemoryBytes: 8 << 30}); !errors.Is(err, pool.ErrTooLarge) {
		t.Fatalf("too large: err = %v", err)
	}
	if err := c.Register(ctx, pool.FunctionSpec{Name: "x"}); !errors.Is(err, pool.ErrInvalidSpec) ||
		!strings.Contains(err.Error(), "memory_bytes") {
		t.Fatalf("invalid spec: err = %v, want one naming memory_bytes", err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	for _, tc := range []struct{ body, want string }{
		{`{"name": "x",`, "invalid request body"},
		{`{"name": "x", "memory": 5}`, "unknown field"},
		{`{"name": "x", "memory_bytes": 1048576, "compute_limit": 1.5}`, "compute_limit"},
		{`{"name": "x", "memory_bytes": 1048576, "compute_request": 0.8, "compute_limit": 0.5}`, "compute_request"},
	} {
		resp, err := hc.Post("http://gpuserver/v1/functions", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), tc.want) {
			t.Errorf("body %q: %d %s", tc.body, resp.StatusCode, raw)
		}
	}
	resp, err := hc.Get("http://gpuserver/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"faas_gpu_acquire_total", "faas_gpu_gpu_memory_bytes"} {
		if !strings.Contains(string(raw), name) {
			t.Errorf("metrics lack %s", name)
		}
	}
}
