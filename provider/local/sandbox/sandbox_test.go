//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func TestMain(m *testing.M) {
	if IsInit() {
		os.Exit(RunInit())
	}
	if os.Getenv("SANDBOX_TEST_AS_USER") == "1" { // the unprivileged half of TestUnprivilegedUser
		os.Exit(unprivilegedMain())
	}
	testkit.VerifyNoLeaks(m) // a sandboxed process's reaper ends with its process
}

// escapeScript is the program a test runs in a sandbox: it tries what a hostile function would and prints what
// happened as JSON.
const escapeScript = `
import json, os, signal, socket, sys
out = {}
def attempt(name, f):
    try:
        r = f()
        out[name] = "ok" if r is None else r
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
platform = int(os.environ["PLATFORM_PID"])
attempt("pid", lambda: os.getpid())
attempt("uid", lambda: os.getuid())
attempt("procs", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
attempt("read_platform_environ", lambda: open("/proc/%d/environ" % platform, "rb").read().decode(errors="replace"))
attempt("read_hidden", lambda: open(os.environ["HIDDEN"]).read())
attempt("list_hidden_dir", lambda: os.listdir(os.path.dirname(os.environ["HIDDEN"])))
attempt("kill_platform", lambda: os.kill(platform, signal.SIGTERM))
attempt("kill_all", lambda: os.kill(-1, signal.SIGTERM))
attempt("read_init_environ", lambda: open("/proc/1/environ", "rb").read())
sock = os.environ["SOCK"]
attempt("unlink_socket", lambda: os.unlink(sock))
attempt("rename_socket", lambda: os.rename(sock, sock + ".x"))
attempt("chmod_socket", lambda: os.chmod(sock, 0o777))
def listen():
    s = socket.socket(socket.AF_UNIX)
    s.bind(sock)
attempt("listen_on_socket", listen)
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"hello")
    s.close()
attempt("connect_socket", connect)
attempt("write_shown", lambda: open(os.path.join(os.environ["SHOWN"], "x"), "w").write("x"))
attempt("read_shown", lambda: open(os.path.join(os.environ["SHOWN"], "data")).read())
attempt("write_tmp", lambda: open("/tmp/x", "w").write("x") and None)
attempt("write_root", lambda: open("/x", "w").write("x"))
attempt("environ", lambda: sorted(os.environ))
attempt("hostname", lambda: socket.gethostname())
# Last, as they change this process's namespaces: become root of a nested user namespace with a mount namespace
# of its own, and try to take the sandbox's mounts apart from there.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def call(name, r):
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, name + ": " + os.strerror(e))
def nested():
    call("unshare", libc.unshare(0x10000000 | 0x00020000))  # CLONE_NEWUSER | CLONE_NEWNS
attempt("nested_unshare", nested)
attempt("nested_umount_socket", lambda: call("umount2", libc.umount2(sock.encode(), 2)))  # MNT_DETACH
attempt("nested_remount_shown_rw", lambda: call("mount", libc.mount(None, os.environ["SHOWN"].encode(), None, 32 | 4096, None)))
attempt("nested_write_shown", lambda: open(os.path.join(os.environ["SHOWN"], "x"), "w").write("x") and None)
attempt("nested_umount_root", lambda: call("umount2", libc.umount2(b"/", 2)))
print(json.dumps(out))
`

// runEscape runs escapeScript in a sandbox of s and returns its report. hidden is a file outside the shown
// paths, sock a listening Unix socket the sandbox shows.
func runEscape(s *Sandbox, dir, python, prefix string) (map[string]any, string, error) {
	shown := filepath.Join(dir, "shown")
	hidden := filepath.Join(dir, "hidden", "key")
	root := filepath.Join(dir, "root")
	for _, d := range []string{shown, filepath.Dir(hidden), root, filepath.Join(dir, "sock")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, "", err
		}
	}
	if err := os.WriteFile(filepath.Join(shown, "data"), []byte("shown data"), 0o644); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(hidden, []byte("the platform's key"), 0o644); err != nil {
		return nil, "", err
	}
	sock := filepath.Join(dir, "sock", "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, "", err
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o666); err != nil {
		return nil, "", err
	}
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 16)
		n, _ := c.Read(buf)
		got <- string(buf[:n])
	}()
	id := s.Identity("escape")
	spec := Spec{Argv: []string{python, "-c", escapeScript}, Dir: shown, Root: root, Hostname: "escape-1",
		ReadOnly: append(SystemPaths(), shown, prefix), Sockets: []string{sock}, ID: id,
		Env: []string{"PLATFORM_PID=" + strconv.Itoa(os.Getpid()), "HIDDEN=" + hidden, "SOCK=" + sock,
			"SHOWN=" + shown, "PATH=/usr/bin:/bin"}}
	cmd, release, err := s.Command(spec)
	if err != nil {
		return nil, "", err
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Start()
	release()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Wait(); err != nil {
		return nil, "", fmt.Errorf("sandboxed program: %v\n%s", err, stderr.String())
	}
	var report map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		return nil, "", fmt.Errorf("report %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	select {
	case msg := <-got:
		return report, msg, nil
	case <-time.After(5 * time.Second):
		return report, "", nil
	}
}

