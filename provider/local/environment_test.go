package local

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/local/venv"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// needPip skips when environments cannot be made here; the tests install a small real package from PyPI.
func needPip(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("installs a package from PyPI with pip")
	}
	pyenv.RequireTier(t, "installs a package from PyPI with pip")
	needPython(t)
	if out, err := exec.Command("python3", "-c", "import venv, ensurepip").CombinedOutput(); err != nil {
		t.Skipf("python3 with the venv and ensurepip modules is needed (Debian: python3-venv): %v %s", err, out)
	}
}

// pipFunction lays out a build context of testdata/pipfn under name with the given function/requirements.txt.
func pipFunction(t *testing.T, e *env, name, requirements string) types.FunctionDeployment {
	t.Helper()
	buildContext(t, e.build, name, filepath.Join("testdata", "pipfn"))
	writeRequirements(t, e, name, requirements)
	return types.FunctionDeployment{Service: name, Image: name + ":latest"}
}

func writeRequirements(t *testing.T, e *env, name, requirements string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.build, name, "function", "requirements.txt"), []byte(requirements), 0o644); err != nil {
		t.Fatal(err)
	}
}

// pipDeadline bounds waits that include a pip install: minutes on a loaded machine.
const pipDeadline = 5 * time.Minute

func waitPip(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(pipDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting %s for %s", pipDeadline, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitPipReady(t *testing.T, b *Backend, name string, n uint64) {
	t.Helper()
	waitPip(t, fmt.Sprintf("%s to have %d ready replicas", name, n), func() bool {
		st, err := b.Status(context.Background(), "", name)
		return err == nil && st.AvailableReplicas == n
	})
}

type pipReply struct {
	Six        string `json:"six"`
	SixFile    string `json:"six_file"`
	Prefix     string `json:"prefix"`
	VirtualEnv string `json:"virtual_env"`
}

func invokePip(t *testing.T, b *Backend, name string) pipReply {
	t.Helper()
	code, out := invoke(t, b, name, "/", "")
	var r pipReply
	if code != http.StatusOK || json.Unmarshal(out, &r) != nil {
		t.Fatalf("invoking %s: %d %s", name, code, out)
	}
	return r
}

// Two functions with the same requirements (spelled differently), deployed at once, get one environment: pip runs
// once, the second function downloads and copies nothing. A restarted backend reuses it without running pip.
func TestFunctionsWithTheSameRequirementsShareOneEnvironment(t *testing.T) {
	needPip(t)
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	fns := []types.FunctionDeployment{
		pipFunction(t, e, "pip-a", "six==1.17.0\n"),
		pipFunction(t, e, "pip-b", "# the same package\n  six==1.17.0   # pinned\n"),
	}
	var wg sync.WaitGroup
	for _, fd := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Deploy(ctx, fd); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	waitPipReady(t, b, "pip-a", 1)
	waitPipReady(t, b, "pip-b", 1)
	a, c := invokePip(t, b, "pip-a"), invokePip(t, b, "pip-b")
	envDir := filepath.Join(e.state, "envs")
	if a.Six != "1.17.0" || a.Prefix != c.Prefix || a.SixFile != c.SixFile || a.VirtualEnv != a.Prefix ||
		!strings.HasPrefix(a.Prefix, envDir+string(filepath.Separator)) {
		t.Fatalf("pip-a %+v, pip-b %+v: want six 1.17.0 from one environment under %s", a, c, envDir)
	}
	if st := b.envs.Stats(); st.Installs != 1 || st.Reuses != 1 || st.Failures != 0 {
		t.Fatalf("environment stats %+v: want one install, reused once", st)
	}
	// Exactly one function's log shows pip downloading and installing; both show which environment they use.
	installed := 0
	for _, name := range []string{"pip-a", "pip-b"} {
		text := logText(t, b, name)
		if strings.Contains(text, "pip: Collecting six==1.17.0") {
			installed++
			if !strings.Contains(text, "pip: Successfully installed six-1.17.0") {
				t.Errorf("%s's log shows pip collecting but not installing:\n%s", name, text)
			}
		}
		if !strings.Contains(text, filepath.Base(a.Prefix)) {
			t.Errorf("%s's log does not name the environment %s:\n%s", name, filepath.Base(a.Prefix), text)
		}
	}
	if installed != 1 {
		t.Fatalf("%d functions' logs show pip installing, want exactly 1", installed)
	}
	if st, err := b.Status(ctx, "", "pip-a"); err != nil || st.Annotations != nil {
		t.Fatalf("Status of a ready function: %+v, %v; want no status annotation", st.Annotations, err)
	}

	// Restart: the environment is reused, pip does not run.
	ctxClose, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := b.Close(ctxClose); err != nil {
		t.Fatal(err)
	}
	b2 := e.open(t)
	waitPipReady(t, b2, "pip-a", 1)
	waitPipReady(t, b2, "pip-b", 1)
	if again := invokePip(t, b2, "pip-a"); again.Prefix != a.Prefix {
		t.Fatalf("after a restart pip-a runs in %s, want %s", again.Prefix, a.Prefix)
	}
	if st := b2.envs.Stats(); st.Installs != 0 || st.Reuses != 2 {
		t.Fatalf("restarted backend's environment stats %+v: want no install, two reuses", st)
	}
}

// A failed install is a clear error on the function (Status, Resolve, logs; pip's reason in the logs only), not a
// crash loop: more replicas do
// not run pip again; an update with fixed requirements does.
func TestFailedInstallIsAClearErrorNotACrashLoop(t *testing.T) {
	needPip(t)
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	fd := pipFunction(t, e, "broken", "faas-gpu-no-such-package==1.0\n")
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	const reason = "No matching distribution found for faas-gpu-no-such-package==1.0"
	// A request waiting for the function (the first call after a deploy) is answered with the reason as soon as the
	// install fails, not when its wait runs out.
	routed := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		_, _, err := b.Route(rctx, "", "broken")
		routed <- err
	}()
	const public = "installing its requirements (function/requirements.txt) failed"
	waitPip(t, "the failure in the function's status", func() bool {
		st, err := b.Status(ctx, "", "broken")
		return err == nil && st.Annotations != nil && strings.Contains((*st.Annotations)[StatusAnnotation], public)
	})
	st, _ := b.Status(ctx, "", "broken")
	if text := (*st.Annotations)[StatusAnnotation]; !strings.HasPrefix(text, "failed: ") || st.AvailableReplicas != 0 {
		t.Fatalf("status %q, %d available", text, st.AvailableReplicas)
	}
	_, err := b.Resolve(ctx, "", "broken")
	if !errors.Is(err, provider.ErrFailed) || !strings.Contains(err.Error(), public) ||
		strings.Contains(err.Error(), reason) || provider.StatusCode(err) != http.StatusServiceUnavailable {
		t.Fatalf("Resolve = %v, want ErrFailed (503) saying the install failed, without pip's words", err)
	}
	var routeErr error
	waitPip(t, "the waiting request's answer", func() bool {
		select {
		case routeErr = <-routed:
			return true
		default:
			return false
		}
	})
	if !errors.Is(routeErr, provider.ErrFailed) || !strings.Contains(routeErr.Error(), public) ||
		strings.Contains(routeErr.Error(), reason) {
		t.Fatalf("Route = %v, want ErrFailed saying the install failed, without pip's words", routeErr)
	}
	waitPip(t, "the replica giving up", func() bool {
		return strings.Contains(logText(t, b, "broken"), "not restarting until the function is updated")
	})
	if !strings.Contains(logText(t, b, "broken"), "pip: ERROR: "+reason) {
		t.Fatalf("pip's error is not in the function's log:\n%s", logText(t, b, "broken"))
	}
	if text := logText(t, b, "broken"); strings.Contains(text, "cannot start: cannot start") ||
		!strings.Contains(text, "cannot start: function \"broken\"") {
		t.Fatalf("the function's log says why it cannot start once, naming it:\n%s", text)
	}

	// Two more replicas: they report the same failure without running pip, and no process is started.
	if err := b.Scale(ctx, "", "broken", 3); err != nil {
		t.Fatal(err)
	}
	waitPip(t, "three replicas giving up", func() bool {
		return strings.Count(logText(t, b, "broken"), "not restarting until the function is updated") == 3
	})
	if s := b.envs.Stats(); s.Installs != 1 || s.Failures != 1 {
		t.Fatalf("environment stats %+v: want the one failed install", s)
	}
	if pids := b.pids("broken"); len(pids) != 0 {
		t.Fatalf("processes %v run for a function whose install failed", pids)
	}

	// An update with requirements that install makes it start.
	writeRequirements(t, e, "broken", "six==1.17.0\n")
	if err := b.Update(ctx, fd); err != nil {
		t.Fatal(err)
	}
	waitPipReady(t, b, "broken", 3)
	if r := invokePip(t, b, "broken"); r.Six != "1.17.0" {
		t.Fatalf("after the fix: %+v", r)
	}
	if st, _ := b.Status(ctx, "", "broken"); st.Annotations != nil {
		t.Fatalf("status after the fix still has %v", *st.Annotations)
	}
}

