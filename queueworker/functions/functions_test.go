package functions_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/queueworker/functions"
)

func TestFromAnnotations(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want functions.Function
	}{
		{"none", nil, functions.Function{Name: "f", Queue: "faas-request", Percentile: 98}},
		{"gpu with slo", map[string]string{"com.openfaas.gpu.memory": "1Gi", "com.openfaas.gpu.slo": "80ms",
			"com.openfaas.gpu.slo.percentile": "99.5", "com.openfaas.queue": "vision"},
			functions.Function{Name: "f", Queue: "vision", SLO: 80 * time.Millisecond, Percentile: 99.5, GPU: true}},
		{"bad values ignored", map[string]string{"com.openfaas.gpu.slo": "fast", "com.openfaas.gpu.slo.percentile": "100",
			"com.openfaas.queue": "a.b"}, functions.Function{Name: "f", Queue: "faas-request", Percentile: 98}},
		{"negative slo ignored", map[string]string{"com.openfaas.gpu.slo": "-1s"}, functions.Function{Name: "f", Queue: "faas-request", Percentile: 98}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := functions.FromAnnotations("f", tc.ann); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// provider serves /system/functions from a list that the test changes, counting reads.
type provider struct {
	mu    sync.Mutex
	list  []types.FunctionStatus
	down  atomic.Bool
	reads atomic.Int32
	user  string // when set, basic auth user (password "secret") required
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/system/functions" {
		http.NotFound(w, r)
		return
	}
	p.reads.Add(1)
	if u, pw, ok := r.BasicAuth(); p.user != "" && (!ok || u != p.user || pw != "secret") {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if p.down.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = json.NewEncoder(w).Encode(p.list)
}

func (p *provider) set(names ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = nil
	for _, n := range names {
		ann := map[string]string{"com.openfaas.gpu.slo": "200ms"}
		p.list = append(p.list, types.FunctionStatus{Name: n, Annotations: &ann})
	}
}

func TestGatewayCachesAndRefreshes(t *testing.T) {
	ctx := context.Background()
	p := &provider{}
	p.set("a")
	srv := httptest.NewServer(p)
	defer srv.Close()
	now := time.Unix(1000, 0)
	g := functions.NewGateway(functions.GatewayConfig{URL: srv.URL, TTL: 5 * time.Second, MissRefresh: time.Second,
		Now: func() time.Time { return now }})

	f, err := g.Function(ctx, "a")
	if err != nil || f.SLO != 200*time.Millisecond {
		t.Fatalf("Function(a) = %+v, %v", f, err)
	}
	if _, err := g.Function(ctx, "a"); err != nil || p.reads.Load() != 1 {
		t.Fatalf("second lookup read the provider again (%d reads), err %v", p.reads.Load(), err)
	}
	// A miss reads again at most once per MissRefresh.
	p.set("a", "b")
	if _, err := g.Function(ctx, "b"); !functions.IsUnknown(err) || p.reads.Load() != 1 {
		t.Fatalf("miss within MissRefresh: %v, %d reads", err, p.reads.Load())
	}
	now = now.Add(2 * time.Second)
	if _, err := g.Function(ctx, "b"); err != nil || p.reads.Load() != 2 {
		t.Fatalf("miss after MissRefresh: %v, %d reads", err, p.reads.Load())
	}
	// The provider is down: cached entries are served however old; unknown names give an error that is not
	// ErrUnknownFunction (the caller should not give up on the message).
	p.down.Store(true)
	now = now.Add(time.Minute)
	if _, err := g.Function(ctx, "a"); err != nil {
		t.Fatalf("stale entry while the provider is down: %v", err)
	}
	if _, err := g.Function(ctx, "c"); err == nil || functions.IsUnknown(err) {
		t.Fatalf("unknown name while the provider is down: %v", err)
	}
	p.down.Store(false)
	list, err := g.Functions(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("Functions = %v, %v", list, err)
	}
}

func TestGatewayBasicAuth(t *testing.T) {
	p := &provider{user: "admin"}
	p.set("a")
	srv := httptest.NewServer(p)
	defer srv.Close()
	if _, err := functions.NewGateway(functions.GatewayConfig{URL: srv.URL}).Function(context.Background(), "a"); err == nil ||
		functions.IsUnknown(err) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("without credentials: %v, want a 401 error", err)
	}
	g := functions.NewGateway(functions.GatewayConfig{URL: srv.URL, Username: "admin", Password: "secret"})
	if _, err := g.Function(context.Background(), "a"); err != nil {
		t.Fatalf("with credentials: %v", err)
	}
}