// lookPython returns the real executable of the system's python3 (not a pyenv shim in a folder other users
// cannot read) and its installation's prefix.
func lookPython(t testing.TB) (exe, prefix string) {
	t.Helper()
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		if python, err = exec.LookPath("python3"); err != nil {
			t.Skip("python3 is not installed")
		}
	}
	out, err := exec.Command(python, "-c",
		"import os, sys; print(os.path.realpath(sys.executable)); print(os.path.realpath(sys.base_prefix))").Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(out))
	return lines[0], lines[1]
}

// checkEscape fails the test for every attempt that got through.
func checkEscape(t testing.TB, r map[string]any, received string) {
	t.Helper()
	defer func() {
		if t.Failed() || os.Getenv("SANDBOX_TEST_VERBOSE") != "" {
			for k, v := range r {
				t.Logf("%s: %v", k, v)
			}
		}
	}()
	failed := func(k string) bool {
		v, ok := r[k].(string)
		return ok && strings.Contains(v, "Error")
	}
	for _, k := range []string{"read_platform_environ", "read_hidden", "list_hidden_dir", "kill_platform",
		"read_init_environ", "unlink_socket", "rename_socket", "chmod_socket", "listen_on_socket", "write_shown",
		"write_root", "nested_umount_socket", "nested_remount_shown_rw", "nested_write_shown", "nested_umount_root"} {
		if !failed(k) {
			t.Errorf("%s got through: %v", k, r[k])
		}
	}
	for _, k := range []string{"connect_socket", "write_tmp"} {
		if r[k] != "ok" {
			t.Errorf("%s = %v, want ok", k, r[k])
		}
	}
	if received != "hello" {
		t.Errorf("the platform's socket received %q, want hello", received)
	}
	if r["read_shown"] != "shown data" {
		t.Errorf("read_shown = %v", r["read_shown"])
	}
	if procs, ok := r["procs"].([]any); !ok || len(procs) != 2 { // the init (1) and the program
		t.Errorf("/proc lists %v, want the init and the program only", r["procs"])
	}
	if r["hostname"] != "escape-1" {
		t.Errorf("hostname = %v", r["hostname"])
	}
	env, _ := r["environ"].([]any)
	for _, k := range env {
		switch k {
		case "HIDDEN", "PATH", "PLATFORM_PID", "SHOWN", "SOCK", "LC_CTYPE": // given, and Python's locale coercion
		default:
			t.Errorf("environment has %v, want only the variables given", k)
		}
	}
}

func newSandbox(t testing.TB, mode Mode) *Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := New(ctx, Config{Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestEscapesFail runs a hostile program in a sandbox as this test's user (root: per-function ids).
func TestEscapesFail(t *testing.T) {
	s := newSandbox(t, ModeAuto)
	if !s.Enabled() {
		t.Skipf("this kernel does not allow sandboxes: %s", s.Report().Reason)
	}
	t.Logf("sandbox: %s", s.Report().Summary())
	python, prefix := lookPython(t)
	r, received, err := runEscape(s, t.TempDir(), python, prefix)
	if err != nil {
		t.Fatal(err)
	}
	checkEscape(t, r, received)
	if os.Geteuid() == 0 {
		if !s.Report().PerFunctionIDs {
			t.Errorf("as root, want per-function ids: %+v", s.Report())
		}
		if uid, _ := r["uid"].(float64); uint32(uid) <= DefaultFirstID {
			t.Errorf("program uid = %v, want one of the functions' range", r["uid"])
		}
		if kill, _ := r["kill_all"].(string); kill != "ok" && !strings.Contains(kill, "Error") {
			t.Errorf("kill_all = %v", kill)
		}
	}
}

// exitNoUserNS is the unprivileged half's status when the kernel refuses it a user namespace.
const exitNoUserNS = 3

// unprivilegedMain is this test binary run as an unprivileged user by TestUnprivilegedUser: it builds a sandbox
// with isolation required and prints the escape report (and the socket's message) as JSON.
func unprivilegedMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := New(ctx, Config{Mode: ModeRequired})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, ErrUnavailable) {
			return exitNoUserNS
		}
		return 1
	}
	r, received, err := runEscape(s, os.Getenv("SANDBOX_TEST_DIR"), os.Getenv("SANDBOX_TEST_PYTHON"),
		os.Getenv("SANDBOX_TEST_PREFIX"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r["_received"] = received
	r["_report"] = s.Report()
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

// TestUnprivilegedUser runs the escape attempts in a sandbox built by an unprivileged user (nobody, through
// setpriv), the way `faas-gpu up` isolates functions when it is not root: a user namespace of one id.
func TestUnprivilegedUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestEscapesFail has run the sandbox as an unprivileged user already")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed: cannot become an unprivileged user")
	}
	python, prefix := lookPython(t)
	const nobody = 65534
	dir, err := os.MkdirTemp("", "faas-gpu-sandbox-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandbox.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
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
	cmd.Env = []string{"SANDBOX_TEST_AS_USER=1", "SANDBOX_TEST_DIR=" + work, "SANDBOX_TEST_PYTHON=" + python,
		"SANDBOX_TEST_PREFIX=" + prefix,
		"TMPDIR=" + work, "PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == exitNoUserNS {
		t.Skipf("the kernel refuses unprivileged user namespaces: %s", stderr.String())
	}
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, stderr.String())
	}
	var r map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("report %q: %v", stdout.String(), err)
	}
	t.Logf("sandbox as nobody: %v", r["_report"])
	received, _ := r["_received"].(string)
	delete(r, "_received")
	delete(r, "_report")
	checkEscape(t, r, received)
	if r["uid"] != float64(0) {
		t.Errorf("uid inside = %v, want 0 (root of its own user namespace, without capabilities)", r["uid"])
	}
}

