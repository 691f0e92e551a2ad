package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// secureAPI is the API with authentication for a two-GPU FCFS pool, served with its connection hooks on a Unix
// socket.
type secureAPI struct {
	key  auth.Key
	pool *pool.FCFS
	srv  *api.Server
	sock string
	reg  *prometheus.Registry
}

func serveSecure(t *testing.T) *secureAPI {
	t.Helper()
	p, err := pool.NewFCFS([]pool.GPU{{Name: "gpu0", MemoryBytes: 4 << 30}, {Name: "gpu1", MemoryBytes: 4 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := api.New(p, reg, reg, nil, api.WithAuth(key))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "gpuserver.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := srv.NewHTTPServer()
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { _ = hs.Close() })
	return &secureAPI{key: key, pool: p, srv: srv, sock: sock, reg: reg}
}

func (a *secureAPI) client(token string) *client.Client {
	return client.New(a.sock, client.WithToken(token))
}

// TestCredentialsGuardEveryChange: registration and deregistration take the administrator's
// credential (or a ticket for exactly the spec registered), acquire takes the function's own token, release only
// touches the caller's own bindings, and binding ids are random.
func TestCredentialsGuardEveryChange(t *testing.T) {
	ctx := context.Background()
	a := serveSecure(t)
	admin := a.client(a.key.AdminToken())
	anon := a.client("")
	spec := pool.FunctionSpec{Name: "victim", MemoryBytes: 1 << 30}

	for _, c := range []struct {
		name string
		cl   *client.Client
		want error
	}{
		{"no credential", anon, auth.ErrUnauthenticated},
		{"a made-up token", a.client("0123"), auth.ErrForbidden},
		{"another function's token", a.client(a.key.FunctionToken("attacker")), auth.ErrForbidden},
		{"the function's own token", a.client(a.key.FunctionToken("victim")), auth.ErrForbidden},
	} {
		if err := c.cl.Register(ctx, spec); !errors.Is(err, c.want) {
			t.Errorf("register with %s: %v, want %v", c.name, err, c.want)
		}
	}
	if st := a.pool.Status(ctx); len(st.Functions) != 0 {
		t.Fatalf("a refused registration registered: %+v", st.Functions)
	}
	tok, err := admin.RegisterToken(ctx, spec)
	if err != nil || tok != a.key.FunctionToken("victim") {
		t.Fatalf("register as administrator: %q %v", tok, err)
	}
	// A ticket registers exactly its spec: the same spec again, not a bigger one, not another function.
	ticket, err := a.key.Ticket(pool.FunctionSpec{Name: "self", MemoryBytes: 1 << 30, SLO: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	withTicket := a.client(ticket)
	if err := withTicket.Register(ctx, pool.FunctionSpec{Name: "self", MemoryBytes: 2 << 30, SLO: time.Second}); !errors.Is(err, auth.ErrForbidden) {
		t.Errorf("a ticket used for a bigger spec: %v", err)
	}
	if err := withTicket.Register(ctx, pool.FunctionSpec{Name: "victim", MemoryBytes: 1 << 30}); !errors.Is(err, auth.ErrForbidden) {
		t.Errorf("a ticket used for another function: %v", err)
	}
	if tok, err := withTicket.RegisterToken(ctx, pool.FunctionSpec{Name: "self", MemoryBytes: 1 << 30,
		SLO: time.Second, Percentile: contract.DefaultPercentile}); err != nil || tok != a.key.FunctionToken("self") {
		t.Fatalf("register with its ticket: %q %v", tok, err)
	}

	// Acquire: the function's own token only.
	attacker := a.client(a.key.FunctionToken("self"))
	if _, err := attacker.Acquire(ctx, "victim", time.Second); !errors.Is(err, auth.ErrForbidden) {
		t.Fatalf("acquire with another function's token: %v", err)
	}
	if _, err := anon.Acquire(ctx, "victim", time.Second); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("acquire without a credential: %v", err)
	}
	victim := a.client(tok)
	b, err := victim.Acquire(ctx, "victim", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := victim.Acquire(ctx, "victim", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	hexID := regexp.MustCompile(`^[0-9a-f]{32}$`)
	if !hexID.MatchString(b.ID) || !hexID.MatchString(b2.ID) || b.ID == b2.ID {
		t.Fatalf("binding ids %q and %q: want 128 random bits each", b.ID, b2.ID)
	}
	// Release: another function's binding is as unknown as a made-up one.
	if err := attacker.Release(ctx, b.ID); !errors.Is(err, pool.ErrUnknownBinding) {
		t.Fatalf("release of another function's binding: %v", err)
	}
	if err := anon.Release(ctx, b.ID); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("release without a credential: %v", err)
	}
	if err := victim.Release(ctx, b.ID); err != nil {
		t.Fatalf("release of its own binding: %v", err)
	}
	if err := admin.Release(ctx, b2.ID); err != nil {
		t.Fatalf("the administrator releases any binding: %v", err)
	}
	// Deregistration: the administrator only.
	for _, cl := range []*client.Client{anon, victim, withTicket} {
		if err := cl.Deregister(ctx, "victim"); !errors.Is(err, auth.ErrUnauthenticated) &&
			!errors.Is(err, auth.ErrForbidden) {
			t.Fatalf("deregister without the administrator's credential: %v", err)
		}
	}
	if err := admin.Deregister(ctx, "victim"); err != nil {
		t.Fatal(err)
	}
	// Reading the pool takes a credential too (TestReadAPIsAreScopedToTheCallersTenant: a function's sees its own
	// namespace only).
	if _, err := anon.Status(ctx); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("reading the pool without a credential: %v, want ErrUnauthenticated", err)
	}
	if _, err := admin.Status(ctx); err != nil {
		t.Fatal(err)
	}
}

// rawAcquire sends an acquire on a connection of its own and returns the connection (holding the lease).
func rawAcquire(t *testing.T, sock, function, token string) (net.Conn, pool.Binding) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://gpuserver/v1/functions/"+function+"/acquire", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b pool.Binding
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&b) != nil {
		t.Fatalf("acquire answered %d", resp.StatusCode)
	}
	return c, b
}

func running(ctx context.Context, p pool.Pool, function string) int {
	for _, f := range p.Status(ctx).Functions {
		if f.Name == function {
			return f.Running
		}
	}
	return -1
}

// TestBindingReleasedWhenItsConnectionCloses: a binding whose holder goes away (the
// connection that acquired it closes) is released, logged and counted; the GPU is free for the next request.
func TestBindingReleasedWhenItsConnectionCloses(t *testing.T) {
	ctx := context.Background()
	a := serveSecure(t)
	admin := a.client(a.key.AdminToken())
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 3 << 30}); err != nil {
		t.Fatal(err)
	}
	tok := a.key.FunctionToken("f")
	c1, _ := rawAcquire(t, a.sock, "f", tok)
	c2, b2 := rawAcquire(t, a.sock, "f", tok)
	if n := running(ctx, a.pool, "f"); n != 2 {
		t.Fatalf("%d running, want 2", n)
	}
	c1.Close()
	testkit.Eventually(t, 60*time.Second, "the binding of the closed connection released", func() bool { return running(ctx, a.pool, "f") == 1 })
	// The other connection's binding is untouched and released normally, on its own connection.
	req, _ := http.NewRequest(http.MethodPost, "http://gpuserver/v1/bindings/"+b2.ID+"/release", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	if err := req.Write(c2); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c2), req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("release on the holding connection: %v %v", resp, err)
	}
	c2.Close()
	if n := running(ctx, a.pool, "f"); n != 0 {
		t.Fatalf("%d running after both ended", n)
	}
	if got := metricValue(t, a.reg, "faas_gpu_binding_leases_expired_total"); got != 1 {
		t.Fatalf("leases expired: %v, want 1", got)
	}
}

