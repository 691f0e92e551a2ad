package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestMakeRunBuildsTheExampleFunctions: as the README says, `make run` lays out ./build/<fn>/ for the functions of
// stack.yml (from ./template, where faas-cli reads templates) before it starts faas-gpu up.
func TestMakeRunBuildsTheExampleFunctions(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", "-n", "run")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n run: %v\n%s", err, out)
	}
	text := string(out)
	shrinkwrap := strings.Index(text, "shrinkwrap -f stack.yml -templates template -out build")
	up := strings.Index(text, "bin/faas-gpu up")
	if shrinkwrap < 0 || up < 0 || shrinkwrap > up {
		t.Fatalf("make run does not build the functions (from ./template) before faas-gpu up:\n%s", text)
	}
}

// makeOutput runs make with args in the repository and returns its output.
func makeOutput(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", args...)
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMakeTestNeedsOnlyThePrerequisites: the README promises that Go, gcc, make and python3 are enough for `make
// test`. helm, which the chart tests need, is built by the Makefile, pinned, into the cache outside the repository
// and handed to them (FAAS_GPU_HELM, so that they fail rather than skip when it is missing); .ci/run installs
// nothing else before `make test`; and every test that downloads from PyPI runs only in the CUDA tier, so that `make
// test` passes offline once the caches exist.
func TestMakeTestNeedsOnlyThePrerequisites(t *testing.T) {
	cache := t.TempDir()
	text := makeOutput(t, "-n", "test-go", "FAAS_GPU_CACHE="+cache)
	helm := filepath.Join(cache, "bin", "helm-v3.22.0", "helm")
	for _, want := range []string{"helm.sh/helm/v3/cmd/helm@v3.22.0", "FAAS_GPU_HELM=" + helm + " "} {
		if !strings.Contains(text, want) {
			t.Errorf("make -n test-go lacks %q:\n%s", want, text)
		}
	}
	// Once built, helm is reused: nothing is built again.
	if err := os.MkdirAll(filepath.Dir(helm), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(helm, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if again := makeOutput(t, "-n", "test-go", "FAAS_GPU_CACHE="+cache); strings.Contains(again, "go install") {
		t.Errorf("make -n test-go builds helm again although %s exists:\n%s", helm, again)
	}

	raw, err := os.ReadFile(filepath.Join(repoRoot(t), ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	script := string(raw)
	end := strings.Index(script, "\nmake test\n")
	if end < 0 {
		t.Fatal(".ci/run does not run `make test`")
	}
	var commands []string // what runs before make test, without the comments
	for _, line := range strings.Split(script[:end], "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			commands = append(commands, line)
		}
	}
	before := strings.Join(commands, "\n")
	allowed := map[string]bool{"gcc": true, "libc6-dev": true, "make": true, "python3": true, "git": true}
	for _, m := range regexp.MustCompile(`apt_install ([^\n]+)`).FindAllStringSubmatch(before, -1) {
		for _, pkg := range strings.Fields(m[1]) {
			if pkg != `"$@"` && !allowed[pkg] {
				t.Errorf(".ci/run installs %s before make test; the README's prerequisites are Go, gcc, make, python3", pkg)
			}
		}
	}
	if strings.Contains(before, "helm") || strings.Contains(before, "go install") {
		t.Errorf(".ci/run installs tools before make test:\n%s", before)
	}

	// Tests that download from PyPI skip outside the CUDA tier.
	err = filepath.WalkDir(repoRoot(t), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "build" || d.Name() == ".faas-gpu") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, "makefile_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(src), "from PyPI") && !strings.Contains(string(src), "pyenv.RequireTier(") {
			t.Errorf("%s installs from PyPI but does not skip outside the CUDA tier (pyenv.RequireTier)", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMakeBuildIsQuiet: go-nvml's header declares NVML's deprecated functions and its cgo wrappers call them, so a
// cold build printed about 150 warnings; the Makefile's CGO_CFLAGS silences them where they come from. The go-nvml
// package is compiled afresh with those flags (a define of no meaning makes its cache key new: a cached build
// prints nothing either way).
func TestMakeBuildIsQuiet(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles go-nvml's cgo package")
	}
	flags := strings.TrimSpace(makeOutput(t, "-s", "--no-print-directory",
		"--eval=print-cgo-cflags: ; @echo $$CGO_CFLAGS", "print-cgo-cflags"))
	if !strings.Contains(flags, "-Wno-deprecated-declarations") {
		t.Fatalf("the Makefile's CGO_CFLAGS are %q: want -Wno-deprecated-declarations", flags)
	}
	cmd := exec.Command("go", "build", "-o", os.DevNull, "github.com/NVIDIA/go-nvml/pkg/nvml")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), fmt.Sprintf("CGO_CFLAGS=%s -DFAAS_GPU_FRESH_BUILD=%d", flags, time.Now().UnixNano()))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build go-nvml: %v\n%s", err, out)
	}
	if len(out) > 0 {
		t.Fatalf("building go-nvml with the Makefile's CGO_CFLAGS printed:\n%s", out)
	}
}

// TestMakeBuildShowsProgress: `make build` on a cold Go build cache (minutes of compiling) prints a line every 20
// packages compiled, with the seconds so far, instead of nothing; a compile error still shows and fails the build.
// A stand-in go prints what `go build -v` prints (a package path per line) so that the test compiles nothing.
func TestMakeBuildShowsProgress(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "go")
	script := "#!/bin/sh\ni=0; while [ $i -lt 45 ]; do echo \"example.com/pkg/p$i\" >&2; i=$((i+1)); done\n" +
		"[ -n \"$FAIL\" ] && { echo \"cmd/faas-gpu/main.go:1:1: expected 'package', found x\" >&2; exit 1; }\nexit 0\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(fail bool) (string, error) {
		cmd := exec.Command("make", "-s", "build", "GO="+fake, "BIN="+filepath.Join(dir, "faas-gpu"))
		cmd.Dir = repoRoot(t)
		cmd.Env = os.Environ()
		if fail {
			cmd.Env = append(cmd.Env, "FAIL=1")
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(false)
	if err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, want := range []string{"build: 20 packages compiled, ", "build: 40 packages compiled, ", "build: 45 packages compiled in "} {
		if !strings.Contains(out, want) {
			t.Errorf("make build lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "example.com/pkg/") {
		t.Errorf("make build prints every package:\n%s", out)
	}
	out, err = run(true)
	if err == nil || !strings.Contains(out, "main.go:1:1: expected 'package'") {
		t.Errorf("make build with a compile error: %v, want a failure showing the error:\n%s", err, out)
	}
}
