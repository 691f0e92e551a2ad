package api_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// shedding is a pool whose overload control refuses every acquire (the controller's Pool answers so for a
// request of a shed function that cannot meet its deadline); the episode changes when episode is set.
type shedding struct {
	pool.Pool
	episode *atomic.Uint64
}

func (s shedding) Acquire(_ context.Context, function string) (pool.Binding, error) {
	return pool.Binding{}, &pool.OverloadedError{Function: function, RetryAfter: 1500 * time.Millisecond,
		Reason: "the node sheds it", Episode: s.episode.Load()}
}

// TestOverloadedIs429WithRetryAfter: a shed acquire answers 429 with Retry-After in whole seconds (rounded up),
// and the client maps it back to pool.ErrOverloaded with the delay and the function.
func TestOverloadedIs429WithRetryAfter(t *testing.T) {
	fcfs, err := pool.NewFCFS([]pool.GPU{{Name: "Tesla V100 (simulated)", MemoryBytes: 4 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var logged bytes.Buffer
	var mu sync.Mutex
	episode := &atomic.Uint64{}
	episode.Store(1)
	srv, err := api.New(shedding{fcfs, episode}, reg, reg, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil)))
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
	resp, err := hc.Post("http://gpuserver/v1/functions/heavy/acquire", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("status %d, Retry-After %q; want 429, 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	_, err = client.New(sock).Acquire(context.Background(), "heavy", time.Second)
	var oe *pool.OverloadedError
	if !errors.Is(err, pool.ErrOverloaded) || !errors.As(err, &oe) || oe.RetryAfter != 2*time.Second ||
		oe.Function != "heavy" {
		t.Fatalf("client: %v, want an OverloadedError for heavy retrying after 2s", err)
	}
	if api.StatusCode(err) != http.StatusTooManyRequests {
		t.Errorf("StatusCode = %d", api.StatusCode(err))
	}
	// Logged once per function and episode: two refusals of episode 1 above, one of episode 2 below.
	episode.Store(2)
	_, _ = client.New(sock).Acquire(context.Background(), "heavy", time.Second)
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logged.String(), "overload control sheds a function"); n != 2 {
		t.Fatalf("%d log lines for two episodes:\n%s", n, logged.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
