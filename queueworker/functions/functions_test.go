package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
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
		// A function deployed with the dead letters' name before validation existed does not
		// make the worker consume its dead letters.
		{"reserved queue ignored", map[string]string{"com.openfaas.queue": "faas-dead-letter"}, functions.Function{Name: "f", Queue: "faas-request", Percentile: 98}},
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

// catalog is a Catalog over fixed namespaces, counting reads; the default namespace is "openfaas-fn".
type catalog struct {
	mu    sync.Mutex
	fns   map[string][]string // namespace -> function names
	reads map[string]int
}

func (c *catalog) List(_ context.Context, ns string) ([]types.FunctionStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns == "" {
		ns = "openfaas-fn"
	}
	c.reads[ns]++
	names, ok := c.fns[ns]
	if !ok {
		return nil, fmt.Errorf("%w: %s", functions.ErrUnknownNamespace, ns)
	}
	var out []types.FunctionStatus
	for _, n := range names {
		ann := map[string]string{"com.openfaas.queue": "q-" + ns}
		out = append(out, types.FunctionStatus{Name: n, Namespace: ns, Annotations: &ann})
	}
	return out, nil
}

func (c *catalog) Namespaces(context.Context) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for ns := range c.fns {
		out = append(out, ns)
	}
	return out, nil
}

// "name.namespace" is looked up in that namespace; in the default namespace it is the same
// function as "name" (one canonical name); an unknown namespace holds no function.
func TestCacheNamespaces(t *testing.T) {
	ctx := context.Background()
	cat := &catalog{fns: map[string][]string{"openfaas-fn": {"echo"}, "dev": {"echo", "only-dev"}}, reads: map[string]int{}}
	c := functions.NewCache(functions.CacheConfig{Catalog: cat})
	for ref, want := range map[string]functions.Function{
		"echo":             {Name: "echo", Queue: "q-openfaas-fn", Percentile: 98},
		"echo.openfaas-fn": {Name: "echo", Queue: "q-openfaas-fn", Percentile: 98},
		"echo.dev":         {Name: "echo.dev", Queue: "q-dev", Percentile: 98},
		"only-dev.dev":     {Name: "only-dev.dev", Queue: "q-dev", Percentile: 98},
	} {
		got, err := c.Function(ctx, ref)
		if err != nil || got != want {
			t.Errorf("Function(%q) = %+v, %v; want %+v", ref, got, err, want)
		}
	}
	for _, ref := range []string{"only-dev", "only-dev.openfaas-fn", "echo.nowhere", "echo/../x"} {
		if _, err := c.Function(ctx, ref); !functions.IsUnknown(err) {
			t.Errorf("Function(%q) = %v, want ErrUnknownFunction", ref, err)
		}
	}
	if cat.reads["nowhere"] != 0 {
		t.Errorf("a namespace the catalog does not list was read %d times", cat.reads["nowhere"])
	}
	fns, err := c.Functions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fns {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if want := []string{"echo", "echo.dev", "only-dev.dev"}; !slices.Equal(names, want) {
		t.Errorf("Functions = %v, want %v (each function once, every namespace)", names, want)
	}
}

// The gateway catalog: a namespaced listing the gateway refuses is an unknown namespace; credentials go only to the
// gateway's /system/ routes.
func TestGatewayNamespaces(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, pw, ok := r.BasicAuth(); !ok || u != "admin" || pw != "secret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch ns := r.URL.Query().Get("namespace"); {
		case r.URL.Path == "/system/namespaces":
			_, _ = io.WriteString(w, `["openfaas-fn","dev"]`)
		case r.URL.Path != "/system/functions":
			http.NotFound(w, r)
		case ns == "" || ns == "openfaas-fn":
			_, _ = io.WriteString(w, `[{"name":"echo","namespace":"openfaas-fn"}]`)
		case ns == "dev":
			_, _ = io.WriteString(w, `[{"name":"gpu","namespace":"dev","annotations":{"com.openfaas.gpu.memory":"1Gi"}}]`)
		default:
			http.Error(w, "namespace not allowed", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	g := functions.NewGateway(functions.GatewayConfig{URL: srv.URL, Username: "admin", Password: "secret"})
	ctx := context.Background()
	if f, err := g.Function(ctx, "echo.openfaas-fn"); err != nil || f.Name != "echo" {
		t.Fatalf("echo.openfaas-fn: %+v %v", f, err)
	}
	if f, err := g.Function(ctx, "gpu.dev"); err != nil || f.Name != "gpu.dev" || !f.GPU {
		t.Fatalf("gpu.dev: %+v %v", f, err)
	}
	if _, err := g.Function(ctx, "echo.prod"); !functions.IsUnknown(err) {
		t.Fatalf("echo.prod: %v, want unknown", err)
	}
}

// A catalog in this process is read again on every miss (MissRefresh < 0): a function deployed a moment before its
// first asynchronous call is found (the e2e test deploys and calls at once); a known default namespace makes
// "echo" and "echo.openfaas-fn" one function from the first lookup.
func TestCacheReadsAgainOnEveryMiss(t *testing.T) {
	ctx := context.Background()
	cat := &catalog{fns: map[string][]string{"openfaas-fn": {}}, reads: map[string]int{}}
	now := time.Unix(1000, 0)
	c := functions.NewCache(functions.CacheConfig{Catalog: cat, MissRefresh: -1, DefaultNamespace: "openfaas-fn",
		Now: func() time.Time { return now }})
	if _, err := c.Functions(ctx); err != nil { // the worker's queue discovery, before the deploy
		t.Fatal(err)
	}
	cat.mu.Lock()
	cat.fns["openfaas-fn"] = []string{"echo"}
	cat.mu.Unlock()
	for _, ref := range []string{"echo.openfaas-fn", "echo"} {
		if f, err := c.Function(ctx, ref); err != nil || f.Name != "echo" {
			t.Fatalf("Function(%q) right after the deploy = %+v, %v; want echo", ref, f, err)
		}
	}
}
