package server

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestBillSurvivesARestart: a request's binding is metered (GPU seconds, its quota times them), the bill is on
// /v1/usage and /metrics, and a gpuserver started again on the same state goes on from it. Initialisation
// (implicit bindings) is not billed.
func TestBillSurvivesARestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "metering.json")
	start := func() *Server {
		s := startTestServerWith(t, dir, func(c *Config) { c.MeteringFile = file })
		return s
	}
	s := start()
	admin := client.New(s.Socket(), client.WithToken(s.AdminToken()))
	const quota = 32 << 20 // within the 64 MiB of chunks the controller plans with
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "resnet.dev", MemoryBytes: quota}); err != nil {
		t.Fatal(err)
	}
	fn := client.New(s.Socket(), client.WithToken(s.Token("resnet.dev")))
	hold := func() {
		b, err := fn.Acquire(ctx, "resnet.dev", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the request's work
		if err := fn.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	hold()
	r, err := admin.Usage(ctx, time.Time{})
	if err != nil || len(r.Functions) != 1 {
		t.Fatalf("usage: %+v %v", r, err)
	}
	u := r.Functions[0]
	if u.Function != "resnet" || u.Namespace != "dev" || u.Requests != 1 || u.GPUSeconds < 0.05 ||
		u.GPUSeconds > 5 || u.GPUMemoryByteSeconds != u.GPUSeconds*quota {
		t.Fatalf("after one request: %+v", u)
	}
	first := u.GPUSeconds
	metrics := scrape(t, s)
	if !strings.Contains(metrics, `faas_gpu_usage_requests_total{function="resnet",namespace="dev"} 1`) ||
		!strings.Contains(metrics, `faas_gpu_usage_gpu_seconds_total{function="resnet",namespace="dev"}`) {
		t.Fatalf("/metrics lacks the bill:\n%s", metrics)
	}
	stop(t, s)

	s = start()
	defer stop(t, s)
	admin = client.New(s.Socket(), client.WithToken(s.AdminToken()))
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "resnet.dev", MemoryBytes: quota}); err != nil {
		t.Fatal(err)
	}
	fn = client.New(s.Socket(), client.WithToken(s.Token("resnet.dev")))
	hold()
	r, err = admin.Usage(ctx, time.Time{})
	if err != nil || len(r.Functions) != 1 || r.Functions[0].Requests != 2 || r.Functions[0].GPUSeconds <= first {
		t.Fatalf("after a restart and another request: %+v %v, want 2 requests and more than %.3f s", r, err, first)
	}
	if _, err := admin.Usage(ctx, time.Now().Add(-time.Hour)); err != nil {
		t.Fatalf("usage since an hour ago: %v", err)
	}
}

// startTestServerWith starts a server as startTestServer does, with cfg changed by edit.
func startTestServerWith(t *testing.T, dir string, edit func(*Config)) *Server {
	t.Helper()
	cfg := testServerConfig(t, dir)
	edit(&cfg)
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
