// Package e2e runs the real faas-gpu binary (`faas-gpu up`) and drives it over HTTP exactly as faas-cli and the
// OpenFaaS gateway would: deploy, invoke synchronously and asynchronously, list, scale, logs, secrets, delete,
// restart.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// repoRoot is the repository's root, two folders up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildBinary compiles bin/faas-gpu into a temp dir once per test binary.
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "faas-gpu-e2e-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "faas-gpu")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/faas-gpu")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// shimDir builds the shim (make is incremental) and returns the folder holding libcuda.so.1.
func shimDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "shim")
	if out, err := exec.Command("make", "-s", "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}
	return filepath.Join(dir, "build")
}

// instance is one running `faas-gpu up`.
type instance struct {
	cmd      *exec.Cmd
	url      string
	stateDir string
	out      *testkit.Buffer
	done     chan struct{}
	// user and password are the basic-auth credentials up created in <state-dir>/secrets (faas-cli login).
	user, password string
}

// system sends a /system request exactly as faas-cli 0.18.12 does after `faas-cli login` (proxy/client.go
// newRequest): the body as JSON with Content-Type application/json, and basic auth.
func (in *instance) system(t *testing.T, method, path string, body any) reply {
	t.Helper()
	h := map[string]string{"Authorization": basicAuth(in.user, in.password)}
	if body != nil {
		h["Content-Type"] = "application/json"
	}
	return call(t, method, in.url+path, body, h)
}

