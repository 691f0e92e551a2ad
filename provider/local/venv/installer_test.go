//go:build linux

package venv

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func TestMain(m *testing.M) {
	if sandbox.IsInit() { // an install's sandbox: this test binary started again
		os.Exit(sandbox.RunInit())
	}
	if os.Getenv(asUserEnv) == "1" { // the unprivileged half of TestSandboxedInstallAsUnprivilegedUser
		os.Exit(unprivilegedInstallMain())
	}
	testkit.VerifyNoLeaks(m) // an install's watcher (which kills pip when its context ends) ends with the install
}

// hostileBackend is the build backend of the sdist hostile-1.0: the code a package's author runs during pip install.
// It tries what such code would against the platform (constants C, filled in by the test), then builds a wheel
// whose hostile.REPORT says, as JSON, what each attempt got.
const hostileBackend = `import base64, hashlib, json, os, zipfile
C = json.loads(%q)
out = {}
def attempt(name, f):
    try:
        r = f()
        out[name] = "ok" if r is None else r
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
def write(path):
    with open(path, "w") as f:
        f.write("planted by an install")
def scan_environs():
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if C["secret"].encode() in open("/proc/%%s/environ" %% p, "rb").read():
                    found.append(int(p))
            except OSError:
                pass
    return found
def traps():
    # Left in the environment for the platform to trip over once the install has ended.
    used = os.path.join(C["target"], ".faas-gpu-used")
    if not os.path.lexists(used):
        os.symlink(C["victim"], used)
    with open(os.path.join(C["target"], ".faas-gpu-env"), "w") as f:
        f.write('{"forged": true}')
    p = os.path.join(C["target"], "bin", "setuid-program")
    write(p)
    os.chmod(p, 0o6777)
    d = os.path.join(C["target"], "locked")
    os.makedirs(d, exist_ok=True)
    write(os.path.join(d, "f"))
    os.chmod(d, 0o500)
def attack():
    attempt("uid", os.getuid)
    attempt("environ", lambda: sorted(os.environ))
    attempt("secret_in_environ", lambda: [k for k, v in os.environ.items() if C["secret"] in v])
    attempt("read_up_environ", lambda: open("/proc/%%d/environ" %% C["up_pid"], "rb").read().decode(errors="replace"))
    attempt("secret_in_any_environ", scan_environs)
    attempt("signal_up", lambda: os.kill(C["up_pid"], 0))
    for name, p in sorted(C["reads"].items()):
        attempt("read_" + name, lambda p=p: open(p).read())
    attempt("list_state", lambda: os.listdir(C["state"]))
    for name, p in sorted(C["writes"].items()):
        attempt("write_" + name, lambda p=p: write(p))
    attempt("write_target", lambda: write(os.path.join(C["target"], "planted")))
    attempt("write_home", lambda: write(os.path.join(os.environ["HOME"], "planted")))
    attempt("traps", traps)
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    attack()
    name = "hostile-1.0-py3-none-any.whl"
    files = {
        "hostile.py": "REPORT = %%r\n" %% json.dumps(out),
        "hostile-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hostile\nVersion: 1.0\n",
        "hostile-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hostile\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for n, text in files.items():
            data = text.encode()
            z.writestr(n, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%%s,sha256=%%s,%%d" %% (n, digest, len(data)))
        record.append("hostile-1.0.dist-info/RECORD,,")
        z.writestr("hostile-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return name
`

// writeSdist writes hostile-1.0.tar.gz into dir: an sdist whose in-tree build backend is hostileBackend with
// constants c.
func writeSdist(t testing.TB, dir string, c map[string]any) {
	t.Helper()
	consts, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	files := []struct{ name, text string }{
		{"hostile-1.0/PKG-INFO", "Metadata-Version: 2.1\nName: hostile\nVersion: 1.0\n"},
		{"hostile-1.0/pyproject.toml", "[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n"},
		{"hostile-1.0/backend.py", fmt.Sprintf(hostileBackend, consts)},
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.text)),
			ModTime: time.Unix(1700000000, 0), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.text)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hostile-1.0.tar.gz"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeWheel writes benign-1.0-py3-none-any.whl into dir: a pure-Python wheel whose module says VALUE = 42.