// TestBindingReleasedWhenItsProcessIsKilled: the function process holding a binding is SIGKILLed mid-request;
// the kernel closes its connection and the gpuserver releases the binding, so the next request is served at
// once instead of waiting for a GPU that is held forever.
func TestBindingReleasedWhenItsProcessIsKilled(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	ctx := context.Background()
	a := serveSecure(t)
	// One GPU's worth: a second binding has to wait for the first.
	if err := a.client(a.key.AdminToken()).Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 3 << 30}); err != nil {
		t.Fatal(err)
	}
	tok := a.key.FunctionToken("f")
	proc := exec.Command("python3", "-c", `
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(("POST /v1/functions/f/acquire HTTP/1.1\r\nHost: gpuserver\r\nAuthorization: Bearer %s\r\n"
           "Content-Length: 0\r\n\r\n" % sys.argv[2]).encode())
print(s.recv(4096).split(b"\r\n")[0].decode(), flush=True)
sys.stdin.readline()
`, a.sock, tok)
	stdin, _ := proc.StdinPipe()
	stdout, _ := proc.StdoutPipe()
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "200") {
		t.Fatalf("the process's acquire: %q %v", line, err)
	}
	if n := running(ctx, a.pool, "f"); n != 1 {
		t.Fatalf("%d running", n)
	}
	_ = proc.Process.Signal(syscall.SIGKILL)
	_ = proc.Wait()
	_ = stdin.Close()
	testkit.Eventually(t, 60*time.Second, "the killed process's binding released", func() bool { return running(ctx, a.pool, "f") == 0 })
	b, err := a.client(tok).Acquire(ctx, "f", 10*time.Minute)
	if err != nil {
		t.Fatalf("the next request: %v", err)
	}
	if err := a.client(tok).Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
}

func metricValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}

// FuzzAPI sends arbitrary requests to the authenticated API: it must never panic, must answer every error as
// JSON with a status the API defines, and nothing without the administrator's credential may register or
// deregister a function. The seed corpus is below plus testdata/fuzz/FuzzAPI.
func FuzzAPI(f *testing.F) {
	f.Add("POST", "/v1/functions", `{"name":"f","memory_bytes":1024}`, uint8(0))
	f.Add("POST", "/v1/functions", `{"name":"f","memory_bytes":1024}`, uint8(1))
	f.Add("POST", "/v1/functions/f/acquire", `{"timeout_ms":1}`, uint8(2))
	f.Add("POST", "/v1/functions/f/acquire", `{"timeout_ms":9223372036854775807}`, uint8(2))
	f.Add("DELETE", "/v1/functions/f", ``, uint8(3))
	f.Add("POST", "/v1/bindings/b-1/release", ``, uint8(2))
	f.Add("GET", "/v1/pool", ``, uint8(0))
	f.Add("POST", "/v1/functions", `{"name":"../../x","memory_bytes":1}`, uint8(1))
	p, err := pool.NewFCFS([]pool.GPU{{Name: "gpu0", MemoryBytes: 1 << 30}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	key, err := auth.NewKey()
	if err != nil {
		f.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := api.New(p, reg, reg, nil, api.WithAuth(key))
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}); err != nil {
		f.Fatal(err)
	}
	known := map[int]bool{200: true, 204: true, 400: true, 401: true, 403: true, 404: true, 405: true,
		422: true, 429: true, 500: true, 503: true, 504: true}
	f.Fuzz(func(t *testing.T, method, path, body string, who uint8) {
		if !validMethod(method) || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " #?%") ||
			strings.IndexFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
			return // not a request line an HTTP server would pass on
		}
		if _, err := url.ParseRequestURI(path); err != nil {
			return
		}
		req := httptest.NewRequest(method, "http://gpuserver"+path, strings.NewReader(body))
		switch who % 4 {
		case 1:
			req.Header.Set("Authorization", "Bearer "+key.AdminToken())
		case 2:
			req.Header.Set("Authorization", "Bearer "+key.FunctionToken("f"))
		case 3:
			req.Header.Set("Authorization", "Bearer "+body)
		}
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		before := names(p.Status(ctx))
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req.WithContext(ctx))
		if !known[rec.Code] {
			t.Fatalf("%s %s: status %d", method, path, rec.Code)
		}
		if rec.Code >= 400 && rec.Code != 404 && rec.Code != 405 {
			var e api.ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error == "" {
				t.Fatalf("%s %s: %d with body %q", method, path, rec.Code, rec.Body.String())
			}
		}
		if rec.Code == http.StatusOK && strings.HasSuffix(path, "/acquire") { // free the GPU for the next input
			var b pool.Binding
			if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
				t.Fatalf("acquire answered %q", rec.Body.String())
			}
			rel := httptest.NewRequest(http.MethodPost, "http://gpuserver/v1/bindings/"+b.ID+"/release", nil)
			rel.Header.Set("Authorization", "Bearer "+key.AdminToken())
			rr := httptest.NewRecorder()
			srv.ServeHTTP(rr, rel)
			if rr.Code != http.StatusNoContent {
				t.Fatalf("release of a fuzzed acquire: %d %s", rr.Code, rr.Body.String())
			}
		}
		if after := names(p.Status(ctx)); who%4 != 1 && after != before {
			t.Fatalf("%s %s without the administrator's credential changed the functions: %s -> %s", method, path,
				before, after)
		}
		// Keep the pool in its starting shape for the next input.
		for _, fs := range p.Status(ctx).Functions {
			if fs.Name != "f" {
				_ = p.Deregister(ctx, fs.Name)
			}
		}
		_ = p.Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20})
	})
}

func validMethod(m string) bool {
	switch m {
	case "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS":
		return true
	}
	return false
}

func names(st pool.Status) string {
	var out []string
	for _, f := range st.Functions {
		out = append(out, fmt.Sprintf("%s/%d", f.Name, f.MemoryBytes))
	}
	return strings.Join(out, ",")
}
