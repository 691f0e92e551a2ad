package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// lost is a pool whose functions all lost their memory before their initialisation ended.
type lost struct{ pool.Pool }

func (lost) Acquire(_ context.Context, function string) (pool.Binding, error) {
	return pool.Binding{}, fmt.Errorf("acquire %q: %w: a kernel fault", function, pool.ErrFunctionLost)
}

// TestLostFunctionIs503WithRestart: an acquire of a function whose memory was lost answers 503 with
// "restart": true (the gpu-python template then exits so that its process starts again), and the client maps it
// back to pool.ErrFunctionLost.
func TestLostFunctionIs503WithRestart(t *testing.T) {
	fcfs, err := pool.NewFCFS([]pool.GPU{{Name: "Tesla V100 (simulated)", MemoryBytes: 4 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := api.New(lost{fcfs}, reg, reg, nil)
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
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Post("http://gpuserver/v1/functions/mlp/acquire", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var body api.ErrorResponse
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !body.Restart {
		t.Fatalf("status %d, body %+v (%v); want 503 with restart", resp.StatusCode, body, err)
	}
	_, err = client.New(sock).Acquire(context.Background(), "mlp", time.Second)
	if !errors.Is(err, pool.ErrFunctionLost) {
		t.Fatalf("client: %v, want pool.ErrFunctionLost", err)
	}
	if api.StatusCode(err) != http.StatusServiceUnavailable {
		t.Errorf("StatusCode = %d", api.StatusCode(err))
	}
}