// Requirements the environment's key could not cover are refused at deploy, naming the file and line.
func TestDeployRefusesRequirementsThatIncludeOtherFiles(t *testing.T) {
	needPython(t)
	e := newEnv(t)
	b := e.open(t)
	fd := pipFunction(t, e, "includes", "six==1.17.0\n-r more.txt\n")
	err := b.Deploy(context.Background(), fd)
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "function/requirements.txt line 2") {
		t.Fatalf("Deploy = %v, want ErrInvalid naming function/requirements.txt line 2", err)
	}
}

func TestInterpreterAndEnvVarsOfAnEnvironment(t *testing.T) {
	b := &Backend{cfg: Config{Python: "/usr/bin/python3.11"}}
	env := &venv.Env{Name: "py3.11-0123456789abcdef", Dir: "/envs/py3.11-0123456789abcdef",
		Python: "/envs/py3.11-0123456789abcdef/bin/python3"}
	for _, tc := range []struct{ in, want string }{
		{"python3 index.py", env.Python + " index.py"},
		{"python index.py", env.Python + " index.py"},
		{"/usr/bin/python3.11 index.py", env.Python + " index.py"},
		{"node index.js", "node index.js"},
	} {
		if got := strings.Join(b.interpreter(strings.Fields(tc.in), env), " "); got != tc.want {
			t.Errorf("interpreter(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if got := strings.Join(b.interpreter(strings.Fields(tc.in), nil), " "); got != tc.in {
			t.Errorf("interpreter(%q) without an environment = %q", tc.in, got)
		}
	}
	vars := envVars([]string{"A=1", "PATH=/usr/bin:/bin", "PYTHONHOME=/x", "VIRTUAL_ENV=/old"}, env)
	want := []string{"A=1", "PATH=" + env.Dir + "/bin:/usr/bin:/bin", "VIRTUAL_ENV=" + env.Dir}
	if strings.Join(vars, " ") != strings.Join(want, " ") {
		t.Errorf("envVars = %q, want %q", vars, want)
	}
}

// writeSixWheel writes six-1.17.0-py3-none-any.whl into dir: a one-module wheel standing in for the real six
// (pipfn reads its __version__), so that the install needs no index.
func writeSixWheel(t *testing.T, dir string) {
	t.Helper()
	files := [][2]string{
		{"six.py", "__version__ = \"1.17.0\"\n"},
		{"six-1.17.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: six\nVersion: 1.17.0\n"},
		{"six-1.17.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: faas-gpu-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record []string
	for _, f := range append(files, [2]string{"six-1.17.0.dist-info/RECORD", ""}) {
		text := f[1]
		if f[0] == "six-1.17.0.dist-info/RECORD" {
			text = strings.Join(append(record, f[0]+",,"), "\n") + "\n"
		} else {
			sum := sha256.Sum256([]byte(text))
			record = append(record, fmt.Sprintf("%s,sha256=%s,%d", f[0], base64.RawURLEncoding.EncodeToString(sum[:]),
				len(text)))
		}
		w, err := z.Create(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(text)); err != nil {
			t.Fatal(err)
		}
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "six-1.17.0-py3-none-any.whl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A backend that sandboxes its functions installs their requirements in a sandbox too (no index: a wheel folder
// named by the operator's PIP_FIND_LINKS; requirements may name none): the function's log says so and carries pip's lines, the environment ends owned by
// this process's user and read-only to others, and the function, under its own ids, runs on it.
func TestRequirementsInstallInASandbox(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("sandboxes are Linux only")
	}
	needPython(t)
	if out, err := exec.Command("python3", "-c", "import venv, ensurepip").CombinedOutput(); err != nil {
		t.Skipf("python3 with the venv and ensurepip modules is needed (Debian: python3-venv): %v %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb := newSandbox(ctx, t)
	e := newEnv(t)
	e.cfg.Sandbox = sb
	wheels := filepath.Join(filepath.Dir(e.state), "wheels")
	if err := os.Mkdir(wheels, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(e.state), 0o755); err != nil { // t.TempDir is 0700: the install reads wheels
		t.Fatal(err)
	}
	writeSixWheel(t, wheels)
	t.Setenv("PIP_FIND_LINKS", wheels)
	t.Setenv("PIP_NO_INDEX", "1")
	b := e.open(t)
	if err := b.Deploy(context.Background(), pipFunction(t, e, "pip-sandboxed", "six==1.17.0\n")); err != nil {
		t.Fatal(err)
	}
	waitPipReady(t, b, "pip-sandboxed", 1)
	r := invokePip(t, b, "pip-sandboxed")
	envDir := filepath.Join(e.state, "envs")
	if r.Six != "1.17.0" || !strings.HasPrefix(r.Prefix, envDir+string(filepath.Separator)) {
		t.Fatalf("pip-sandboxed %+v: want six 1.17.0 from an environment under %s", r, envDir)
	}
	text := logText(t, b, "pip-sandboxed")
	for _, want := range []string{"faas-gpu: installing in a sandbox as uid", "pip: Processing " + wheels,
		"pip: Successfully installed six-1.17.0"} {
		if !strings.Contains(text, want) {
			t.Errorf("the function's log lacks %q:\n%s", want, text)
		}
	}
	err := filepath.WalkDir(r.Prefix, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() ||
			(fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0) {
			return fmt.Errorf("%s: uid %d, mode %v; want uid %d and nothing writable by others", p, st.Uid,
				fi.Mode(), os.Getuid())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
