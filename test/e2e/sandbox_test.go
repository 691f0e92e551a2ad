package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	gpuauth "github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// The escape function (provider/local/testdata/escape) is a hostile function: it tries what the request lists and
// reports what happened to each attempt.

type attempt struct {
	OK    bool   `json:"ok"`
	Value any    `json:"value"`
	Error string `json:"error"`
}

type escapeReport struct {
	UID     int                `json:"uid"`
	Procs   []int              `json:"procs"`
	Env     map[string]string  `json:"env"`
	Secrets attempt            `json:"secrets"`
	Read    map[string]attempt `json:"read"`
	List    map[string]attempt `json:"list"`
	Kill    map[string]attempt `json:"kill"`
	Unlink  map[string]attempt `json:"unlink"`
	Rename  map[string]attempt `json:"rename"`
	Chmod   map[string]attempt `json:"chmod"`
	Listen  map[string]attempt `json:"listen"`
	Write   map[string]attempt `json:"write"`
	KillAll *attempt           `json:"kill_all"`
	Ptrace  *attempt           `json:"ptrace_init"`
}

// escapeContext lays out the escape function's build context in buildDir.
func escapeContext(t *testing.T, buildDir, name string) {
	t.Helper()
	root := repoRoot(t)
	if err := shrinkwrap.Assemble(filepath.Join(root, "template", "gpu-python"),
		filepath.Join(root, "provider", "local", "testdata", "escape"), filepath.Join(buildDir, name)); err != nil {
		t.Fatal(err)
	}
}

func runEscape(t *testing.T, in *instance, name string, todo map[string]any) escapeReport {
	t.Helper()
	body, err := json.Marshal(todo)
	if err != nil {
		t.Fatal(err)
	}
	var r escapeReport
	out := invokeReady(t, in.url+"/function/"+name, string(body))
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("escape %s: %v: %s", name, err, out)
	}
	return r
}

func allRefused(t *testing.T, group string, attempts map[string]attempt) {
	t.Helper()
	if len(attempts) == 0 {
		t.Errorf("%s: nothing was attempted", group)
	}
	for what, a := range attempts {
		if a.OK {
			t.Errorf("%s %s got through: %.200v", group, what, a.Value)
		} else {
			t.Logf("%s %s: %s", group, what, a.Error)
		}
	}
}

// startedPIDs returns the outside process ids of the sandboxes' inits up started for function (from its log).
func startedPIDs(out, function string) []int {
	re := regexp.MustCompile(`function replica started" .*function=` + regexp.QuoteMeta(function) + ` .*pid=(\d+)`)
	var pids []int
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		if p, err := strconv.Atoi(m[1]); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// functionUID is the real uid, outside its namespaces, of the function process an init started.
func functionUID(t *testing.T, initPID int) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", initPID, initPID))
	if err != nil {
		t.Fatalf("children of the sandbox init %d: %v", initPID, err)
	}
	kids := strings.Fields(string(raw))
	if len(kids) == 0 {
		t.Fatalf("the sandbox init %d has no child", initPID)
	}
	status, err := os.ReadFile("/proc/" + kids[0] + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid, _ := strconv.Atoi(strings.Fields(rest)[0])
			return uid
		}
	}
	t.Fatalf("no Uid line in /proc/%s/status", kids[0])
	return -1
}

