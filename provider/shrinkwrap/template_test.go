package shrinkwrap

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// startEntrypoint runs the gpu-python template's index.py with the edge handler as a real process and returns its
// base URL.
func startEntrypoint(t *testing.T, env ...string) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	dir := filepath.Join(t.TempDir(), "edge")
	if err := Assemble(filepath.Join(repo, "template", "gpu-python"), filepath.Join("testdata", "edge"), dir); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command("python3", "index.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append(env, "PORT="+strconv.Itoa(port), "PYTHONDONTWRITEBYTECODE=1")...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second): // generous: only a process that ignores SIGTERM takes this long
			_ = cmd.Process.Kill()
			<-exited
			t.Error("index.py did not stop on SIGTERM")
		}
	})
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(60 * time.Second) // generous: python starts slowly on a loaded machine
	for {
		resp, err := http.Get(base + "/_/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base
			}
		}
		select {
		case <-exited:
			t.Fatalf("index.py exited: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("index.py never became healthy: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func call(t *testing.T, method, u string, body io.Reader, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out
}

type edgeReply struct {
	Len    int            `json:"len"`
	Method string         `json:"method"`
	Path   string         `json:"path"`
	Multi  []string       `json:"multi"`
	Header string         `json:"header"`
	GPU    map[string]any `json:"gpu"`
}

func TestEntrypointRequestsAndResponses(t *testing.T) {
	base := startEntrypoint(t)

	code, hdr, out := call(t, http.MethodPut, base+"/a/b?m=1&m=2", strings.NewReader("12345"), map[string]string{"X-Test": "v"})
	var r edgeReply
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if code != 202 || hdr.Get("X-Handler") != "yes" || hdr.Get("Content-Type") != "application/json" || r.Len != 5 ||
		r.Method != "PUT" || r.Path != "/a/b" || fmt.Sprint(r.Multi) != "[1 2]" || r.Header != "v" || r.GPU != nil {
		t.Errorf("dict response: %d %v %+v", code, hdr, r)
	}

	// A chunked request body (what the proxy sends for a stream of unknown length).
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("chunk-one,"))
		_, _ = pw.Write([]byte("chunk-two"))
		_ = pw.Close()
	}()
	_, _, out = call(t, http.MethodPost, base+"/", pr, nil)
	if err := json.Unmarshal(out, &r); err != nil || r.Len != len("chunk-one,chunk-two") {
		t.Errorf("chunked body: %s (%v)", out, err)
	}

	for q, want := range map[string]struct {
		code int
		body string
	}{
		"tuple=1": {201, "tuple body"},
		"bytes=1": {200, "\x00\x01"},
		"str=1":   {200, "plain"},
	} {
		code, _, out := call(t, http.MethodGet, base+"/?"+q, nil, nil)
		if code != want.code || string(out) != want.body {
			t.Errorf("%s: %d %q, want %d %q", q, code, out, want.code, want.body)
		}
	}

	code, _, out = call(t, http.MethodGet, base+"/?raise=1", nil, nil)
	if code != 500 || !strings.Contains(string(out), `"error"`) {
		t.Errorf("raising handler: %d %s", code, out)
	}
	code, _, out = call(t, http.MethodHead, base+"/", nil, nil)
	if code != 202 || len(out) != 0 {
		t.Errorf("HEAD: %d %q", code, out)
	}
}

