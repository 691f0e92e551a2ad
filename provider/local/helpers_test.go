package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// templateDir is the gpu-python template of this repository.
var templateDir = filepath.Join("..", "..", "template", "gpu-python")

func needPython(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the local backend runs functions with it")
	}
}

// buildContext lays out <buildDir>/<name>/ from the gpu-python template and a handler folder.
func buildContext(t testing.TB, buildDir, name, handlerDir string) {
	t.Helper()
	if err := shrinkwrap.Assemble(templateDir, handlerDir, filepath.Join(buildDir, name)); err != nil {
		t.Fatal(err)
	}
}

// newSandbox makes a sandbox of the default configuration, and skips the test where the kernel does not allow one.
func newSandbox(ctx context.Context, t testing.TB) *sandbox.Sandbox {
	t.Helper()
	sb, err := sandbox.New(ctx, sandbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Enabled() {
		t.Skipf("this kernel does not allow sandboxes: %s", sb.Report().Reason)
	}
	return sb
}

type env struct {
	state, build string
	cfg          Config
}

func newEnv(t testing.TB) *env {
	t.Helper()
	needPython(t)
	dir := t.TempDir()
	e := &env{state: filepath.Join(dir, "state"), build: filepath.Join(dir, "build")}
	buildContext(t, e.build, "probe", filepath.Join("testdata", "probe"))
	e.cfg = Config{StateDir: e.state, BuildDir: e.build, Env: map[string]string{"EXTRA": "from-config",
		// Never the machine's own gpuserver (/var/run/faas-gpu, which a live cluster on this host may serve).
		"FAAS_GPU_SOCKET": filepath.Join(dir, "no-gpuserver.sock")},
		StopTimeout: 2 * time.Second, BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second}
	return e
}

func (e *env) open(t testing.TB) *Backend {
	t.Helper()
	b, err := New(context.Background(), e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func probe(name string) types.FunctionDeployment {
	return types.FunctionDeployment{Service: name, Image: "ghcr.io/example/probe:0.1",
		EnvVars: map[string]string{"FROM_FUNCTION": "yes"}}
}

func waitReady(t testing.TB, b *Backend, name string, n uint64) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("%s to have %d ready replicas", name, n), func() bool {
		st, err := b.Status(context.Background(), "", name)
		return err == nil && st.AvailableReplicas == n
	})
}

type probeReply struct {
	PID      int               `json:"pid"`
	Body     string            `json:"body"`
	Path     string            `json:"path"`
	Query    map[string]string `json:"query"`
	Hostname string            `json:"hostname"`
	GPU      map[string]any    `json:"gpu"`
	Env      map[string]string `json:"env"`
}

// invoke resolves a function and sends it one request.
func invoke(t testing.TB, b *Backend, name, path, body string) (int, []byte) {
	t.Helper()
	u, err := b.Resolve(context.Background(), "", name)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", name, err)
	}
	target, err := url.Parse(u.String() + path)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(target.String(), "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatalf("invoking %s: %v", name, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func invokeProbe(t testing.TB, b *Backend, name, path, body string) probeReply {
	t.Helper()
	code, out := invoke(t, b, name, path, body)
	if code != http.StatusOK {
		t.Fatalf("invoking %s: HTTP %d: %s", name, code, out)
	}
	var r probeReply
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("invoking %s: %v: %s", name, err, out)
	}
	return r
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// logText collects a function's current log lines.
func logText(t testing.TB, b *Backend, name string) string {
	t.Helper()
	ch, err := b.Logs(context.Background(), logs.Request{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for m := range ch {
		sb.WriteString(m.Instance + " " + m.Text + "\n")
	}
	return sb.String()
}

func isErr(err, target error) bool { return errors.Is(err, target) }

// httpPost sends an empty POST and returns the status code.
func httpPost(u string) (int, error) {
	resp, err := http.Post(u, "text/plain", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// execLookPython returns the path of python3.
func execLookPython() (string, error) { return exec.LookPath("python3") }