// TestWritableFolders: a Writable folder is writable from inside (without set-id programs or devices), a ReadOnly
// folder inside it stays read-only, and a Writable folder inside a ReadOnly one is writable while its parent is not.
func TestWritableFolders(t *testing.T) {
	s := newSandbox(t, ModeAuto)
	if !s.Enabled() {
		t.Skipf("this kernel does not allow sandboxes: %s", s.Report().Reason)
	}
	python, prefix := lookPython(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rw, rwRO := filepath.Join(dir, "rw"), filepath.Join(dir, "rw", "ro")
	ro, roRW := filepath.Join(dir, "ro"), filepath.Join(dir, "ro", "rw")
	root := filepath.Join(dir, "root")
	for _, d := range []string{rwRO, roRW, root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	id := s.Identity("writable")
	if os.Geteuid() == 0 && s.Report().PerFunctionIDs {
		for _, d := range []string{rw, roRW} {
			if err := os.Chown(d, int(id.UID), int(id.GID)); err != nil {
				t.Fatal(err)
			}
		}
	}
	const script = `import json, os, sys
out = {}
for name in ["rw", "rw_ro", "ro", "ro_rw"]:
    p = os.path.join(os.environ[name.upper()], "x")
    try:
        open(p, "w").write("x")
        out[name] = "ok"
    except OSError as e:
        out[name] = "%s: %s" % (type(e).__name__, e)
f = os.statvfs(os.environ["RW"]).f_flag
out["nosuid"], out["nodev"] = bool(f & os.ST_NOSUID), bool(f & os.ST_NODEV)
print(json.dumps(out))`
	cmd, release, err := s.Command(Spec{Argv: []string{python, "-c", script}, Dir: "/", Root: root, Hostname: "w",
		ReadOnly: append(SystemPaths(), prefix, ro, rwRO), Writable: []string{rw, roRW}, ID: id,
		Env: []string{"RW=" + rw, "RW_RO=" + rwRO, "RO=" + ro, "RO_RW=" + roRW}})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Start()
	release()
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var r map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%q: %v", stdout.String(), err)
	}
	for k, want := range map[string]string{"rw": "ok", "ro_rw": "ok", "rw_ro": "Read-only", "ro": "Read-only"} {
		if v, _ := r[k].(string); !strings.Contains(v, want) {
			t.Errorf("writing %s: %v, want %s", k, r[k], want)
		}
	}
	if r["nosuid"] != true || r["nodev"] != true {
		t.Errorf("the writable folder's mount: nosuid %v, nodev %v; want both", r["nosuid"], r["nodev"])
	}
	for _, p := range []string{filepath.Join(rw, "x"), filepath.Join(roRW, "x")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was not written through: %v", p, err)
		}
	}
}

// A folder of Spec.Folders (a function's build context) is shown when it is a folder, and refused, not followed,
// when it has been swapped for a link (to another function's files, say) after the platform checked it.
func TestFoldersAreNeverFollowed(t *testing.T) {
	s := newSandbox(t, ModeAuto)
	if !s.Enabled() {
		t.Skipf("this kernel does not allow sandboxes: %s", s.Report().Reason)
	}
	python, prefix := lookPython(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, victim := filepath.Join(dir, "ctx"), filepath.Join(dir, "victim")
	for d, text := range map[string]string{ctx: "own", victim: "victim's"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "f"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string) (string, string, error) {
		root := filepath.Join(dir, "root-"+name)
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd, release, err := s.Command(Spec{Argv: []string{python, "-c", "print(open('f').read())"}, Dir: ctx,
			Root: root, Hostname: "f", ReadOnly: append(SystemPaths(), prefix, ctx), Folders: []string{ctx},
			ID: s.Identity("folders"), Env: []string{"PATH=/usr/bin:/bin"}})
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Start()
		release()
		if err == nil {
			err = cmd.Wait()
		}
		return strings.TrimSpace(stdout.String()), stderr.String(), err
	}
	if out, errOut, err := run("folder"); err != nil || out != "own" {
		t.Fatalf("a real folder: %q, %v\n%s", out, err, errOut)
	}
	if err := os.Rename(ctx, ctx+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, ctx); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := run("link")
	if err == nil || strings.Contains(out, "victim") || !strings.Contains(errOut, "not a folder") {
		t.Fatalf("a folder swapped for a link: %q, %v\n%s; want the sandbox refused", out, err, errOut)
	}
}