// gpuServer runs the real gpuserver API over a one-GPU first-come-first-served pool on a Unix socket.
func gpuServer(t *testing.T) string {
	t.Helper()
	p, err := pool.NewFCFS([]pool.GPU{{Name: "Tesla V100-SXM2-32GB (simulated)", MemoryBytes: 32 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveAPI(t, p)
}

// serveAPI runs the real gpuserver API over p on a Unix socket and returns its path.
func serveAPI(t *testing.T, p pool.Pool) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpus")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "gpuserver.sock")
	reg := prometheus.NewRegistry()
	h, err := api.New(p, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

func TestEntrypointBindsEachRequestToAGPU(t *testing.T) {
	sock := gpuServer(t)
	gs := client.New(sock)
	ctx := context.Background()
	if err := gs.Register(ctx, pool.FunctionSpec{Name: "edge", MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock,
		contract.EnvAcquireTimeoutMS+"=2000")

	_, _, out := call(t, http.MethodPost, base+"/", strings.NewReader("x"), nil)
	var r edgeReply
	if err := json.Unmarshal(out, &r); err != nil || r.GPU == nil || r.GPU["gpu"] != float64(0) || r.GPU["id"] == "" ||
		!strings.Contains(fmt.Sprint(r.GPU["gpu_name"]), "simulated") {
		t.Fatalf("GPU request: %s (%v)", out, err)
	}
	// The binding is released even when the handler raises.
	if code, _, _ := call(t, http.MethodGet, base+"/?raise=1", nil, nil); code != 500 {
		t.Errorf("raising handler answered %d", code)
	}
	st, err := gs.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Functions) != 1 || st.Functions[0].Running != 0 || st.Functions[0].Served != 2 {
		t.Errorf("pool after two requests: %+v, want 2 served and none running", st.Functions)
	}

	// Unknown to the gpuserver: the gpuserver's status and a JSON error, and the handler does not run.
	if err := gs.Deregister(ctx, "edge"); err != nil {
		t.Fatal(err)
	}
	code, _, out := call(t, http.MethodPost, base+"/", nil, nil)
	if code != 404 || !strings.Contains(string(out), `"error"`) || strings.Contains(string(out), "method") {
		t.Errorf("unregistered function: %d %s", code, out)
	}
}

func TestEntrypointWithoutGPUServer(t *testing.T) {
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"=/nonexistent/gpuserver.sock")
	code, _, out := call(t, http.MethodPost, base+"/", nil, nil)
	if code != 503 || !strings.Contains(string(out), "unreachable") {
		t.Errorf("no gpuserver: %d %s, want 503 saying it is unreachable", code, out)
	}
}

func TestEntrypointRegistersItselfWhenAsked(t *testing.T) {
	sock := gpuServer(t)
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock, contract.EnvSelfRegister+"=1",
		contract.EnvMemoryBytes+"=1610612736", contract.EnvSLO+"=80ms", contract.EnvPercentile+"=99",
		contract.EnvIsolation+"=isolated")
	st, err := client.New(sock).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Functions) != 1 {
		t.Fatalf("registered functions: %+v", st.Functions)
	}
	f := st.Functions[0]
	if f.Name != "edge" || f.MemoryBytes != 1536<<20 || f.SLO != 80*time.Millisecond || f.Percentile != 99 ||
		f.Isolation != pool.IsolationIsolated {
		t.Fatalf("self-registered spec: %+v", f.FunctionSpec)
	}
	// A gpuserver that forgot the function (it restarted) gets it registered again by the next request.
	if err := client.New(sock).Deregister(context.Background(), "edge"); err != nil {
		t.Fatal(err)
	}
	if code, _, out := call(t, http.MethodPost, base+"/", strings.NewReader("x"), nil); code >= 300 || !strings.Contains(string(out), `"gpu": {`) {
		t.Fatalf("request after the gpuserver forgot the function: %d %s", code, out)
	}
	st, err = client.New(sock).Status(context.Background())
	if err != nil || len(st.Functions) != 1 || st.Functions[0].Served != 1 || st.Functions[0].SLO != 80*time.Millisecond {
		t.Fatalf("after re-registration: %+v %v", st.Functions, err)
	}
}

// failingPool is the controller's pool on a real gpuserver API with a GPU that fails while the next binding is
// held (set failNext): the failure is injected as the executors report one, through SetHealthy.
type failingPool struct {
	*controller.Pool
	failNext atomic.Bool
}

func (p *failingPool) Acquire(ctx context.Context, function string) (pool.Binding, error) {
	b, err := p.Pool.Acquire(ctx, function)
	if err == nil && p.failNext.CompareAndSwap(true, false) {
		err = p.SetHealthy(b.GPU, false)
	}
	return b, err
}

// TestEntrypointAnswers503WhenTheGPUFailsUnderTheHandler: the handler ran, but its GPU failed while the binding
// was held, so its result may be wrong: the release answers 503 and the entrypoint answers 503 with the
// gpuserver's message instead of the handler's output. Once the GPU is back, requests are answered as before.
func TestEntrypointAnswers503WhenTheGPUFailsUnderTheHandler(t *testing.T) {
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controller.NewPool(controller.PoolConfig{Controller: controller.Config{Node: node}})
	if err != nil {
		t.Fatal(err)
	}
	p := &failingPool{Pool: cp}
	sock := serveAPI(t, p)
	ctx := context.Background()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "edge", MemoryBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock,
		contract.EnvAcquireTimeoutMS+"=2000")
	if code, _, out := call(t, http.MethodPost, base+"/", strings.NewReader("x"), nil); code != 202 {
		t.Fatalf("request on a healthy GPU: %d %s", code, out)
	}

	p.failNext.Store(true)
	code, _, out := call(t, http.MethodPost, base+"/", strings.NewReader("x"), nil)
	if code != 503 || !strings.Contains(string(out), "GPU unhealthy") || strings.Contains(string(out), "method") {
		t.Fatalf("request whose GPU failed under the handler: %d %s, want 503 with the gpuserver's message", code, out)
	}
	st := p.Status(ctx)
	if st.GPUs[0].Healthy || st.Functions[0].Running != 0 || st.Functions[0].Served != 2 {
		t.Fatalf("pool after the broken request: %+v %+v", st.GPUs, st.Functions)
	}

	if err := p.SetHealthy(0, true); err != nil {
		t.Fatal(err)
	}
	var r edgeReply
	code, _, out = call(t, http.MethodPost, base+"/", strings.NewReader("x"), nil)
	if err := json.Unmarshal(out, &r); code != 202 || err != nil || r.GPU == nil || r.GPU["gpu"] != float64(0) {
		t.Fatalf("request once the GPU is back: %d %s (%v)", code, out, err)
	}
}

