package local

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func TestMain(m *testing.M) {
	if sandbox.IsInit() { // a sandboxed replica's init: this test binary started again
		os.Exit(sandbox.RunInit())
	}
	testkit.VerifyNoLeaks(m) // replicas' supervisors and log copiers end with their backend
}

// attempted is one attempt of the escape function.
type attempted struct {
	OK    bool   `json:"ok"`
	Value any    `json:"value"`
	Error string `json:"error"`
}

// escapeReport is the escape function's answer (testdata/escape/handler.py).
type escapeReport struct {
	UID     int                  `json:"uid"`
	PID     int                  `json:"pid"`
	Procs   []int                `json:"procs"`
	Env     map[string]string    `json:"env"`
	Secrets attempted            `json:"secrets"`
	Read    map[string]attempted `json:"read"`
	List    map[string]attempted `json:"list"`
	Write   map[string]attempted `json:"write"`
	Kill    map[string]attempted `json:"kill"`
	Unlink  map[string]attempted `json:"unlink"`
	Rename  map[string]attempted `json:"rename"`
	Chmod   map[string]attempted `json:"chmod"`
	Listen  map[string]attempted `json:"listen"`
	KillAll *attempted           `json:"kill_all"`
	Ptrace  *attempted           `json:"ptrace_init"`
}

// refused fails the test for each attempt of group that got through.
func refused(t *testing.T, group string, attempts map[string]attempted) {
	t.Helper()
	if len(attempts) == 0 {
		t.Errorf("%s: nothing was attempted", group)
	}
	for what, a := range attempts {
		if a.OK {
			t.Errorf("%s %s got through: %v", group, what, a.Value)
		}
	}
}

func escape(t *testing.T, b *Backend, name string, todo map[string]any) escapeReport {
	t.Helper()
	body, err := json.Marshal(todo)
	if err != nil {
		t.Fatal(err)
	}
	code, out := invoke(t, b, name, "/", string(body))
	if code != 200 {
		t.Fatalf("escape %s: %d %s", name, code, out)
	}
	var r escapeReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("escape %s: %v: %s", name, err, out)
	}
	return r
}

