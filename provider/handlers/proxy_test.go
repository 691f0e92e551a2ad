package handlers

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
)

// upstreamBackend resolves every known function to one upstream server (faas-provider's proxy tests do the same
// with httptest); everything else of provider.Backend is unused by the proxy.
type upstreamBackend struct {
	provider.Backend
	upstream *url.URL
	ready    bool
	desired  uint64 // replicas Status reports
}

func (b upstreamBackend) Status(_ context.Context, ns, name string) (types.FunctionStatus, error) {
	if name != "fn" {
		return types.FunctionStatus{}, fmt.Errorf("%w: function %q", provider.ErrNotFound, name)
	}
	return types.FunctionStatus{Name: name, Namespace: ns, Replicas: b.desired}, nil
}

func (b upstreamBackend) Namespaces(context.Context) ([]string, error) {
	return []string{provider.DefaultNamespace}, nil
}

func (b upstreamBackend) Resolve(_ context.Context, _, name string) (*url.URL, error) {
	switch {
	case name != "fn":
		return nil, fmt.Errorf("%w: function %q", provider.ErrNotFound, name)
	case !b.ready:
		return nil, fmt.Errorf("%w: function %q", provider.ErrNotReady, name)
	}
	u := *b.upstream
	return &u, nil
}

func serve(t testing.TB, h http.Handler, method, path string, body any) (int, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := &fixture{srv: srv}
	code, _, out := f.do(t, method, path, body)
	return code, out
}

func TestProxySemantics(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
				<-time.After(10 * time.Millisecond)
			}
			<-r.Context().Done() // hold the stream open until the client leaves
			return
		case "/slow":
			<-r.Context().Done()
			return
		case "/notype":
			w.Header()["Content-Type"] = nil
			_, _ = w.Write([]byte("x"))
			return
		}
		w.Header().Set("X-Seen-Path", r.URL.Path)
		w.Header().Set("X-Seen-Query", r.URL.RawQuery)
		w.Header().Set("X-Seen-Header", r.Header.Get("X-Custom"))
		w.Header().Set("X-Seen-Forwarded-Host", r.Header.Get("X-Forwarded-Host"))
		w.Header().Set("X-Seen-Method", r.Method)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(body)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	// A generous proxy timeout for every request that must succeed, however loaded the machine; the timeout case
	// below has a server of its own with a short one (its upstream never answers, so only the bound decides).
	h := New(Config{Backend: upstreamBackend{upstream: u, ready: true}, ProxyTimeout: time.Minute})
	srv := httptest.NewServer(h)
	defer srv.Close()
	short := httptest.NewServer(New(Config{Backend: upstreamBackend{upstream: u, ready: true}, ProxyTimeout: 200 * time.Millisecond}))
	defer short.Close()

	for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		req, _ := http.NewRequest(method, srv.URL+"/function/fn/a/b?x=1&y=2", strings.NewReader("payload"))
		req.Header.Set("X-Custom", "kept")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTeapot || string(body) != "payload" || resp.Header.Get("X-Seen-Path") != "/a/b" ||
			resp.Header.Get("X-Seen-Query") != "x=1&y=2" || resp.Header.Get("X-Seen-Header") != "kept" ||
			resp.Header.Get("X-Seen-Method") != method || resp.Header.Get("X-Seen-Forwarded-Host") == "" ||
			resp.Header.Get(InternalHeader) != "" {
			t.Errorf("%s: %d %q %v", method, resp.StatusCode, body, resp.Header)
		}
	}
	// The bare function path reaches the upstream's root.
	resp, err := http.Get(srv.URL + "/function/fn")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("X-Seen-Path") != "/" {
		t.Errorf("bare path reached %q", resp.Header.Get("X-Seen-Path"))
	}

	// Content-Type falls back to the request's.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/fn/notype", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/x-test")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-test" {
		t.Errorf("Content-Type fallback = %q", ct)
	}

	// Streaming: events arrive before the upstream finishes.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/function/fn/stream", nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	var events int
	for events < 3 && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			events++
		}
	}
	cancel()
	resp.Body.Close()
	if events != 3 {
		t.Errorf("streamed %d events before the upstream finished, want 3", events)
	}

	// Timeout: 504 tagged as the proxy's own.
	resp, err = http.Get(short.URL + "/function/fn/slow")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(InternalHeader) == "" {
		t.Errorf("slow function: %d %v", resp.StatusCode, resp.Header)
	}

	// Unknown function 404, unknown namespace 400, both tagged.
	for path, want := range map[string]int{"/function/nope": 404, "/function/fn.prod": 400} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || resp.Header.Get(InternalHeader) == "" {
			t.Errorf("%s: %d (internal %q), want %d tagged", path, resp.StatusCode, resp.Header.Get(InternalHeader), want)
		}
	}
}

func TestProxyNotReadyAndUnreachable(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	u, _ := url.Parse(dead.URL)
	dead.Close() // nothing listens there any more

	for _, tt := range []struct {
		ready   bool
		desired uint64
		want    int
	}{
		{false, 0, http.StatusServiceUnavailable}, // scaled to zero: at once
		{false, 1, http.StatusServiceUnavailable}, // starting: after ReadyTimeout
		{true, 1, http.StatusBadGateway},
	} {
		h := New(Config{Backend: upstreamBackend{upstream: u, ready: tt.ready, desired: tt.desired},
			ReadyTimeout: 100 * time.Millisecond})
		srv := httptest.NewServer(h)
		resp, err := http.Post(srv.URL+"/function/fn", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tt.want || resp.Header.Get(InternalHeader) != "proxy" || !strings.Contains(string(body), "fn") {
			t.Errorf("ready=%v: %d %q (internal %q), want %d tagged", tt.ready, resp.StatusCode, body,
				resp.Header.Get(InternalHeader), tt.want)
		}
	}
}

// TestProxyPassesRetryAfter: a function's 429 with Retry-After (its gpuserver's overload control refused the
// request) reaches the caller with the header, not tagged as the proxy's own answer.
func TestProxyPassesRetryAfter(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "2")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":"node overloaded"}`))
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	srv := httptest.NewServer(New(Config{Backend: upstreamBackend{upstream: u, ready: true}, ProxyTimeout: time.Minute}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/function/fn", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" ||
		resp.Header.Get(InternalHeader) != "" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
}