func writeWheel(t testing.TB, dir string) {
	t.Helper()
	files := []struct{ name, text string }{
		{"benign.py", "VALUE = 42\n"},
		{"benign-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: benign\nVersion: 1.0\n"},
		{"benign-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: faas-gpu-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record []string
	for _, f := range files {
		w, err := z.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(f.text)); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(f.text))
		record = append(record, fmt.Sprintf("%s,sha256=%s,%d", f.name,
			base64.RawURLEncoding.EncodeToString(sum[:]), len(f.text)))
	}
	record = append(record, "benign-1.0.dist-info/RECORD,,")
	w, err := z.Create("benign-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(strings.Join(record, "\n") + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "benign-1.0-py3-none-any.whl"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// installPython returns a python3 with the venv and ensurepip modules that any user may run: the system's
// (/usr/bin/python3) where it has them, else python3 on PATH; "" and the reason when there is none.
func installPython() (string, string) {
	var reasons []string
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		out, err := exec.Command(p, "-c", "import venv, ensurepip").CombinedOutput()
		if err == nil {
			return p, ""
		}
		reasons = append(reasons, fmt.Sprintf("%s: %v %s", p, err, bytes.TrimSpace(out)))
	}
	return "", "python3 with the venv and ensurepip modules is needed (Debian: python3-venv): " +
		strings.Join(reasons, "; ")
}

// The secret of the platform an install must not see: in this process's environment under names of the
// platform's credentials, and in files of its state dir.
const installSecret = "faas-gpu-install-test-secret-4b1d"

// hostileInstall is one run of the scenario: a platform (this process) with a state dir holding its key and
// password, an environment cache holding another environment, and a wheel folder with the hostile sdist and a
// benign wheel, installed by a Manager with a sandbox. It returns what to check.
type hostileInstall struct {
	Err      string          `json:"err"`
	Progress string          `json:"progress"`
	Report   json.RawMessage `json:"report"` // hostile.REPORT
	Env      *Env            `json:"env"`
	Problems []string        `json:"problems"` // what the scenario checked itself (the files, the sealing)
	Sandbox  string          `json:"sandbox"`
}

func runHostileInstall(ctx context.Context, work, python string) (*hostileInstall, error) {
	res := &hostileInstall{}
	problem := func(format string, args ...any) { res.Problems = append(res.Problems, fmt.Sprintf(format, args...)) }
	sb, err := sandbox.New(ctx, sandbox.Config{Mode: sandbox.ModeRequired})
	if err != nil {
		return nil, err
	}
	res.Sandbox = sb.Report().Summary()
	state := filepath.Join(work, "state")
	envs := filepath.Join(work, "envs")
	links := filepath.Join(work, "wheels")
	for _, d := range []string{state, envs, links} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// Readable by everyone (0644): only the sandbox's view keeps an install from them.
	key, password := filepath.Join(state, "gpuserver.key"), filepath.Join(state, "basic-auth-password")
	victim := filepath.Join(work, "victim")
	other := filepath.Join(envs, "py3.11-0000000000000009")
	for p, text := range map[string]string{key: installSecret, password: installSecret, victim: "unchanged",
		filepath.Join(other, ".faas-gpu-env"): "{}", filepath.Join(other, "lib", "module.py"): "VALUE = 1\n"} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return nil, err
		}
	}
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(victim, past, past); err != nil {
		return nil, err
	}
	m, err := Open(Config{Dir: envs, Python: python, Sandbox: sb, InstallTimeout: 10 * time.Minute})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	// The wheel folder is the operator's setting (PIP_FIND_LINKS, set by the caller), as offline installs do: the
	// requirements may name no local folder.
	if got := os.Getenv("PIP_FIND_LINKS"); got != links {
		return nil, fmt.Errorf("PIP_FIND_LINKS is %q, want the scenario's wheel folder %s", got, links)
	}
	req := Requirements{Files: []string{"function/requirements.txt"}}
	if req.Lines, err = Parse("function/requirements.txt",
		[]byte("--no-index\nhostile==1.0\nbenign==1.0\n")); err != nil {
		return nil, err
	}
	// Requirements that name the state dir as a wheel folder (the third round's attack: shown to the install, it
	// listed the state dir and read the key and both passwords) are never installed, even made without Parse.
	for _, line := range []string{"--find-links " + state, "--find-links=file://" + state, "-f" + state,
		"--find " + state, "--index-url " + state, "--extra-index-url file://" + state} {
		hostileReq := Requirements{Files: []string{"function/requirements.txt"}, Lines: []string{line, "hostile==1.0"}}
		var progress testkit.Buffer
		env, err := m.Ensure(ctx, hostileReq, &progress)
		opt, _, _ := strings.Cut(strings.Fields(line)[0], "=")
		if len(opt) > 2 && !strings.HasPrefix(opt, "--") {
			opt = opt[:2]
		}
		if err == nil || !errors.Is(err, ErrInvalidRequirements) || !strings.Contains(err.Error(), opt) {
			problem("requirements %q: Ensure = %v, %v; want ErrInvalidRequirements naming %s\n%s", line, env, err, opt,
				progress.String())
		}
		if strings.Contains(progress.String(), "installing") {
			problem("requirements %q: an install started:\n%s", line, progress.String())
		}
	}
	name, err := m.Name(ctx, req)
	if err != nil {
		return nil, err
	}
	target := filepath.Join(envs, name)
	py, err := m.python(ctx)
	if err != nil {
		return nil, err
	}
	// Outside the test's folder, the files a failure would leave are removed again.
	planted := "faas-gpu-install-test-planted"
	system := []string{filepath.Join(py.prefixes[0], planted), filepath.Join("/usr", planted)}
	defer func() {
		for _, p := range system {
			if _, err := os.Lstat(p); err == nil {
				_ = os.Remove(p)
			}
		}
	}()
	writeSdist(nopT{}, links, map[string]any{
		"secret": installSecret, "up_pid": os.Getpid(), "state": state, "target": target, "victim": victim,
		"reads": map[string]string{"key": key, "password": password, "other_env": filepath.Join(other, "lib", "module.py"),
			"victim": victim},
		"writes": map[string]string{"env_cache": filepath.Join(envs, "planted"), "other_env": filepath.Join(other, "lib", "planted.py"),
			"state": filepath.Join(state, "planted"), "python": system[0],
			"wheels": filepath.Join(links, "planted"), "victim": victim, "usr": system[1],
			"build": filepath.Join(target+buildSuffix, "planted")},
	})
	writeWheel(nopT{}, links)

	var progress testkit.Buffer
	env, err := m.Ensure(ctx, req, &progress)
	res.Progress = progress.String()
	if err != nil {
		res.Err = err.Error()
		return res, nil
	}
	res.Env = env
	out, err := exec.Command(env.Python, "-c", "import benign, hostile; assert benign.VALUE == 42; print(hostile.REPORT)").
		CombinedOutput()
	if err != nil {
		problem("importing the installed packages: %v: %s", err, out)
	} else {
		res.Report = json.RawMessage(bytes.TrimSpace(out))
	}

	// Nothing planted outside the environment; the victim untouched through the link left for the platform.
	for _, p := range []string{filepath.Join(envs, "planted"), filepath.Join(other, "lib", "planted.py"),
		filepath.Join(state, "planted"), system[0], system[1], filepath.Join(links, "planted"),
		target + buildSuffix} {
		if _, err := os.Lstat(p); err == nil {
			problem("%s exists after the install", p)
		}
	}
	if data, err := os.ReadFile(victim); err != nil || string(data) != "unchanged" {
		problem("the victim file says %q (%v)", data, err)
	}
	if st, err := os.Stat(victim); err != nil || !st.ModTime().Equal(past) {
		problem("the victim file's time changed: %v (%v)", st.ModTime(), err)
	}
	// The marker is the platform's, not the one the install forged; the used stamp a file, not the link.
	var mk marker
	if data, err := os.ReadFile(filepath.Join(target, markerFile)); err != nil || json.Unmarshal(data, &mk) != nil ||
		len(mk.Requirements) != len(req.Lines) {
		problem("the environment's marker is %q (%v), want the platform's", data, err)
	}
	if st, err := os.Lstat(filepath.Join(target, usedFile)); err != nil || !st.Mode().IsRegular() {
		problem("the used stamp is %v (%v), want a regular file", st.Mode(), err)
	}
	// Sealed: owned by this user, nothing writable by others, no set-id bits.
	uid := uint32(os.Getuid())
	err = filepath.WalkDir(target, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid {
			problem("%s belongs to uid %d, want %d", p, st.Uid, uid)
		}
		if fi.Mode()&fs.ModeSymlink == 0 && (fi.Mode().Perm()&0o022 != 0 || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0) {
			problem("%s has mode %v", p, fi.Mode())
		}
		return nil
	})
	if err != nil {
		problem("walking the environment: %v", err)
	}
	// A function on the environment, sandboxed as functions are, reads it and cannot change it.
	fnScript := `import json, os, sys, benign
out = {"value": benign.VALUE}
for name, p in [("module", benign.__file__), ("new_file", os.path.join(sys.prefix, "planted"))]:
    try:
        open(p, "a").write("x")
        out[name] = "ok"
    except OSError as e:
        out[name] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))`
	root := filepath.Join(work, "fn-root")
	if err := os.Mkdir(root, 0o700); err != nil {
		return nil, err
	}
	cmd, release, err := sb.Command(sandbox.Spec{Argv: []string{env.Python, "-c", fnScript}, Dir: "/", Root: root,
		Hostname: "fn", ReadOnly: append(append(sandbox.SystemPaths(), py.prefixes...), env.Dir),
		ID: sb.Identity("fn"), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		return nil, err
	}
	var fnOut, fnErr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &fnOut, &fnErr
	err = cmd.Start()
	release()
	if err == nil {
		err = cmd.Wait()
	}
	var fn map[string]any
	if err != nil || json.Unmarshal(fnOut.Bytes(), &fn) != nil {
		problem("a function on the environment: %v: %s %s", err, fnOut.String(), fnErr.String())
	} else {
		if fn["value"] != float64(42) {
			problem("a function on the environment reads benign.VALUE = %v", fn["value"])
		}
		for _, k := range []string{"module", "new_file"} {
			if v, _ := fn[k].(string); !strings.Contains(v, "Error") {
				problem("a function on the environment wrote it (%s: %v)", k, fn[k])
			}
		}
	}
	return res, nil
}