// TestSandboxedFunctionsCannotReachThePlatform deploys two functions with a secret each in sandboxes and has one
// of them try what a hostile function would: read the other's secret and the backend's state, this process's
// environment, signal this process, replace the platform's socket. Each attempt must fail, while the function
// still reads its own secret (also after an update of it), connects to the socket and answers.
func TestSandboxedFunctionsCannotReachThePlatform(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("sandboxes are Linux only")
	}
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb := newSandbox(ctx, t)
	t.Logf("sandbox: %s", sb.Report().Summary())
	e.cfg.Sandbox = sb
	// The platform's socket (as up's gpuserver.sock) and a variable of this process functions must not see.
	sock := filepath.Join(filepath.Dir(e.state), "platform.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if gid, ok := sb.SocketGroup(); ok { // as up gives its sockets to the functions' group
		if err := os.Chown(sock, -1, int(gid)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(sock, 0o660); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg.Env["FAAS_GPU_SOCKET"] = sock
	t.Setenv("PLATFORM_CREDENTIAL", "must-not-leak")
	buildContext(t, e.build, "escape", filepath.Join("testdata", "escape"))
	b := e.open(t)
	for _, s := range []types.Secret{{Name: "secret-a", Value: "value-a"}, {Name: "secret-b", Value: "value-b"}} {
		if err := b.CreateSecret(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"a", "b"} {
		fd := types.FunctionDeployment{Service: name, Image: "escape", Secrets: []string{"secret-" + name}}
		if err := b.Deploy(ctx, fd); err != nil {
			t.Fatal(err)
		}
	}
	waitReady(t, b, "a", 1)
	waitReady(t, b, "b", 1)

	self := strconv.Itoa(os.Getpid())
	r := escape(t, b, "a", map[string]any{
		"read": []string{
			filepath.Join(b.secretsDir("b"), "secret-b"),   // the other function's copy
			filepath.Join(e.state, "secrets", "secret-b"),  // the store of secrets
			filepath.Join(e.state, "functions", "b.json"),  // another function's record
			"/proc/" + self + "/environ",                   // this process's environment
			"/proc/1/environ",                              // the sandbox's init
			filepath.Join(e.build, "b", "index.py"),        // nothing of b: its build context is not shown
			filepath.Join(filepath.Dir(e.state), "x.json"), // a file beside the socket
		},
		"list":        []string{e.state, filepath.Dir(e.state), "/root", "/home"},
		"write":       []string{filepath.Join(e.build, "escape", "index.py"), filepath.Join(b.secretsDir("a"), "x"), "/etc/passwd"},
		"kill":        []string{self},
		"unlink":      []string{sock},
		"rename":      []string{sock},
		"chmod":       []string{sock},
		"listen":      []string{sock},
		"kill_all":    true,
		"ptrace_init": true,
	})
	refused(t, "read", r.Read)
	refused(t, "write", r.Write)
	refused(t, "kill", r.Kill)
	refused(t, "unlink", r.Unlink)
	refused(t, "rename", r.Rename)
	refused(t, "chmod", r.Chmod)
	refused(t, "listen", r.Listen)
	refused(t, "ptrace", map[string]attempted{"init": *r.Ptrace})
	// The state dir holds only the way to the function's own secrets (run/a/secrets), nothing of its content.
	if a := r.List[e.state]; a.OK && (len(a.Value.([]any)) != 1 || a.Value.([]any)[0] != "run") {
		t.Errorf("the function lists the state dir: %v", a.Value)
	}
	if a := r.List["/home"]; a.OK {
		t.Errorf("the function lists /home: %v", a.Value)
	}
	if len(r.Procs) != 2 || r.Procs[0] != 1 {
		t.Errorf("/proc shows %v, want the sandbox's init and the function", r.Procs)
	}
	for k, v := range r.Env {
		if k == "PLATFORM_CREDENTIAL" || strings.Contains(v, "must-not-leak") {
			t.Errorf("the function sees this process's environment: %s=%s", k, v)
		}
	}
	if got := r.Secrets; !got.OK || len(got.Value.([]any)) != 1 {
		t.Errorf("the function's secrets folder = %+v, want its one secret", got)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the platform's socket after the attempts: %v", err)
	}
	if c, err := net.Dial("unix", sock); err != nil {
		t.Errorf("the platform's socket no longer answers: %v", err)
	} else {
		c.Close()
	}

	// Its own secret, updated while it runs, and its identity.
	if err := b.UpdateSecret(ctx, types.Secret{Name: "secret-a", Value: "value-a2"}); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(b.secretsDir("a"), "secret-a")
	r = escape(t, b, "a", map[string]any{"read": []string{own}, "listen": []string{"/tmp/own.sock"}})
	if got := r.Read[own]; !got.OK || got.Value != "value-a2" {
		t.Errorf("own secret after an update = %+v, want value-a2", got)
	}
	if got := r.Listen["/tmp/own.sock"]; !got.OK {
		t.Errorf("a socket in its own /tmp: %+v", got)
	}
	rb := escape(t, b, "b", map[string]any{})
	if _, ok := sb.SocketGroup(); ok {
		if r.UID == rb.UID || r.UID <= sandbox.DefaultFirstID || rb.UID <= sandbox.DefaultFirstID {
			t.Errorf("function uids %d and %d: want two distinct ids of the functions' range", r.UID, rb.UID)
		}
	}
	if !alive(os.Getpid()) {
		t.Fatal("unreachable")
	}
}

// TestSandboxedFunctionRunsOnAVirtualEnvironmentsPython: with Config.Python the interpreter of a virtual environment
// (up's --python .venv/bin/python3, or the pinned environment of the CUDA tests), a sandboxed function runs in that
// environment and imports its packages, which the sandbox shows read-only; the environment's interpreter is not
// replaced by the base one it links to (which would not see them).
func TestSandboxedFunctionRunsOnAVirtualEnvironmentsPython(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("sandboxes are Linux only")
	}
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb := newSandbox(ctx, t)
	e.cfg.Sandbox = sb
	venvDir := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.CommandContext(ctx, "python3", "-m", "venv", "--without-pip", venvDir).CombinedOutput(); err != nil {
		t.Skipf("python3 -m venv: %v: %s", err, out)
	}
	site, err := exec.CommandContext(ctx, filepath.Join(venvDir, "bin", "python3"), "-c",
		"import sysconfig; print(sysconfig.get_paths()['purelib'])").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(strings.TrimSpace(string(site)), "venv_marker.py"),
		[]byte("WHERE = __file__\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.cfg.Python = filepath.Join(venvDir, "bin", "python3")
	handler := t.TempDir()
	if err := os.WriteFile(filepath.Join(handler, "handler.py"), []byte(`import sys

import venv_marker


def handle(event, context):
    return {"statusCode": 200, "body": {"prefix": sys.prefix, "marker": venv_marker.WHERE}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	buildContext(t, e.build, "onvenv", handler)
	b := e.open(t)
	if err := b.Deploy(ctx, types.FunctionDeployment{Service: "onvenv", Image: "onvenv"}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "onvenv", 1)
	code, out := invoke(t, b, "onvenv", "/", "")
	var r struct{ Prefix, Marker string }
	if code != 200 || json.Unmarshal(out, &r) != nil {
		t.Fatalf("onvenv: %d %s", code, out)
	}
	if r.Prefix != venvDir || !strings.HasPrefix(r.Marker, venvDir+"/") {
		t.Errorf("the function runs in %s and imported its marker from %s: want the environment %s", r.Prefix,
			r.Marker, venvDir)
	}
}
