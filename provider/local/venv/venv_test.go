package venv

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/pyenv"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// A small real package from PyPI (11 kB, pure Python): the tests install it with pip for real.
const smallPackage = "six==1.17.0"

func needVenv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("installs a package from PyPI with pip")
	}
	pyenv.RequireTier(t, "installs a package from PyPI with pip")
	if out, err := exec.Command("python3", "-c", "import venv, ensurepip").CombinedOutput(); err != nil {
		t.Skipf("python3 with the venv and ensurepip modules is needed (Debian: python3-venv): %v %s", err, out)
	}
}

func open(t *testing.T, dir string) *Manager {
	t.Helper()
	m, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func parse(t *testing.T, text string) Requirements {
	t.Helper()
	lines, err := Parse("function/requirements.txt", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return Requirements{Files: []string{"function/requirements.txt"}, Lines: lines}
}

// pythonImports runs code with an environment's interpreter and returns its output.
func pythonRun(t *testing.T, env *Env, code string) string {
	t.Helper()
	out, err := exec.Command(env.Python, "-c", code).CombinedOutput()
	if err != nil {
		t.Fatalf("%s -c %q: %v\n%s", env.Python, code, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestParse(t *testing.T) {
	lines, err := Parse("r.txt", []byte("# a comment\n\nsix==1.17.0   # pinned\r\n  numpy>=2 \\\n  ,<3\n--index-url https://example.org/simple\nfoo @ https://example.org/foo.whl\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"six==1.17.0", "numpy>=2 ,<3", "--index-url https://example.org/simple",
		"foo @ https://example.org/foo.whl"}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Fatalf("Parse = %q, want %q", lines, want)
	}
	a := Requirements{Lines: lines}
	b := Requirements{Lines: mustParse(t, "six==1.17.0\nnumpy>=2 ,<3\n--index-url https://example.org/simple\nfoo @ https://example.org/foo.whl")}
	if a.Text() != b.Text() || a.hash() != b.hash() {
		t.Fatalf("files that differ in comments and spacing only must normalise alike:\n%q\n%q", a.Text(), b.Text())
	}
	for _, bad := range []struct{ line, mention string }{
		{"-r other.txt", "includes another file"},
		{"--requirement=other.txt", "includes another file"},
		{"-rother.txt", "includes another file"},
		{"-c constraints.txt", "includes another file"},
		{"-e .", "editable"},
		{"--editable git+https://example.org/x", "editable"},
		{"./mypkg", "local path"},
		{"/opt/wheels/x.whl", "local path"},
		{"file:///tmp/x.whl", "local path"},
		{"x @ file:///tmp/x.whl", "local path"},
		{"x@file:///tmp/x.whl", "local path"},
		{"git+file:///srv/state/repo#egg=x", "local path"},
		{"wheels/x-1.0-py3-none-any.whl", "local path"},
		{"x-1.0.tar.gz", "local path"},
		{"x @ /srv/state/x.whl", "remote host"},
		// Options that name a folder or a file: the install sees none, and the state dir must stay out of its view.
		{"--find-links /srv/state", "--find-links /srv/state"},
		{"--find-links=/srv/state", "--find-links /srv/state"},
		{"-f /srv/state", "-f /srv/state"},
		{"-f/srv/state", "-f /srv/state"},
		{"--find-links file:///srv/state", "--find-links file:///srv/state"},
		{"--find-links ../state", "--find-links ../state"},
		{"--index-url /srv/state", "--index-url"},
		{"-i file:///srv/state", "-i file:"},
		{"--pypi-url /srv/state", "--pypi-url"},
		{"--extra-index-url /srv/state", "--extra-index-url"},
		{"six==1.17.0 --find-links /srv/state", "--find-links"},
		{"--find-links", "needs a value"},
		// pip's abbreviations and options it does not read from a requirements file.
		{"--find /srv/state", "--find is not an option"},
		{"--extra /srv/state", "--extra is not an option"},
		{"--target /srv/state", "--target is not an option"},
		{"--user", "--user is not an option"},
		{"--no-index=1", "takes no value"},
		{"--extra-index-url https://${FAAS_GPU_GPUSERVER_KEY}@pypi.example/simple", "${VARIABLE}"},
	} {
		_, err := Parse("function/requirements.txt", []byte("six\n"+bad.line+"\n"))
		if !errors.Is(err, ErrInvalidRequirements) || !strings.Contains(err.Error(), "line 2") ||
			!strings.Contains(err.Error(), bad.mention) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidRequirements naming line 2 and %q", bad.line, err, bad.mention)
		}
	}
	for _, good := range []string{"--index-url https://example.org/simple", "--extra-index-url=https://x.example/simple",
		"-f https://x.example/wheels/", "-fhttps://x.example/wheels/", "--trusted-host example.org",
		"--no-binary :all:", "--only-binary=:all:", "--pre", "--prefer-binary", "--no-index", "--require-hashes",
		"six==1.17.0 --hash=sha256:0123", "git+https://github.com/x/y@v1#egg=y", "pkg[extra] @ https://x.example/p.whl",
		`six ; python_version >= "3.8"`, "https://x.example/pkg-1.0-py3-none-any.whl", "profile-tools==1.0"} {
		if _, err := Parse("r.txt", []byte(good+"\n")); err != nil {
			t.Errorf("Parse(%q) = %v, want it accepted", good, err)
		}
	}
	if _, err := Parse("r.txt", []byte("six\x00")); !errors.Is(err, ErrInvalidRequirements) {
		t.Errorf("a NUL byte: %v", err)
	}
}

func mustParse(t *testing.T, s string) []string {
	t.Helper()
	lines, err := Parse("r.txt", []byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "function"), 0o755); err != nil {
		t.Fatal(err)
	}
	req, err := Read(dir)
	if err != nil || !req.Empty() {
		t.Fatalf("no files: %+v, %v; want empty", req, err)
	}
	write := func(rel, text string) {
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("requirements.txt", "# the template's: standard library only\n")
	write("function/requirements.txt", "six==1.17.0\n")
	req, err = Read(dir)
	if err != nil || strings.Join(req.Files, ",") != "function/requirements.txt" || req.Text() != "six==1.17.0\n" {
		t.Fatalf("Read = %+v, %v", req, err)
	}
	write("requirements.txt", "flask==3.0.0\n")
	req, err = Read(dir)
	if err != nil || req.Text() != "flask==3.0.0\nsix==1.17.0\n" || len(req.Files) != 2 {
		t.Fatalf("Read with both files = %+v, %v; want the template's lines first", req, err)
	}
	write("function/requirements.txt", strings.Repeat("x", MaxRequirementsFile+1))
	if _, err := Read(dir); !errors.Is(err, ErrInvalidRequirements) || !strings.Contains(err.Error(), "function/requirements.txt") {
		t.Fatalf("an oversized file: %v", err)
	}
}

// requirements.txt (or function/) as a link out of the build context, to the basic-auth password say, is refused
// naming the file, and nothing of the password is in the error; a link inside the context is read.
func TestReadRefusesLinksThatLeaveTheContext(t *testing.T) {
	const secret = "faas-gpu-venv-read-secret-77aa"
	base := t.TempDir()
	password := filepath.Join(base, "state", "secrets", "basic-auth-password")
	if err := os.MkdirAll(filepath.Dir(password), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(password, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what, file string
		make       func(ctx string) error
	}{
		{"requirements.txt to the password", "requirements.txt", func(ctx string) error {
			return os.Symlink(password, filepath.Join(ctx, "requirements.txt"))
		}},
		{"function/requirements.txt by ..", "function/requirements.txt", func(ctx string) error {
			rel, err := filepath.Rel(filepath.Join(ctx, "function"), password)
			if err != nil {
				return err
			}
			return os.Symlink(rel, filepath.Join(ctx, "function", "requirements.txt"))
		}},
		{"function/ to the secrets folder", "function/requirements.txt", func(ctx string) error {
			if err := os.Remove(filepath.Join(ctx, "function")); err != nil {
				return err
			}
			if err := os.Symlink(filepath.Dir(password), filepath.Join(ctx, "function")); err != nil {
				return err
			}
			return os.Symlink(password, filepath.Join(filepath.Dir(password), "requirements.txt"))
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx := filepath.Join(t.TempDir(), "ctx")
			if err := os.MkdirAll(filepath.Join(ctx, "function"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := c.make(ctx); err != nil {
				t.Fatal(err)
			}
			req, err := Read(ctx)
			if !errors.Is(err, ErrInvalidRequirements) || !strings.Contains(err.Error(), c.file+":") ||
				!strings.Contains(err.Error(), "leaves the build context") {
				t.Fatalf("Read = %+v, %v; want ErrInvalidRequirements naming %s", req, err, c.file)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error quotes the password: %v", err)
			}
		})
	}
	ctx := filepath.Join(t.TempDir(), "ctx")
	if err := os.MkdirAll(filepath.Join(ctx, "function"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctx, "function", "pins.txt"), []byte("six==1.17.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("pins.txt", filepath.Join(ctx, "function", "requirements.txt")); err != nil {
		t.Fatal(err)
	}
	if req, err := Read(ctx); err != nil || req.Text() != "six==1.17.0\n" {
		t.Fatalf("a link inside the context: %+v, %v", req, err)
	}
}

func TestOpenRefusesADirOthersMayWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "envs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: dir}); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Fatalf("Open on a world-writable dir: %v", err)
	}
	if _, err := Open(Config{Dir: dir, MaxAge: -time.Second}); err == nil {
		t.Fatal("a negative MaxAge is accepted")
	}
}

// The same requirements (spelled differently) install once; the second caller and a restarted manager reuse the
// environment without running pip.
func TestEnsureSharesAndReuses(t *testing.T) {
	needVenv(t)
	dir := t.TempDir()
	m := open(t, dir)
	ctx := context.Background()

	var first testkit.Buffer
	a, err := m.Ensure(ctx, parse(t, smallPackage+"\n"), &first)
	if err != nil {
		t.Fatalf("Ensure: %v\n%s", err, first.String())
	}
	if !a.Installed || !strings.Contains(first.String(), "Successfully installed six-1.17.0") {
		t.Fatalf("first Ensure: installed=%v, progress:\n%s", a.Installed, first.String())
	}
	if got := pythonRun(t, a, "import six, sys; print(six.__version__, sys.prefix)"); got != "1.17.0 "+a.Dir {
		t.Fatalf("the environment's python says %q, want six 1.17.0 from %s", got, a.Dir)
	}

	var second testkit.Buffer
	b, err := m.Ensure(ctx, parse(t, "# same package, other comments\n  "+smallPackage+"   # pinned\n"), &second)
	if err != nil {
		t.Fatal(err)
	}
	if b.Dir != a.Dir || b.Installed {
		t.Fatalf("second Ensure: %+v, want the first environment %s reused", b, a.Dir)
	}
	if st := m.Stats(); st.Installs != 1 || st.Reuses != 1 || st.Failures != 0 {
		t.Fatalf("Stats = %+v, want 1 install and 1 reuse", st)
	}
	if strings.Contains(second.String(), "Collecting") || !strings.Contains(second.String(), "nothing to download") {
		t.Fatalf("the second Ensure ran pip or did not say it reused:\n%s", second.String())
	}
	if envs := listEnvs(t, dir); len(envs) != 1 {
		t.Fatalf("environment dir holds %v, want one environment", envs)
	}

	// A restart: a new manager on the same dir reuses it.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := open(t, dir)
	c, err := m2.Ensure(ctx, parse(t, smallPackage), nil)
	if err != nil || c.Dir != a.Dir || c.Installed {
		t.Fatalf("after a restart: %+v, %v", c, err)
	}
	if st := m2.Stats(); st.Installs != 0 || st.Reuses != 1 {
		t.Fatalf("restarted Stats = %+v, want no install", st)
	}
	// Other requirements get another environment.
	other, err := m2.Name(ctx, parse(t, "six==1.16.0"))
	if err != nil || other == a.Name || !envName.MatchString(other) {
		t.Fatalf("Name of other requirements = %q, %v (first %s)", other, err, a.Name)
	}
}

// Two processes (two managers on one dir) deploying the same requirements at once install them once.
func TestEnsureConcurrentInstallsOnce(t *testing.T) {
	needVenv(t)
	dir := t.TempDir()
	managers := []*Manager{open(t, dir), open(t, dir)}
	req := parse(t, smallPackage)
	envs := make([]*Env, len(managers))
	errs := make([]error, len(managers))
	var wg sync.WaitGroup
	for i, m := range managers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			envs[i], errs[i] = m.Ensure(context.Background(), req, nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Ensure %d: %v", i, err)
		}
	}
	installs := managers[0].Stats().Installs + managers[1].Stats().Installs
	reuses := managers[0].Stats().Reuses + managers[1].Stats().Reuses
	if installs != 1 || reuses != 1 || envs[0].Dir != envs[1].Dir || envs[0].Installed == envs[1].Installed {
		t.Fatalf("installs %d, reuses %d, envs %+v %+v: want one install shared", installs, reuses, envs[0], envs[1])
	}
}

func TestEnsureFailureIsAClearErrorAndLeavesNothing(t *testing.T) {
	needVenv(t)
	dir := t.TempDir()
	m := open(t, dir)
	var progress testkit.Buffer
	_, err := m.Ensure(context.Background(), parse(t, "faas-gpu-no-such-package==1.0"), &progress)
	if !errors.Is(err, ErrInstall) || !strings.Contains(err.Error(), "faas-gpu-no-such-package") ||
		!strings.Contains(err.Error(), "ERROR:") {
		t.Fatalf("Ensure of a missing package: %v, want ErrInstall with pip's ERROR line", err)
	}
	if !strings.Contains(progress.String(), "No matching distribution found for faas-gpu-no-such-package==1.0") {
		t.Fatalf("pip's reason is not in the progress:\n%s", progress.String())
	}
	if envs := listEnvs(t, dir); len(envs) != 0 {
		t.Fatalf("a failed install left %v", envs)
	}
	if st := m.Stats(); st.Installs != 1 || st.Failures != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

// A caller waiting for another process's install says so and gives up when its context ends.
func TestEnsureWaitsForAnotherInstall(t *testing.T) {
	needVenv(t)
	dir := t.TempDir()
	m := open(t, dir)
	req := parse(t, smallPackage)
	name, err := m.Name(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// Another process installs: it holds the install lock.
	other, err := lock(context.Background(), filepath.Join(dir, name+installSuffix), syscall.LOCK_EX, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var progress testkit.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := m.Ensure(ctx, req, &progress)
		done <- err
	}()
	testkit.Eventually(t, 60*time.Second, "the waiting line", func() bool { return strings.Contains(progress.String(), "waiting for another install") })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Ensure after cancel: %v", err)
	}
	if st := m.Stats(); st.Installs != 0 {
		t.Fatalf("Stats = %+v: nothing may be installed while another process holds the lock", st)
	}
}

func TestPrune(t *testing.T) {
	dir := t.TempDir()
	m, err := Open(Config{Dir: dir, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	old := time.Now().Add(-2 * time.Hour)
	mk := func(name string, complete bool, used time.Time) {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(d, "bin"), 0o700); err != nil {
			t.Fatal(err)
		}
		if complete {
			if err := os.WriteFile(filepath.Join(d, markerFile), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, usedFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(d, usedFile), used, used); err != nil {
			t.Fatal(err)
		}
	}
	const (
		stale      = "py3.11-0000000000000001"
		fresh      = "py3.11-0000000000000002"
		broken     = "py3.11-0000000000000003"
		inUse      = "py3.11-0000000000000004"
		installing = "py3.11-0000000000000005"
		foreign    = "not-an-environment"
	)
	mk(stale, true, old)
	mk(fresh, true, time.Now())
	mk(broken, false, time.Now())
	mk(inUse, true, old)
	mk(installing, false, old)
	mk(foreign, true, old)
	user, err := lock(context.Background(), filepath.Join(dir, inUse+useLockSuffix), syscall.LOCK_SH, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	installer, err := lock(context.Background(), filepath.Join(dir, installing+installSuffix), syscall.LOCK_EX, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer installer.Close()

	removed, err := m.Prune(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(removed, ",") != stale+","+broken {
		t.Fatalf("Prune removed %v, want the stale and the broken environment", removed)
	}
	want := []string{foreign, fresh, inUse, installing} // ReadDir order
	if got := listDirs(t, dir); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("left %v, want %v", got, want)
	}

	// MaxAge 0 keeps complete environments however old, and still clears broken ones.
	m0, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer m0.Close()
	mk(broken, false, old)
	user.Close()
	removed, err = m0.Prune(context.Background())
	if err != nil || strings.Join(removed, ",") != broken {
		t.Fatalf("Prune with MaxAge 0 removed %v, %v; want only the broken one", removed, err)
	}
}

func listEnvs(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, name := range listDirs(t, dir) {
		if envName.MatchString(name) {
			out = append(out, name)
		}
	}
	return out
}

func listDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}