// attackUp deploys two escape functions with a secret each beside echo and vector-add on a running up, has one try
// every way out of the sandbox docs/security.md names, and checks that each fails while up and every function keep
// working. It returns the attacker's report.
func attackUp(t *testing.T, in *instance, upPID int, marker string) escapeReport {
	t.Helper()
	state := in.stateDir
	for _, s := range []types.Secret{{Name: "secret-a", Value: "value-a"}, {Name: "secret-b", Value: "value-b"}} {
		if r := in.system(t, http.MethodPost, "/system/secrets", s); r.code >= 300 {
			t.Fatalf("create secret %s: %d %s", s.Name, r.code, r.body)
		}
	}
	// escape-a is a GPU function: it has the remoting socket and a token of its own to attack with.
	deploy(t, in, types.FunctionDeployment{Service: "escape-a", Image: "escape:latest", Secrets: []string{"secret-a"},
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "16Mi"}})
	deploy(t, in, types.FunctionDeployment{Service: "escape-b", Image: "escape:latest", Secrets: []string{"secret-b"}})
	deploy(t, in, types.FunctionDeployment{Service: "echo", Image: "echo:latest"})
	deploy(t, in, types.FunctionDeployment{Service: "vector-add", Image: "vector-add:latest",
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi"}})
	sockets := []string{filepath.Join(state, "remoting.sock"), filepath.Join(state, "gpuserver.sock")}
	up := strconv.Itoa(upPID)
	r := runEscape(t, in, "escape-a", map[string]any{
		"read": []string{
			"/proc/" + up + "/environ", "/proc/" + up + "/cmdline", "/proc/1/environ",
			filepath.Join(state, "gpuserver.key"),
			filepath.Join(state, "secrets", basicauth.PasswordFile),
			filepath.Join(state, "secrets", "nats-password"),
			filepath.Join(state, "nats-url"),
			filepath.Join(state, "functions", "secrets", "secret-b"),
			filepath.Join(state, "functions", "run", "escape-b", "secrets", "secret-b"),
			filepath.Join(state, "functions", "functions", "escape-b.json"),
		},
		"list":        []string{state, filepath.Join(state, "secrets"), filepath.Join(state, "jetstream")},
		"write":       []string{filepath.Join(state, "..", "build", "escape", "index.py")},
		"kill":        []string{up},
		"unlink":      sockets,
		"rename":      sockets,
		"chmod":       sockets,
		"listen":      sockets,
		"kill_all":    true,
		"ptrace_init": true,
	})
	for group, attempts := range map[string]map[string]attempt{"read": r.Read, "kill": r.Kill, "unlink": r.Unlink,
		"rename": r.Rename, "chmod": r.Chmod, "listen": r.Listen, "write": r.Write} {
		allRefused(t, group, attempts)
	}
	allRefused(t, "ptrace", map[string]attempt{"the sandbox's init": *r.Ptrace})
	for dir, a := range r.List {
		if a.OK && dir != state {
			t.Errorf("list %s got through: %v", dir, a.Value)
		}
		if a.OK && dir == state { // only the way to its own secrets and the sockets
			for _, n := range a.Value.([]any) {
				if n != "functions" && n != "remoting.sock" && n != "gpuserver.sock" {
					t.Errorf("the function sees %s in the state dir", n)
				}
			}
		}
	}
	if len(r.Procs) != 2 || r.Procs[0] != 1 {
		t.Errorf("/proc of the function lists %v, want its init and itself", r.Procs)
	}
	// Nothing of up's environment or credentials in the function's.
	key, err := os.ReadFile(filepath.Join(state, "gpuserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	nats, err := os.ReadFile(filepath.Join(state, "secrets", "nats-password"))
	if err != nil {
		t.Fatal(err)
	}
	gk, err := gpuauth.ReadKey(filepath.Join(state, "gpuserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.Env {
		for what, secret := range map[string]string{"up's environment": marker, "the basic-auth password": in.password,
			"the NATS password": strings.TrimSpace(string(nats)), "the gpuserver key": strings.TrimSpace(string(key)),
			"the gpuserver's administrator token": gk.AdminToken(),
			"another function's token":            gk.FunctionToken("vector-add")} {
			if secret != "" && (strings.Contains(v, secret) || strings.Contains(k, secret)) {
				t.Errorf("the function's environment has %s: %s", what, k)
			}
		}
	}
	if r.Env["FAAS_GPU_TOKEN"] != gk.FunctionToken("escape-a") {
		t.Errorf("escape-a's token is not its own")
	}
	if s := r.Secrets; !s.OK || len(s.Value.([]any)) != 1 || s.Value.([]any)[0] != "secret-a" {
		t.Errorf("the function's secrets = %+v, want its own only", s)
	}
	// up, the sockets and every function still work.
	if err := syscall.Kill(upPID, 0); err != nil {
		t.Fatalf("up after the attack: %v", err)
	}
	for _, s := range sockets {
		if fi, err := os.Stat(s); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("%s after the attack: %v", s, err)
		}
	}
	if got := invokeReady(t, in.url+"/function/echo", "still here"); got != "still here" {
		t.Errorf("echo after the attack = %q", got)
	}
	var va struct{ C []float64 }
	out := invokeReady(t, in.url+"/function/vector-add", `{"a": [1, 2, 3], "b": [10, 20, 30]}`)
	if json.Unmarshal([]byte(out), &va) != nil || len(va.C) != 3 || va.C[0] != 11 || va.C[1] != 22 || va.C[2] != 33 {
		t.Errorf("vector-add through the shim after the attack = %s, want c = [11 22 33]", out)
	}
	return r
}

// TestUpSandboxesFunctions: as root (this test's user; as any other user the same test runs the unprivileged
// variant), functions on `faas-gpu up` run as ids of their own in namespaces of their own, and a hostile one can
// read none of up's keys, passwords, environment or other functions' secrets, cannot signal up or replace its
// sockets, while echo and vector-add through the shim keep answering.
func TestUpSandboxesFunctions(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	marker := "up-only-" + strconv.Itoa(os.Getpid())
	t.Setenv("FAAS_GPU_TEST_UP_ONLY", marker)
	dir := t.TempDir()
	escapeContext(t, filepath.Join(dir, "build"), "escape")
	in := startUp(t, filepath.Join(dir, "state"), "--sandbox", "required")
	testkit.EventuallyNil(t, 30*time.Second, "up's start-up lines to say functions are isolated", func() error {
		if !strings.Contains(in.out.String(), "functions    isolated") {
			return fmt.Errorf("not in:\n%s", in.out.String())
		}
		return nil
	})
	r := attackUp(t, in, in.cmd.Process.Pid, marker)
	a, b := startedPIDs(in.out.String(), "escape-a"), startedPIDs(in.out.String(), "escape-b")
	if len(a) == 0 || len(b) == 0 {
		t.Fatalf("up's log names no replica of escape-a or escape-b")
	}
	ua, ub := functionUID(t, a[len(a)-1]), functionUID(t, b[len(b)-1])
	if os.Geteuid() == 0 {
		if ua == ub || ua <= sandbox.DefaultFirstID || ub <= sandbox.DefaultFirstID {
			t.Errorf("escape-a runs as uid %d, escape-b as %d: want two ids of the functions' range", ua, ub)
		}
		if r.UID != ua {
			t.Errorf("escape-a sees uid %d inside, %d outside: want the same (no user namespace as root)", r.UID, ua)
		}
	} else if ua != os.Geteuid() || r.UID != 0 {
		t.Errorf("escape-a: uid %d outside, %d inside; want this user's %d outside, 0 inside its user namespace",
			ua, r.UID, os.Geteuid())
	}
	// faas-gpu pool says it too.
	bin, _ := buildOnce()
	pool, err := exec.Command(bin, "pool", "--state-dir", in.stateDir, "--nats-url", "none").CombinedOutput()
	if err != nil || !strings.Contains(string(pool), "functions: isolated") {
		t.Errorf("faas-gpu pool: %v\n%s", err, pool)
	}
}

// TestUpSandboxesFunctionsAsUnprivilegedUser runs `faas-gpu up` as nobody (through setpriv), as a user without
// root would: every function gets a user namespace of its own mapping only nobody's id, and the same attack fails.
func TestUpSandboxesFunctionsAsUnprivilegedUser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: TestUpSandboxesFunctions has run up as an unprivileged user already")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed: cannot run up as another user")
	}
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	const nobody = 65534
	dir, err := os.MkdirTemp("", "faas-gpu-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	userBin := filepath.Join(dir, "faas-gpu")
	if err := os.WriteFile(userBin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	// Everything up reads is copied in, so that nobody reads it wherever the repository is (a home folder that only
	// root may enter): the build contexts, the shim.
	work := filepath.Join(dir, "work")
	escapeContext(t, filepath.Join(work, "build"), "escape")
	for _, fn := range []string{"echo", "vector-add"} {
		if err := shrinkwrap.Assemble(filepath.Join(repoRoot(t), "template", "gpu-python"),
			filepath.Join(repoRoot(t), "functions", fn), filepath.Join(work, "build", fn)); err != nil {
			t.Fatal(err)
		}
	}
	shim, err := os.ReadFile(filepath.Join(shimDir(t), "libcuda.so.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(work, "shim"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "shim", "libcuda.so.1"), shim, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"templates", "functions"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := filepath.Walk(work, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, nobody, nobody)
	}); err != nil {
		t.Fatal(err)
	}
	marker := "up-only-" + strconv.Itoa(os.Getpid())
	port := freePort(t)
	state := filepath.Join(work, "state")
	out := &testkit.Buffer{}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", userBin, "up",
		"--state-dir", state, "--port", strconv.Itoa(port), "--build-dir", filepath.Join(work, "build"),
		"--templates-dir", filepath.Join(work, "templates"), "--functions-dir", filepath.Join(work, "functions"),
		"--env-dir", filepath.Join(work, "envs"), "--gpu-memory", "4Gi", "--shim-dir", filepath.Join(work, "shim"),
		"--log-level", "debug", "--sandbox", "required")
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + work, "FAAS_GPU_TEST_UP_ONLY=" + marker}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = work
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in := &instance{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d", port), stateDir: state, out: out,
		done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(in.done) }()
	t.Cleanup(func() {
		in.stop(t)
		if t.Failed() {
			t.Logf("faas-gpu up (as nobody) output:\n%s", out.String())
		}
	})
	testkit.EventuallyNil(t, 60*time.Second, "up as nobody", func() error {
		select {
		case <-in.done:
			if strings.Contains(out.String(), sandbox.ErrUnavailable.Error()) {
				return nil
			}
			return fmt.Errorf("faas-gpu up exited: %s", out.String())
		default:
		}
		resp, err := http.Get(in.url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	select {
	case <-in.done:
		t.Skipf("the kernel refuses nobody a user namespace: %s", out.String())
	default:
	}
	creds, err := basicauth.Read(filepath.Join(state, "secrets"))
	if err != nil {
		t.Fatal(err)
	}
	in.user, in.password = creds.User, creds.Password
	testkit.EventuallyNil(t, 30*time.Second, "up as nobody to say functions are isolated in user namespaces", func() error {
		if !strings.Contains(out.String(), "functions    isolated: user, mount, pid, ipc, uts") {
			return fmt.Errorf("not in:\n%s", out.String())
		}
		return nil
	})
	r := attackUp(t, in, cmd.Process.Pid, marker)
	if r.UID != 0 {
		t.Errorf("the function's uid inside = %d, want 0 (root of its own user namespace, no capabilities)", r.UID)
	}
	if pids := startedPIDs(out.String(), "escape-a"); len(pids) == 0 {
		t.Error("up's log names no replica of escape-a")
	} else if uid := functionUID(t, pids[len(pids)-1]); uid != nobody {
		t.Errorf("the function runs as uid %d outside, want nobody's %d", uid, nobody)
	}
}
