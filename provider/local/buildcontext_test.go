package local

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// contextSecret stands for the gpuserver key and the basic-auth password in the state dir: what a hostile build
// context points at. No answer, status or error may carry it.
const contextSecret = "faas-gpu-build-context-secret-e51f"

// platformSecrets writes the key and the password into the backend's state dir (as up keeps them) and returns
// their paths.
func platformSecrets(t *testing.T, e *env) (key, password string) {
	t.Helper()
	key = filepath.Join(e.state, "gpuserver.key")
	password = filepath.Join(e.state, "secrets", "basic-auth-password")
	for _, p := range []string{key, password} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(contextSecret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return key, password
}

// noSecret fails the test when text carries the platform's secret.
func noSecret(t *testing.T, what, text string) {
	t.Helper()
	if strings.Contains(text, contextSecret) {
		t.Errorf("%s carries the platform's secret: %s", what, text)
	}
}

// replaceWithLink puts a symbolic link to target at path, in place of whatever is there.
func replaceWithLink(target, path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(target, path)
}

// A hostile build context (third round: `up` copied contexts following links, so the function read the key, the
// password and /etc/shadow) is refused at deploy with 400 naming the entry: a link to the key, one to the password
// by `..`, one to /etc/shadow, requirements.txt as a link to the password, a context folder that is a link to
// another function's assembled context, a fifo; and requirements naming the state dir with --find-links (or its
// abbreviation, -f, --index-url) are refused naming the option. No error quotes the secret, and no function runs.
func TestDeployRefusesHostileBuildContexts(t *testing.T) {
	e := newEnv(t)
	key, password := platformSecrets(t, e)
	b := e.open(t)
	ctx := context.Background()
	victim := filepath.Join(e.state, "run", "victim", "app")
	buildContext(t, filepath.Dir(victim), "app", filepath.Join("testdata", "probe"))
	for _, c := range []struct {
		name, mention string
		plant         func(dir string) error
	}{
		{"link-key", "function/key: a symbolic link to " + key, func(d string) error {
			return os.Symlink(key, filepath.Join(d, "function", "key"))
		}},
		{"link-password", "function/password: a symbolic link", func(d string) error {
			rel, err := filepath.Rel(filepath.Join(d, "function"), password)
			if err != nil {
				return err
			}
			return os.Symlink(rel, filepath.Join(d, "function", "password"))
		}},
		{"link-shadow", "function/shadow: a symbolic link to /etc/shadow", func(d string) error {
			return os.Symlink("/etc/shadow", filepath.Join(d, "function", "shadow"))
		}},
		{"link-requirements", "function/requirements.txt: a symbolic link", func(d string) error {
			return replaceWithLink(password, filepath.Join(d, "function", "requirements.txt"))
		}},
		{"link-template-requirements", "requirements.txt: a symbolic link", func(d string) error {
			return replaceWithLink(password, filepath.Join(d, "requirements.txt"))
		}},
		{"link-state-folder", "function/state: a symbolic link", func(d string) error {
			return os.Symlink(e.state, filepath.Join(d, "function", "state"))
		}},
		{"fifo", "function/pipe: a fifo", func(d string) error {
			return syscall.Mkfifo(filepath.Join(d, "function", "pipe"), 0o644)
		}},
		{"context-is-a-link", "is a symbolic link", func(d string) error {
			if err := os.RemoveAll(d); err != nil {
				return err
			}
			return os.Symlink(victim, d)
		}},
		{"find-links-state", "--find-links " + e.state, func(d string) error {
			return os.WriteFile(filepath.Join(d, "function", "requirements.txt"),
				[]byte("six==1.17.0\n--find-links "+e.state+"\n"), 0o644)
		}},
		{"find-abbreviated", "--find is not an option", func(d string) error {
			return os.WriteFile(filepath.Join(d, "function", "requirements.txt"), []byte("--find "+e.state+"\n"), 0o644)
		}},
		{"f-file-url", "-f file://" + e.state, func(d string) error {
			return os.WriteFile(filepath.Join(d, "function", "requirements.txt"),
				[]byte("-f file://"+e.state+"\nsix\n"), 0o644)
		}},
		{"index-url-state", "--index-url " + e.state, func(d string) error {
			return os.WriteFile(filepath.Join(d, "function", "requirements.txt"),
				[]byte("--index-url "+e.state+"\nsix\n"), 0o644)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(e.build, c.name)
			buildContext(t, e.build, c.name, filepath.Join("testdata", "probe"))
			if err := c.plant(dir); err != nil {
				t.Fatal(err)
			}
			err := b.Deploy(ctx, types.FunctionDeployment{Service: c.name, Image: c.name + ":latest"})
			if !errors.Is(err, provider.ErrInvalid) || provider.StatusCode(err) != http.StatusBadRequest ||
				!strings.Contains(err.Error(), c.mention) {
				t.Fatalf("Deploy = %v, want 400 (ErrInvalid) naming %q", err, c.mention)
			}
			noSecret(t, "the deploy's error", err.Error())
			if _, err := b.Status(ctx, "", c.name); !errors.Is(err, provider.ErrNotFound) {
				t.Fatalf("a refused function is recorded: %v", err)
			}
		})
	}
}

// A build context that gains a link out of it after the deploy (requirements.txt to the password) is refused when
// a replica starts, not copied or read: a caller of the function (POST /function/<name>, no credentials) is told
// that the function cannot start and where to look, and neither that answer, the function's status nor its logs
// carry the password; the logs name the file.
func TestBuildContextChangedAfterDeployIsRefusedAtStart(t *testing.T) {
	e := newEnv(t)
	_, password := platformSecrets(t, e)
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	buildContext(t, e.build, "late", filepath.Join("testdata", "probe"))
	fd := types.FunctionDeployment{Service: "late", Image: "late:latest",
		Labels: &map[string]string{LabelScaleMin: "0"}}
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	if err := replaceWithLink(password, filepath.Join(e.build, "late", "function", "requirements.txt")); err != nil {
		t.Fatal(err)
	}
	code, out, err := routeInvoke(ctx, b, "late", "/")
	if err == nil {
		t.Fatalf("the function answered %d %s, want it refused", code, out)
	}
	if !errors.Is(err, provider.ErrFailed) || provider.StatusCode(err) != http.StatusServiceUnavailable ||
		!strings.Contains(err.Error(), `function "late"`) || !strings.Contains(err.Error(), "see the function's logs") {
		t.Fatalf("Route = %v, want 503 (ErrFailed) naming the function and its logs", err)
	}
	noSecret(t, "the caller's answer", err.Error())
	if _, err := b.Resolve(ctx, "", "late"); err == nil {
		t.Fatal("Resolve answered a URL")
	} else {
		noSecret(t, "Resolve's error", err.Error())
	}
	st, err := b.Status(ctx, "", "late")
	if err != nil || st.Annotations == nil || !strings.HasPrefix((*st.Annotations)[StatusAnnotation], "failed: ") {
		t.Fatalf("status %+v, %v; want failed", st.Annotations, err)
	}
	noSecret(t, "the status", (*st.Annotations)[StatusAnnotation])
	testkit.Eventually(t, 30*time.Second, "the refusal in the function's logs", func() bool {
		return strings.Contains(logText(t, b, "late"), "function/requirements.txt: a symbolic link")
	})
	noSecret(t, "the function's logs", logText(t, b, "late"))
	if pids := b.pids("late"); len(pids) != 0 {
		t.Fatalf("processes %v run from a refused build context", pids)
	}
}

// An install that fails offline, for a requirement whose name stands for what a caller must not learn (pip's
// errors quote the requirements: the third round's 503 quoted the password this way), answers every caller with
// "installing its requirements failed; see the function's logs"; pip's error is in the function's logs only.
func TestFailedInstallTellsCallersNothingOfPip(t *testing.T) {
	needPython(t)
	if out, err := exec.Command("python3", "-c", "import venv, ensurepip").CombinedOutput(); err != nil {
		t.Skipf("python3 with the venv and ensurepip modules is needed (Debian: python3-venv): %v %s", err, out)
	}
	t.Setenv("PIP_NO_INDEX", "1") // no network: pip finds nothing and says so, naming the requirement
	e := newEnv(t)
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), pipDeadline)
	defer cancel()
	const stand = "faas-gpu-caller-must-not-see-3d9c"
	if err := b.Deploy(ctx, pipFunction(t, e, "pipfail", stand+"==1.0\n")); err != nil {
		t.Fatal(err)
	}
	code, out, err := routeInvoke(ctx, b, "pipfail", "/")
	if err == nil {
		t.Fatalf("the function answered %d %s, want its install failed", code, out)
	}
	if !errors.Is(err, provider.ErrFailed) || provider.StatusCode(err) != http.StatusServiceUnavailable ||
		!strings.Contains(err.Error(), "installing its requirements (function/requirements.txt) failed") ||
		!strings.Contains(err.Error(), "faas-cli logs pipfail") {
		t.Fatalf("Route = %v, want 503 saying the install failed and where its logs are", err)
	}
	st, serr := b.Status(ctx, "", "pipfail")
	if serr != nil || st.Annotations == nil {
		t.Fatalf("status: %+v %v", st, serr)
	}
	for what, text := range map[string]string{"the caller's answer": err.Error(),
		"the status": (*st.Annotations)[StatusAnnotation]} {
		if strings.Contains(text, stand) {
			t.Errorf("%s quotes pip: %s", what, text)
		}
	}
	if text := logText(t, b, "pipfail"); !strings.Contains(text, "pip: ERROR: ") || !strings.Contains(text, stand) {
		t.Errorf("pip's error is not in the function's logs:\n%s", text)
	}
}