// nopT lets the file writers run outside a test (in the unprivileged half), panicking on failure.
type nopT struct{ testing.TB }

func (nopT) Helper()                   {}
func (nopT) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (nopT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

// checkHostileInstall fails the test for every attempt of the install's code that got through.
func checkHostileInstall(t *testing.T, res *hostileInstall, wantUIDAbove uint32) {
	t.Helper()
	t.Logf("sandbox: %s", res.Sandbox)
	if res.Err != "" {
		t.Fatalf("the install failed: %s\nprogress:\n%s", res.Err, res.Progress)
	}
	for _, p := range res.Problems {
		t.Error(p)
	}
	// pip's lines flow to the progress writer.
	for _, want := range []string{"faas-gpu: installing in a sandbox as uid", "Processing ",
		"Successfully installed benign-1.0 hostile-1.0"} {
		if !strings.Contains(res.Progress, want) {
			t.Errorf("progress lacks %q:\n%s", want, res.Progress)
		}
	}
	var report map[string]any
	if err := json.Unmarshal(res.Report, &report); err != nil {
		t.Fatalf("the install's report %q: %v", res.Report, err)
	}
	defer func() {
		if t.Failed() || os.Getenv("VENV_TEST_VERBOSE") != "" {
			t.Logf("progress:\n%s", res.Progress)
			for k, v := range report {
				t.Logf("%s: %v", k, v)
			}
		}
	}()
	for k, v := range report {
		got, _ := v.(string)
		switch {
		case strings.HasPrefix(k, "read_"), strings.HasPrefix(k, "write_") && k != "write_target" && k != "write_home",
			k == "list_state", k == "signal_up":
			if !strings.Contains(got, "Error") {
				t.Errorf("the install's code: %s got through: %v", k, v)
			}
		case k == "write_target", k == "write_home", k == "traps":
			if v != "ok" {
				t.Errorf("the install's code: %s = %v, want ok (its own environment and home are writable)", k, v)
			}
		}
	}
	for _, k := range []string{"secret_in_environ", "secret_in_any_environ"} {
		if found, ok := report[k].([]any); !ok || len(found) != 0 {
			t.Errorf("the install's code found the platform's secret: %s = %v", k, report[k])
		}
	}
	env, _ := report["environ"].([]any)
	for _, k := range env {
		if s, _ := k.(string); strings.HasPrefix(s, "FAAS_GPU") || strings.Contains(s, "PASSWORD") {
			t.Errorf("the install's environment has %s", s)
		}
	}
	if uid, _ := report["uid"].(float64); wantUIDAbove > 0 && uint32(uid) <= wantUIDAbove {
		t.Errorf("the install ran as uid %v, want one of the sandbox's range above %d", report["uid"], wantUIDAbove)
	}
}

// TestSandboxedInstallOfAHostilePackage installs, with a real pip and no index, an sdist whose build backend
// attacks the platform (reads the key, the password and /proc/<platform>/environ, lists the state dir, signals the
// platform, writes beside its environment, into another environment, into the interpreter, the wheel folder and the
// state dir, and leaves a link and a forged marker for the platform to trip over) beside a benign wheel: every
// attempt fails, the install succeeds, pip's lines reach the progress writer, and the environment ends sealed and
// read-only to a function on it. As root the install runs under ids of its own.
func TestSandboxedInstallOfAHostilePackage(t *testing.T) {
	python, why := installPython()
	if python == "" {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if s, err := sandbox.New(ctx, sandbox.Config{}); err != nil || !s.Enabled() {
		t.Skipf("this kernel does not allow sandboxes: %v %s", err, s.Report().Reason)
	}
	t.Setenv("FAAS_GPU_GPUSERVER_KEY", installSecret)
	t.Setenv("NATS_PASSWORD", installSecret)
	t.Setenv("PIP_NO_INDEX", "1") // pip's settings pass; the platform's do not
	work := t.TempDir()
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PIP_FIND_LINKS", filepath.Join(work, "wheels"))
	start := time.Now()
	res, err := runHostileInstall(ctx, work, python)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("install and checks in %s", time.Since(start).Round(100*time.Millisecond))
	var above uint32
	if os.Geteuid() == 0 {
		above = sandbox.DefaultFirstID
	}
	checkHostileInstall(t, res, above)
}

// asUserEnv makes this test binary the unprivileged half of TestSandboxedInstallAsUnprivilegedUser.
const asUserEnv = "FAAS_GPU_VENV_TEST_AS_USER"

// exitNoUserNS is the unprivileged half's status when the kernel refuses it a user namespace.
const exitNoUserNS = 3

// unprivilegedInstallMain runs the scenario as the platform would as an unprivileged user (the secret is in this
// process's own environment, as up's flags' variables would be) and prints its result as JSON.
func unprivilegedInstallMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := runHostileInstall(ctx, os.Getenv("FAAS_GPU_VENV_TEST_DIR"), os.Getenv("FAAS_GPU_VENV_TEST_PYTHON"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, sandbox.ErrUnavailable) {
			return exitNoUserNS
		}
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// TestSandboxedInstallAsUnprivilegedUser runs TestSandboxedInstallOfAHostilePackage's scenario as nobody (through
// setpriv), the way `faas-gpu up` installs when it is not root: a user namespace of one id, the platform's secrets
// in its own environment.
func TestSandboxedInstallAsUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestSandboxedInstallOfAHostilePackage has run as an unprivileged user already")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed: cannot become an unprivileged user")
	}
	python, why := installPython()
	if python == "" {
		t.Skip(why)
	}
	if !filepath.IsAbs(python) {
		t.Skip("no python3 outside root's home for nobody to run (want /usr/bin/python3 with venv and ensurepip)")
	}
	const nobody = 65534
	dir, err := os.MkdirTemp("", "faas-gpu-venv-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeAll(dir) })
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "venv.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, work} {
		if err := os.Chown(p, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", bin)
	cmd.Env = []string{asUserEnv + "=1", "FAAS_GPU_VENV_TEST_DIR=" + work, "FAAS_GPU_VENV_TEST_PYTHON=" + python,
		"FAAS_GPU_GPUSERVER_KEY=" + installSecret, "NATS_PASSWORD=" + installSecret, "PIP_NO_INDEX=1",
		"PIP_FIND_LINKS=" + filepath.Join(work, "wheels"),
		"HOME=" + work, "TMPDIR=" + work, "PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == exitNoUserNS {
		t.Skipf("the kernel refuses unprivileged user namespaces: %s", stderr.String())
	}
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, stderr.String())
	}
	t.Logf("install and checks as nobody in %s", time.Since(start).Round(100*time.Millisecond))
	var res hostileInstall
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("result %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	checkHostileInstall(t, &res, 0)
}

// installEnv keeps the machine's variables and pip's and the proxies' settings only, makes their local paths
// absolute and names them to be shown.
func TestInstallEnv(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	env, shown := installEnv([]string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC",
		"FAAS_GPU_GPUSERVER_KEY=secret", "NATS_PASSWORD=secret", "HOME=/root", "AWS_SECRET_ACCESS_KEY=secret",
		"PIP_INDEX_URL=https://user:token@pypi.example/simple", "PIP_FIND_LINKS=wheels https://example.org/w file:///opt/w",
		"PIP_CERT=ca.pem", "HTTPS_PROXY=http://proxy:3128", "no_proxy=localhost", "PIP_TARGET=/elsewhere",
		"PYTHONPATH=/x", "PIP_NO_INDEX=1"}, "/envs/py3.11-x.build/tmp")
	want := []string{"HOME=/envs/py3.11-x.build/tmp", "HTTPS_PROXY=http://proxy:3128", "LANG=C.UTF-8", "LC_ALL=C",
		"PATH=/usr/bin:/bin", "PIP_CERT=" + filepath.Join(cwd, "ca.pem"),
		"PIP_FIND_LINKS=" + filepath.Join(cwd, "wheels") + " https://example.org/w file:///opt/w",
		"PIP_INDEX_URL=https://user:token@pypi.example/simple", "PIP_NO_CACHE_DIR=1", "PIP_NO_INDEX=1",
		"TMPDIR=/envs/py3.11-x.build/tmp", "TZ=UTC", "no_proxy=localhost"}
	want = append(want, pipProgressEnv...)
	if strings.Join(env, "\n") != strings.Join(want, "\n") {
		t.Errorf("installEnv:\n%s\nwant\n%s", strings.Join(env, "\n"), strings.Join(want, "\n"))
	}
	sort.Strings(shown)
	wantShown := []string{filepath.Join(cwd, "ca.pem"), filepath.Join(cwd, "wheels"), "/opt/w"}
	sort.Strings(wantShown)
	if strings.Join(shown, " ") != strings.Join(wantShown, " ") {
		t.Errorf("shown %v, want %v", shown, wantShown)
	}
}