func basicAuth(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// templateFprocess is the fprocess of ./template/gpu-python/template.yml, which faas-cli deploy sends as envProcess.
func templateFprocess(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "template", "gpu-python", "template.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "fprocess:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("template.yml has no fprocess")
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startUp runs `faas-gpu up` on a free port with the given state dir (and extra flags) and waits until the gateway
// answers.
func startUp(t *testing.T, stateDir string, extra ...string) *instance {
	t.Helper()
	return startUpUnder(t, stateDir, nil, extra...)
}

// startUpUnder is startUp with up started by a wrapper command (wrap, then up's argv), e.g. a shell that lowers
// its open-file limit first.
func startUpUnder(t *testing.T, stateDir string, wrap []string, extra ...string) *instance {
	t.Helper()
	root := repoRoot(t)
	args := []string{"--state-dir", stateDir,
		"--build-dir", filepath.Join(stateDir, "..", "build"),
		"--templates-dir", filepath.Join(root, "template"), "--functions-dir", filepath.Join(root, "functions"),
		"--gpu-memory", "4Gi", "--shim-dir", shimDir(t), "--log-level", "debug"}
	return startUpInUnder(t, t.TempDir(), stateDir, 0, wrap, append(args, extra...)...)
}

// startUpIn runs `faas-gpu up --port <port> args...` in the folder cwd, on a free port when port is 0, and waits
// until the gateway answers; stateDir is where up keeps its state (its -state-dir, ./.faas-gpu by default).
func startUpIn(t *testing.T, cwd, stateDir string, port int, args ...string) *instance {
	t.Helper()
	return startUpInUnder(t, cwd, stateDir, port, nil, args...)
}

// startUpInUnder is startUpIn with up started by a wrapper command (see startUpUnder).
func startUpInUnder(t *testing.T, cwd, stateDir string, port int, wrap []string, args ...string) *instance {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	if port == 0 {
		port = freePort(t)
	}
	out := &testkit.Buffer{}
	cmd := exec.Command(bin, append([]string{"up", "--port", strconv.Itoa(port)}, args...)...)
	if len(wrap) > 0 {
		cmd = exec.Command(wrap[0], append(wrap[1:], cmd.Args...)...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = cwd
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in := &instance{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d", port), stateDir: stateDir, out: out,
		done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(in.done) }()
	t.Cleanup(func() {
		in.stop(t)
		if t.Failed() {
			t.Logf("faas-gpu up output:\n%s", out.String())
		}
	})
	testkit.EventuallyNil(t, 60*time.Second, "gateway healthz", func() error {
		select {
		case <-in.done:
			return fmt.Errorf("faas-gpu up exited: %s", out.String())
		default:
		}
		resp, err := http.Get(in.url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz: %d", resp.StatusCode)
		}
		return nil
	})
	creds, err := basicauth.Read(filepath.Join(stateDir, "secrets"))
	if err != nil {
		t.Fatalf("the credentials up created: %v", err)
	}
	in.user, in.password = creds.User, creds.Password
	return in
}

// functionStatus is GET /system/function/<name>.
func functionStatus(t *testing.T, in *instance, name string) types.FunctionStatus {
	t.Helper()
	r := in.system(t, http.MethodGet, "/system/function/"+name, nil)
	var st types.FunctionStatus
	if err := json.Unmarshal([]byte(r.body), &st); err != nil || r.code != http.StatusOK {
		t.Fatalf("status of %s: %d %s", name, r.code, r.body)
	}
	return st
}

// stop sends SIGINT (Ctrl-C) and waits for the process to exit.
func (in *instance) stop(t *testing.T) {
	t.Helper()
	select {
	case <-in.done:
		return
	default:
	}
	_ = in.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-in.done:
	case <-time.After(30 * time.Second): // generous: the machine is shared; up itself stops within 5s
		_ = in.cmd.Process.Kill()
		<-in.done
		t.Errorf("faas-gpu up did not exit after SIGINT")
	}
}

type reply struct {
	code   int
	header http.Header
	body   string
}

func call(t *testing.T, method, url string, body any, header map[string]string) reply {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return reply{code: resp.StatusCode, header: resp.Header, body: string(raw)}
}

// deploy does what faas-cli deploy -f stack.yml does: PUT, then POST when the function is unknown, with the
// template's fprocess as envProcess (faas-cli reads it from ./template/<lang>/template.yml).
func deploy(t *testing.T, in *instance, fn types.FunctionDeployment) {
	t.Helper()
	if fn.EnvProcess == "" {
		fn.EnvProcess = templateFprocess(t)
	}
	if fn.Labels == nil {
		fn.Labels = &map[string]string{}
	}
	if fn.Annotations == nil {
		fn.Annotations = &map[string]string{}
	}
	r := in.system(t, http.MethodPut, "/system/functions", fn)
	if r.code == http.StatusNotFound {
		r = in.system(t, http.MethodPost, "/system/functions", fn)
	}
	if r.code >= 300 {
		t.Fatalf("deploy %s: %d %s", fn.Service, r.code, r.body)
	}
}

// invokeReady invokes a function until it answers 200 (it may still be starting) and returns the body.
func invokeReady(t *testing.T, url, body string) string {
	t.Helper()
	var out string
	testkit.EventuallyNil(t, 60*time.Second, "invoke "+url, func() error {
		r := call(t, http.MethodPost, url, body, nil)
		if r.code != http.StatusOK {
			return fmt.Errorf("%d %s", r.code, r.body)
		}
		out = r.body
		return nil
	})
	return out
}

func gpuFunction() types.FunctionDeployment {
	return types.FunctionDeployment{Service: "hello-gpu", Image: "hello-gpu:latest",
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "1536Mi", "com.openfaas.gpu.slo": "80ms"}}
}

func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	work := t.TempDir()
	stateDir := filepath.Join(work, "state")
	in := startUp(t, stateDir)
	base := in.url

	// A secret the echo function reads as a file.
	if r := in.system(t, http.MethodPost, "/system/secrets", types.Secret{Name: "api-key", Value: "s3cr3t"}); r.code >= 300 {
		t.Fatalf("create secret: %d %s", r.code, r.body)
	}
	if r := in.system(t, http.MethodGet, "/system/secrets", nil); !strings.Contains(r.body, "api-key") || strings.Contains(r.body, "s3cr3t") {
		t.Fatalf("list secrets: %d %s (want the name, never the value)", r.code, r.body)
	}

	deploy(t, in, types.FunctionDeployment{Service: "echo", Image: "echo:latest", Secrets: []string{"api-key"}})
	deploy(t, in, gpuFunction())

	t.Run("duplicate deploy is refused", func(t *testing.T) {
		r := in.system(t, http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "echo", Image: "echo:latest"})
		if r.code < 400 || r.code >= 500 {
			t.Fatalf("duplicate POST: %d %s, want a 4xx", r.code, r.body)
		}
	})

	t.Run("sync invoke", func(t *testing.T) {
		if got := invokeReady(t, base+"/function/echo", "hello faas-gpu"); got != "hello faas-gpu" {
			t.Fatalf("echo answered %q", got)
		}
		if got := invokeReady(t, base+"/function/echo?secret=api-key", ""); got != "s3cr3t" {
			t.Fatalf("echo read secret %q, want s3cr3t", got)
		}
		raw := invokeReady(t, base+"/function/hello-gpu", "{}")
		var got map[string]any
		if err := json.Unmarshal([]byte(raw), &got); err != nil {
			t.Fatalf("hello-gpu answered %q: %v", raw, err)
		}
		gpu, ok := got["gpu"].(float64)
		if !ok || gpu < 0 || gpu > 3 {
			t.Fatalf("hello-gpu answered %q: want the bound GPU (0..3) in field gpu", raw)
		}
		st, err := upGPUServer(t, stateDir).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range st.Functions {
			if f.Name == "hello-gpu" {
				found = f.Served >= 1 && f.MemoryBytes == 1536<<20 && f.SLO == 80*time.Millisecond
			}
		}
		if !found {
			t.Fatalf("gpuserver does not show hello-gpu registered and served: %+v", st.Functions)
		}
		if st.Swaps["pcie"]+st.Swaps["nvlink"] < 1 {
			t.Fatalf("pool swaps by kind = %v: the first request of hello-gpu must have swapped its model in", st.Swaps)
		}
	})

	t.Run("the provider surface is guarded", func(t *testing.T) {
		// /system/* needs the credentials; /function/*, /healthz need none (faas-cli invoke sends none).
		if r := call(t, http.MethodGet, base+"/system/functions", nil, nil); r.code != http.StatusUnauthorized {
			t.Errorf("list without credentials: %d, want 401", r.code)
		}
		evil := types.FunctionDeployment{Service: "evil", Image: "echo:latest", EnvProcess: "touch /tmp/faas-gpu-pwned"}
		if r := call(t, http.MethodPost, base+"/system/functions", evil, nil); r.code != http.StatusUnauthorized {
			t.Errorf("deploy without credentials: %d, want 401", r.code)
		}
		// A cross-site form post carrying the credentials (a browser that cached them) is still refused.
		form := call(t, http.MethodPost, base+"/system/functions", `{"service":"evil","image":"echo:latest"}`,
			map[string]string{"Authorization": basicAuth(in.user, in.password),
				"Content-Type": "application/x-www-form-urlencoded"})
		if form.code != http.StatusUnsupportedMediaType {
			t.Errorf("form-encoded deploy: %d %s, want 415", form.code, form.body)
		}
		// DNS rebinding: a page at rebind.example resolving to 127.0.0.1 reaches up with its own name in Host.
		req, _ := http.NewRequest(http.MethodPost, base+"/function/echo", strings.NewReader("x"))
		req.Host = "rebind.example"
		if resp, err := http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		} else if resp.Body.Close(); resp.StatusCode != http.StatusForbidden {
			t.Errorf("Host rebind.example: %d, want 403", resp.StatusCode)
		}
		if r := in.system(t, http.MethodGet, "/system/function/evil", nil); r.code != http.StatusNotFound {
			t.Fatalf("a refused deploy created a function: %d %s", r.code, r.body)
		}
		if _, err := os.Stat(filepath.Join(stateDir, "secrets", "basic-auth-password")); err != nil {
			t.Error(err)
		} else if st, _ := os.Stat(filepath.Join(stateDir, "secrets", "basic-auth-password")); st.Mode().Perm() != 0o600 {
			t.Errorf("basic-auth-password mode %v, want 0600", st.Mode().Perm())
		}
		if !strings.Contains(in.out.String(), "faas-cli login") {
			t.Errorf("up did not print the faas-cli login line:\n%s", in.out.String())
		}
	})

	t.Run("update under a steady request stream", func(t *testing.T) {
		var sent, bad atomic.Int64
		var example atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for c := 0; c < 4; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					resp, err := http.Post(base+"/function/echo", "text/plain", strings.NewReader("steady"))
					sent.Add(1)
					if err != nil {
						bad.Add(1)
						example.Store(err.Error())
						continue
					}
					out, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK || string(out) != "steady" {
						bad.Add(1)
						example.Store(fmt.Sprintf("%d %s", resp.StatusCode, out))
					}
				}
			}()
		}
		deploy(t, in, types.FunctionDeployment{Service: "echo", Image: "echo:latest", Secrets: []string{"api-key"},
			EnvVars: map[string]string{"UPDATED": "1"}})
		testkit.EventuallyNil(t, 60*time.Second, "the updated echo to serve alone", func() error {
			r := in.system(t, http.MethodGet, "/system/function/echo", nil)
			var st types.FunctionStatus
			if err := json.Unmarshal([]byte(r.body), &st); err != nil || st.EnvVars["UPDATED"] != "1" || st.AvailableReplicas != 1 {
				return fmt.Errorf("%d %s", r.code, r.body)
			}
			return nil
		})
		close(stop)
		wg.Wait()
		if bad.Load() > 0 || sent.Load() == 0 {
			t.Fatalf("%d of %d requests during the update failed, e.g. %v", bad.Load(), sent.Load(), example.Load())
		}
	})

	t.Run("CUDA through the shim", func(t *testing.T) {
		deploy(t, in, types.FunctionDeployment{Service: "vector-add", Image: "vector-add:latest",
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi", "com.openfaas.gpu.slo": "200ms"}})
		deploy(t, in, types.FunctionDeployment{Service: "mlp", Image: "mlp:latest",
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "512Mi", "com.openfaas.gpu.slo": "500ms"}})
		// Deploy, then invoke at once: the first call waits until the function is ready (no retry here).
		va0 := call(t, http.MethodPost, base+"/function/vector-add", `{"a": [1, 2.5, -3], "b": [10, 20, 30.25]}`, nil)
		if va0.code != http.StatusOK {
			t.Fatalf("the first call right after the deploy: %d %s, want 200", va0.code, va0.body)
		}
		raw := va0.body
		var va struct{ C []float64 }
		if err := json.Unmarshal([]byte(raw), &va); err != nil || len(va.C) != 3 || va.C[0] != 11 || va.C[1] != 22.5 || va.C[2] != 27.25 {
			t.Fatalf("vector-add answered %q, want c = [11 22.5 27.25]", raw)
		}
		if r := call(t, http.MethodPost, base+"/function/vector-add", `{"a": [1], "b": [1, 2]}`, nil); r.code != http.StatusBadRequest || !strings.Contains(r.body, "b") {
			t.Errorf("vector-add with unequal lengths: %d %s, want 400 naming b", r.code, r.body)
		}
		x := make([]float64, 1024)
		for i := range x {
			x[i] = float64(i%17) / 17
		}
		body, _ := json.Marshal(map[string]any{"x": x})
		first := invokeReady(t, base+"/function/mlp", string(body))
		var y struct{ Y []float64 }
		if err := json.Unmarshal([]byte(first), &y); err != nil || len(y.Y) != 256 {
			t.Fatalf("mlp answered %.200q, want 256 outputs", first)
		}
		for i := 0; i < 3; i++ { // hello-gpu and vector-add requests in between move bindings around
			invokeReady(t, base+"/function/hello-gpu", "{}")
			invokeReady(t, base+"/function/vector-add", `{"a": [1], "b": [2]}`)
			if again := invokeReady(t, base+"/function/mlp", string(body)); again != first {
				t.Fatalf("mlp answered differently on call %d", i+2)
			}
		}
		for _, fn := range []string{"vector-add", "mlp"} {
			if r := in.system(t, http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: fn}); r.code >= 300 {
				t.Fatalf("delete %s: %d %s", fn, r.code, r.body)
			}
		}
	})

	t.Run("async invoke with callback", func(t *testing.T) {
		type callback struct {
			header http.Header
			body   string
		}
		got := make(chan callback, 1)
		cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			raw, _ := io.ReadAll(r.Body)
			got <- callback{header: r.Header.Clone(), body: string(raw)}
		}))
		defer cb.Close()
		r := call(t, http.MethodPost, base+"/async-function/echo", "later, please",
			map[string]string{"X-Callback-Url": cb.URL + "/done"})
		if r.code != http.StatusAccepted || r.header.Get("X-Call-Id") == "" {
			t.Fatalf("async: %d %v %s", r.code, r.header, r.body)
		}
		select {
		case c := <-got:
			if c.body != "later, please" {
				t.Errorf("callback body %q", c.body)
			}
			for k, want := range map[string]string{"X-Call-Id": r.header.Get("X-Call-Id"), "X-Function-Status": "200",
				"X-Function-Name": "echo"} {
				if c.header.Get(k) != want {
					t.Errorf("callback %s = %q, want %q", k, c.header.Get(k), want)
				}
			}
			if _, err := strconv.ParseFloat(c.header.Get("X-Duration-Seconds"), 64); err != nil {
				t.Errorf("callback X-Duration-Seconds = %q: %v", c.header.Get("X-Duration-Seconds"), err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("no callback within 60s")
		}
	})

	t.Run("pool and queue state, metrics", func(t *testing.T) {
		bin, err := buildOnce()
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "pool", "--state-dir", stateDir).CombinedOutput()
		if err != nil {
			t.Fatalf("faas-gpu pool: %v\n%s", err, out)
		}
		// --nats-url none: the GPU pool only, no NATS.
		if only, err := exec.Command(bin, "pool", "--state-dir", stateDir, "--nats-url", "none").CombinedOutput(); err != nil ||
			!strings.Contains(string(only), "policy:") || strings.Contains(string(only), "dead letters:") {
			t.Errorf("faas-gpu pool --nats-url none: %v\n%s", err, only)
		}
		for _, want := range []string{"policy: faas-gpu", "hello-gpu", "QUEUE", "OF_faas-request", "dead letters:"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("faas-gpu pool output lacks %q:\n%s", want, out)
			}
		}
		r := call(t, http.MethodGet, base+"/metrics", nil, nil)
		// The gateway's metrics (provider, queue worker) and the gpuserver's (pool, remoting), one scrape.
		if r.code != http.StatusOK {
			t.Fatalf("gateway /metrics: %d %s", r.code, r.body)
		}
		for _, want := range []string{"faas_gpu_queue_", "go_goroutines", "provider_http_requests_total",
			"faas_gpu_gpu_healthy{gpu=", "faas_gpu_remoting_records_total", "faas_gpu_served_requests_total{function=\"hello-gpu\"}"} {
			if !strings.Contains(r.body, want) {
				t.Errorf("gateway /metrics lacks %s", want)
			}
		}
	})

	t.Run("list and status", func(t *testing.T) {
		r := in.system(t, http.MethodGet, "/system/functions", nil)
		var fns []types.FunctionStatus
		if err := json.Unmarshal([]byte(r.body), &fns); err != nil {
			t.Fatalf("list: %d %s", r.code, r.body)
		}
		names := map[string]types.FunctionStatus{}
		for _, f := range fns {
			names[f.Name] = f
		}
		if len(names) != 2 || names["hello-gpu"].Annotations == nil ||
			(*names["hello-gpu"].Annotations)["com.openfaas.gpu.memory"] != "1536Mi" {
			t.Fatalf("list: %s", r.body)
		}
		// faas-cli list shows the invocations: up counts what its proxy forwarded.
		if names["echo"].InvocationCount < 2 || names["hello-gpu"].InvocationCount < 1 {
			t.Errorf("invocation counts: echo %v, hello-gpu %v; want what the earlier subtests sent",
				names["echo"].InvocationCount, names["hello-gpu"].InvocationCount)
		}
		if r := in.system(t, http.MethodGet, "/system/function/echo", nil); r.code != http.StatusOK || !strings.Contains(r.body, `"availableReplicas":1`) {
			t.Fatalf("status echo: %d %s", r.code, r.body)
		}
	})

	t.Run("scale to zero and back", func(t *testing.T) {
		scale := func(n uint64) {
			r := in.system(t, http.MethodPost, "/system/scale-function/echo",
				types.ScaleServiceRequest{ServiceName: "echo", Replicas: n})
			if r.code >= 300 {
				t.Fatalf("scale %d: %d %s", n, r.code, r.body)
			}
		}
		scale(0)
		testkit.EventuallyNil(t, 30*time.Second, "echo scaled to 0", func() error {
			if st := functionStatus(t, in, "echo"); st.Replicas != 0 || st.AvailableReplicas != 0 {
				return fmt.Errorf("status at 0 replicas: %+v", st)
			}
			return nil
		})
		// Scale from zero: the call wakes it and is answered (it waits up to the ready timeout).
		if r := call(t, http.MethodPost, base+"/function/echo", "woken", nil); r.code != http.StatusOK || r.body != "woken" {
			t.Fatalf("invoke at 0 replicas: %d %s, want the function woken and answering", r.code, r.body)
		}
		if st := functionStatus(t, in, "echo"); st.Replicas != 1 || st.AvailableReplicas != 1 {
			t.Fatalf("status after scale from zero: %+v", st)
		}
		scale(1)
		if got := invokeReady(t, base+"/function/echo", "back"); got != "back" {
			t.Fatalf("after scale 1: %q", got)
		}
	})

	t.Run("logs", func(t *testing.T) {
		testkit.EventuallyNil(t, 30*time.Second, "echo logs", func() error {
			r := in.system(t, http.MethodGet, "/system/logs?name=echo&tail=50&follow=false", nil)
			if r.code != http.StatusOK {
				return fmt.Errorf("%d %s", r.code, r.body)
			}
			sc := bufio.NewScanner(strings.NewReader(r.body))
			lines := 0
			for sc.Scan() {
				var m struct {
					Name string `json:"name"`
					Text string `json:"text"`
				}
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					return fmt.Errorf("log line %q: %v", sc.Text(), err)
				}
				if m.Name != "echo" {
					return fmt.Errorf("log line of %q", m.Name)
				}
				lines++
			}
			if lines == 0 {
				return fmt.Errorf("no log lines")
			}
			return nil
		})
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			name, method, path string
			body               any
			code               int
			mention            string
		}{
			{"unknown function status", http.MethodGet, "/system/function/nope", nil, 404, ""},
			{"unknown function invoke", http.MethodPost, "/function/nope", "x", 404, ""},
			{"update unknown function", http.MethodPut, "/system/functions",
				types.FunctionDeployment{Service: "nope", Image: "nope:latest"}, 404, ""},
			{"malformed JSON", http.MethodPost, "/system/functions", `{"service": "x",`, 400, ""},
			{"invalid annotation", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "bad",
				Image: "echo:latest", Annotations: &map[string]string{"com.openfaas.gpu.memory": "lots"}}, 400,
				"com.openfaas.gpu.memory"},
			{"invalid slo", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "bad",
				Image: "echo:latest", Annotations: &map[string]string{"com.openfaas.gpu.memory": "1Gi",
					"com.openfaas.gpu.slo": "-5ms"}}, 400, "com.openfaas.gpu.slo"},
			{"async to unknown function", http.MethodPost, "/async-function/nope", "x", 404, ""},
		} {
			var r reply
			if strings.HasPrefix(tc.path, "/system/") {
				r = in.system(t, tc.method, tc.path, tc.body)
			} else {
				r = call(t, tc.method, base+tc.path, tc.body, nil)
			}
			if r.code != tc.code || !strings.Contains(r.body, tc.mention) {
				t.Errorf("%s: %d %q, want %d mentioning %q", tc.name, r.code, r.body, tc.code, tc.mention)
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		r := in.system(t, http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: "hello-gpu"})
		if r.code >= 300 {
			t.Fatalf("delete: %d %s", r.code, r.body)
		}
		if r := in.system(t, http.MethodGet, "/system/function/hello-gpu", nil); r.code != http.StatusNotFound {
			t.Fatalf("status after delete: %d", r.code)
		}
		st, err := upGPUServer(t, stateDir).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range st.Functions {
			if f.Name == "hello-gpu" {
				t.Fatalf("hello-gpu is still registered with the gpuserver after delete")
			}
		}
		if r := in.system(t, http.MethodDelete, "/system/secrets", types.Secret{Name: "nope"}); r.code != http.StatusNotFound {
			t.Fatalf("delete unknown secret: %d %s", r.code, r.body)
		}
	})

	// A restarted `up` on the same state dir brings the functions back, GPU registrations included; a corrupt
	// function record is moved aside with a loud log line and every other function starts.
	in.stop(t)
	records := filepath.Join(stateDir, "functions", "functions")
	if err := os.WriteFile(filepath.Join(records, "ghost.json"), []byte(`{"deployment":{"service":"gho`), 0o600); err != nil {
		t.Fatal(err)
	}
	deploy2 := startUp(t, stateDir)
	if matches, _ := filepath.Glob(filepath.Join(records, "ghost.json.corrupt-*")); len(matches) != 1 {
		t.Errorf("the truncated record was not moved aside: %v", matches)
	}
	testkit.EventuallyNil(t, 30*time.Second, "a loud log line about the corrupt record", func() error {
		if !strings.Contains(deploy2.out.String(), "CORRUPT") || !strings.Contains(deploy2.out.String(), "ghost.json") {
			return fmt.Errorf("not logged")
		}
		return nil
	})
	if deploy2.password != in.password {
		t.Error("the basic-auth password changed across a restart")
	}
	if got := invokeReady(t, deploy2.url+"/function/echo", "again"); got != "again" {
		t.Fatalf("after restart echo answered %q", got)
	}
	deploy(t, deploy2, gpuFunction())
	if raw := invokeReady(t, deploy2.url+"/function/hello-gpu", "{}"); !strings.Contains(raw, `"gpu"`) {
		t.Fatalf("after restart hello-gpu answered %q", raw)
	}
	deploy2.stop(t)
	deploy3 := startUp(t, stateDir)
	if raw := invokeReady(t, deploy3.url+"/function/hello-gpu", "{}"); !strings.Contains(raw, `"gpu"`) {
		t.Fatalf("after a second restart hello-gpu answered %q (GPU registration not restored?)", raw)
	}
}