// TestEntrypointRefusesOversizedBodies: a body beyond FAAS_GPU_MAX_BODY_BYTES is refused with 413 before it is
// read, whether its length is announced or chunked; a negative length is 400.
func TestEntrypointRefusesOversizedBodies(t *testing.T) {
	base := startEntrypoint(t, contract.EnvMaxBodyBytes+"=1024")
	if code, _, out := call(t, http.MethodPost, base+"/", strings.NewReader(strings.Repeat("x", 1024)), nil); code != 202 {
		t.Fatalf("a body at the limit: %d %s", code, out)
	}
	code, _, out := call(t, http.MethodPost, base+"/", strings.NewReader(strings.Repeat("x", 1025)), nil)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(string(out), "FAAS_GPU_MAX_BODY_BYTES") {
		t.Errorf("a body over the limit: %d %s, want 413 naming FAAS_GPU_MAX_BODY_BYTES", code, out)
	}
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 4; i++ {
			if _, err := pw.Write([]byte(strings.Repeat("y", 512))); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	if code, _, out := call(t, http.MethodPost, base+"/", pr, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked body over the limit: %d %s, want 413", code, out)
	}
	_ = pr.Close()
	u, _ := url.Parse(base)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
	_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(line, " 400 ") {
		t.Errorf("a negative Content-Length: %q %v, want 400", line, err)
	}
}

// refusingPool refuses every acquire as the overload control refuses a shed function's request that cannot meet
// its deadline.
type refusingPool struct{ pool.Pool }

func (refusingPool) Acquire(_ context.Context, function string) (pool.Binding, error) {
	return pool.Binding{}, &pool.OverloadedError{Function: function, RetryAfter: 2 * time.Second, Episode: 1,
		Reason: "the node sheds it"}
}

// TestEntrypointPassesRetryAfterOn429: a request the gpuserver's overload control refuses is answered 429 with the
// gpuserver's Retry-After, so that the provider's proxy, a router or the queue worker can retry it later or
// elsewhere; the handler does not run.
func TestEntrypointPassesRetryAfterOn429(t *testing.T) {
	fcfs, err := pool.NewFCFS([]pool.GPU{{Name: "Tesla V100-SXM2-32GB (simulated)", MemoryBytes: 32 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sock := serveAPI(t, refusingPool{fcfs})
	base := startEntrypoint(t, contract.EnvGPU+"=1", contract.EnvFunction+"=edge", contract.EnvSocket+"="+sock,
		contract.EnvAcquireTimeoutMS+"=2000")
	for range 2 {
		code, hdr, out := call(t, http.MethodPost, base+"/", strings.NewReader("x"), nil)
		if code != 429 || hdr.Get("Retry-After") != "2" || !strings.Contains(string(out), "node overloaded") ||
			strings.Contains(string(out), "method") {
			t.Fatalf("refused request: %d Retry-After %q %s", code, hdr.Get("Retry-After"), out)
		}
	}
}
