package shrinkwrap

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// running polls the gpuserver until the function has want requests running (bindings held) and served in all.
func running(t *testing.T, gs *client.Client, want int, served int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := gs.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Functions) == 1 && st.Functions[0].Running == want && st.Functions[0].Served == served {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool: %+v, want %d running and %d served", st.Functions, want, served)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestEntrypointStreamsAGenerator: a handler that returns a generator is streamed as it yields (the first event
// reaches the client while the generator waits), directly and through a standard library reverse proxy set up as
// the OpenFaaS gateway's and of-watchdog's event-stream path are (no flush interval: Go's proxy flushes a
// text/event-stream response at once); the GPU binding is held until the stream ends.
func TestEntrypointStreamsAGenerator(t *testing.T) {
	sock := gpuServer(t)
	gs := client.New(sock)
	if err := gs.Register(context.Background(), pool.FunctionSpec{Name: "edge", MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock,
		contract.EnvAcquireTimeoutMS+"=2000")
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }})
	t.Cleanup(proxy.Close)

	var served int64
	for _, via := range []struct{ name, base string }{{"direct", base}, {"reverse proxy", proxy.URL}} {
		gate := filepath.Join(t.TempDir(), "gate")
		resp, err := http.Get(via.base + "/?stream=3&gate=" + url.QueryEscape(gate))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
			resp.ContentLength != -1 {
			t.Fatalf("%s: %d %v (length %d)", via.name, resp.StatusCode, resp.Header, resp.ContentLength)
		}
		r := bufio.NewReader(resp.Body)
		first, err := r.ReadString('\n')
		if err != nil || first != "data: 0\n" {
			t.Fatalf("%s: first event %q, %v", via.name, first, err)
		}
		running(t, gs, 1, served) // the binding is held while the generator has not ended
		if err := os.WriteFile(gate, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(r)
		resp.Body.Close()
		if err != nil || string(rest) != "\ndata: 1\n\ndata: 2\n\n" {
			t.Fatalf("%s: rest of the stream %q, %v", via.name, rest, err)
		}
		served++
		running(t, gs, 0, served)
	}

	// A generator of dicts is JSON lines, with the tuple's status and headers.
	code, hdr, out := call(t, http.MethodGet, base+"/?lines=2", nil, nil)
	if code != 201 || hdr.Get("X-Lines") != "yes" || string(out) != "{\"i\": 0}\n{\"i\": 1}\n" {
		t.Fatalf("JSON lines: %d %v %q", code, hdr, out)
	}
	served++
	var first map[string]int
	if err := json.Unmarshal([]byte(strings.SplitN(string(out), "\n", 2)[0]), &first); err != nil || first["i"] != 0 {
		t.Fatalf("first line %v", err)
	}
	running(t, gs, 0, served)
}

// TestEntrypointStreamEndsIncompleteWhenTheHandlerRaises: a generator that raises after its first event ends the
// response without the final chunk, so the client reads an error, never a complete response; the binding is
// released.
func TestEntrypointStreamEndsIncompleteWhenTheHandlerRaises(t *testing.T) {
	sock := gpuServer(t)
	gs := client.New(sock)
	if err := gs.Register(context.Background(), pool.FunctionSpec{Name: "edge", MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock)
	resp, err := http.Get(base + "/?stream=3&raise_at=1")
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(out) != "data: 0\n\n" {
		t.Fatalf("raising stream: %q, %v; want the first event and io.ErrUnexpectedEOF", out, err)
	}
	running(t, gs, 0, 1)
}

// TestEntrypointStopsAStreamWhenTheClientGoesAway: a client that closes its connection mid-stream makes the
// entrypoint close the generator (its finally block runs) and release the binding, while the generator would
// otherwise wait.
func TestEntrypointStopsAStreamWhenTheClientGoesAway(t *testing.T) {
	sock := gpuServer(t)
	gs := client.New(sock)
	if err := gs.Register(context.Background(), pool.FunctionSpec{Name: "edge", MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock)
	dir := t.TempDir()
	gate, closed := filepath.Join(dir, "gate"), filepath.Join(dir, "closed")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(base + "/?stream=100&gate=" + url.QueryEscape(gate) + "&closed=" +
		url.QueryEscape(closed))
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || line != "data: 0\n" {
		t.Fatalf("first event %q, %v", line, err)
	}
	running(t, gs, 1, 0)
	resp.Body.Close() // the connection goes away: the transport does not reuse a connection with a body unread
	// The generator waits on the gate; opening it lets it yield once more, and the entrypoint notices the client
	// left before writing.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	running(t, gs, 0, 1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(closed); err == nil && string(b) == "closed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the generator was not closed when the client went away")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