// The install's sandbox shows the folders the operator's settings name and none that the requirements name: with
// `--find-links <state dir>` in the requirements (the third round's attack, which listed the state dir and read
// the key and both passwords), the state dir is not among what the install sees.
func TestInstallerShowsNothingTheRequirementsName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := sandbox.New(ctx, sandbox.Config{})
	if err != nil || !sb.Enabled() {
		t.Skipf("this kernel does not allow sandboxes: %v", err)
	}
	work := t.TempDir()
	state := filepath.Join(work, "state")
	wheels := filepath.Join(work, "wheels")
	env := &Env{Name: "py3.11-x", Dir: filepath.Join(work, "envs", "py3.11-x")}
	if err := os.MkdirAll(filepath.Dir(env.Dir), 0o700); err != nil {
		t.Fatal(err)
	}
	req := Requirements{Lines: []string{"--find-links " + state, "-f" + state + "/run", "--index-url file://" + state,
		"six==1.17.0"}}
	in, err := newInstaller(sb, env, req, interp{prefixes: []string{"/usr"}}, []string{"PIP_FIND_LINKS=" + wheels})
	if err != nil {
		t.Fatal(err)
	}
	defer in.close()
	for _, p := range in.shown {
		if p == state || strings.HasPrefix(p, state+"/") {
			t.Errorf("the install is shown %s, which only the requirements name", p)
		}
	}
	if !strings.Contains(strings.Join(in.shown, " "), wheels) {
		t.Errorf("the install is not shown the operator's PIP_FIND_LINKS %s: %v", wheels, in.shown)
	}
}
