package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

// quickstartScript returns the sh blocks of the README's "With curl" quickstart, between the quickstart-test
// markers.
func quickstartScript(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	start := strings.Index(text, "<!-- quickstart-test: the sh blocks")
	end := strings.Index(text, "<!-- quickstart-test: end -->")
	if start < 0 || end < start {
		t.Fatal("README.md lacks the quickstart-test markers around the curl quickstart")
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text[start:end], -1) {
		blocks = append(blocks, m[1])
	}
	if len(blocks) < 2 {
		t.Fatalf("found %d sh blocks in the curl quickstart", len(blocks))
	}
	return strings.Join(blocks, "\n")
}

// TestReadmeQuickstart runs the README's curl quickstart as written, against `faas-gpu up`, from a folder laid out
// as the repository is after `make run` (./.faas-gpu is up's state dir, bin/faas-gpu the binary); only the port
// differs (a free one instead of 8080).
func TestReadmeQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and python functions")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	script := quickstartScript(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir)
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	cwd := t.TempDir()
	if err := os.Symlink(stateDir, filepath.Join(cwd, ".faas-gpu")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(cwd, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(cwd, "bin", "faas-gpu")); err != nil {
		t.Fatal(err)
	}
	script = strings.ReplaceAll(script, "http://127.0.0.1:8080", in.url)
	cmd := exec.Command("bash", "-eu", "-o", "pipefail", "-c", script)
	cmd.Dir = cwd
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("the quickstart failed: %v\n%s", err, text)
	}
	for _, want := range []string{
		"hello",                     // echo
		`"gpu":`,                    // hello-gpu bound to a GPU
		`"invocationCount":`,        // the list
		"HTTP/1.1 202",              // the asynchronous call
		"policy:",                   // bin/faas-gpu pool
		"GPU MEMORY GiB-s",          // bin/faas-gpu usage
		`{"c": [11.0, 22.0, 33.0]}`, // vector-add through the shim
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the quickstart's output lacks %q:\n%s", want, text)
		}
	}
	for _, bad := range []string{"invalid credentials", "takes a JSON body", "invalid request", "not found", "No endpoints"} {
		if strings.Contains(text, bad) {
			t.Errorf("the quickstart's output has %q (a refused request):\n%s", bad, text)
		}
	}
}

// TestReadmeFaasCLIDeploysWhatDownloadsNothingFirst: the README's faas-cli quickstart deploys first, with
// `faas-cli deploy -f stack.yml --regex '...'`, exactly the functions of stack.yml whose requirements download
// nothing (the CPU and CUDA examples), so that a newcomer's first deploy starts no pip download; the functions the
// regex leaves out are named in the separate step that says what it downloads.
func TestReadmeFaasCLIDeploysWhatDownloadsNothingFirst(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	m := regexp.MustCompile(`(?m)^faas-cli deploy -f stack.yml --regex '([^']+)'`).FindStringSubmatch(readme)
	if m == nil {
		t.Fatal("the README's faas-cli quickstart has no `faas-cli deploy -f stack.yml --regex '...'`")
	}
	re, err := regexp.Compile(m[1])
	if err != nil {
		t.Fatalf("the README's --regex %q: %v", m[1], err)
	}
	stack, err := shrinkwrap.ReadStack(filepath.Join(root, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	step := readme[strings.Index(readme, "Then, as a separate step"):]
	for name, f := range stack.Functions {
		reqs, _ := os.ReadFile(filepath.Join(root, f.Handler, "requirements.txt"))
		downloads := false
		for _, l := range strings.Split(string(reqs), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				downloads = true
			}
		}
		switch {
		case downloads && re.MatchString(name):
			t.Errorf("the first deploy's --regex %q takes %s, which downloads its requirements", m[1], name)
		case !downloads && !re.MatchString(name):
			t.Errorf("the first deploy's --regex %q leaves out %s, which downloads nothing", m[1], name)
		case downloads && !strings.Contains(step, "`"+name+"`"):
			t.Errorf("the README's separate step does not name %s", name)
		}
	}
}
