package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/local/venv"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// pytorchFunctions are the example functions that run PyTorch through the shim.
var pytorchFunctions = []string{"resnet", "bert"}

// TestExampleFunctionRequirements: resnet, bert and llm pin the versions of test/pyenv exactly, and the same
// packages, so that the local backend installs one environment for all three.
func TestExampleFunctionRequirements(t *testing.T) {
	root := repoRoot(t)
	pinned := pins(t, filepath.Join(root, "test", "pyenv", "requirements.txt"))
	var first venv.Requirements
	for i, fn := range append(slices.Clone(pytorchFunctions), "llm") {
		dir := filepath.Join(root, "functions", fn)
		req, err := venv.ReadFiles(dir, filepath.Join(dir, "requirements.txt"))
		if err != nil {
			t.Fatal(err)
		}
		got := pins(t, filepath.Join(dir, "requirements.txt"))
		for name, v := range got {
			if pv, ok := pinned[name]; ok && pv != v {
				t.Errorf("functions/%s/requirements.txt pins %s==%s, test/pyenv/requirements.txt %s", fn, name, v, pv)
			}
		}
		for _, want := range []string{"torch==2.11.0", "torchvision==0.26.0", "transformers==5.17.0"} {
			name, v, _ := strings.Cut(want, "==")
			if got[name] != v {
				t.Errorf("functions/%s/requirements.txt: want %s, have %q", fn, want, got[name])
			}
		}
		if i == 0 {
			first = req
		} else if req.Text() != first.Text() {
			t.Errorf("functions/%s/requirements.txt and functions/%s/requirements.txt list different packages: "+
				"they would install two environments", fn, pytorchFunctions[0])
		}
	}
}

// pins reads name==version lines (names lowercased, - and _ alike); every requirement line must be pinned.
func pins(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := venv.Parse(filepath.Base(path), data)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range lines {
		name, v, ok := strings.Cut(l, "==")
		if !ok || strings.ContainsAny(v, " ;<>=!~") {
			t.Errorf("%s: %q is not an exact pin name==version", path, l)
			continue
		}
		out[strings.ReplaceAll(strings.ToLower(name), "_", "-")] = v
	}
	return out
}

// TestExampleFunctionsInStackAndReadme: resnet and bert are GPU functions of the root stack.yml, and every request
// field their handlers document is documented in their functions/<fn>/README.md too, with a runnable example.
func TestExampleFunctionsInStackAndReadme(t *testing.T) {
	root := repoRoot(t)
	stack, err := shrinkwrap.ReadStack(filepath.Join(root, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range pytorchFunctions {
		f, ok := stack.Functions[fn]
		if !ok || f.Handler != "./functions/"+fn || f.Lang != "gpu-python" {
			t.Errorf("stack.yml: %s is %+v, want gpu-python with handler ./functions/%s", fn, f, fn)
			continue
		}
		spec, isGPU, err := gpuspec.Parse(f.Annotations, fn)
		if err != nil || !isGPU || spec.SLO <= 0 {
			t.Errorf("stack.yml: %s annotations %v: GPU %v, SLO %v, %v; want a GPU function with an SLO", fn,
				f.Annotations, isGPU, spec.SLO, err)
		}
		fields := requestFields(t, filepath.Join(root, "functions", fn, "handler.py"))
		if len(fields) < 4 {
			t.Fatalf("functions/%s/handler.py documents request fields %v; expected its Request section", fn, fields)
		}
		doc := functionReadme(t, fn)
		section := readmeSection(doc, "## Request and answer")
		if section == "" {
			t.Errorf("functions/%s/README.md has no section ## Request and answer", fn)
			continue
		}
		for _, field := range fields {
			if !strings.Contains(section, "`"+field+"`") {
				t.Errorf("functions/%s/README.md does not document the request field `%s`", fn, field)
			}
		}
		if len(readmeExamples(doc, fn)) == 0 {
			t.Errorf("functions/%s/README.md has no runnable example (curl ... /function/%s -d '...')", fn, fn)
		}
	}
}

// functionReadme is the text of functions/<fn>/README.md: the function's API and its examples.
func functionReadme(t *testing.T, fn string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "functions", fn, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// requestFields reads the field names of a handler docstring's Request section (lines "  name   description").
func requestFields(t *testing.T, handler string) []string {
	t.Helper()
	f, err := os.Open(handler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	field := regexp.MustCompile(`^  ([a-z_]+)\s{2,}\S`)
	var out []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Request"):
			in = true
		case strings.HasPrefix(line, "Answer"):
			return out
		case in:
			if m := field.FindStringSubmatch(line); m != nil {
				out = append(out, m[1])
			}
		}
	}
	return out
}

// readmeSection is the text from a heading to the next heading of the same or a higher level (outside code blocks).
func readmeSection(readme, heading string) string {
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		return ""
	}
	level := len(strings.Fields(heading)[0])
	lines := strings.Split(readme[i+1+len(heading):], "\n")
	code := false
	for n, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			code = !code
		}
		if h := strings.Fields(l); !code && len(h) > 0 && strings.Trim(h[0], "#") == "" && len(h[0]) <= level {
			return strings.Join(lines[:n], "\n")
		}
	}
	return strings.Join(lines, "\n")
}

// readmeExamples are the request bodies of a README's `curl -s http://127.0.0.1:8080/function/<fn> -d '...'`
// lines: a function's examples, which the PyEnv tier runs.
func readmeExamples(readme, fn string) []string {
	re := regexp.MustCompile(`curl -s http://127\.0\.0\.1:8080/function/` + regexp.QuoteMeta(fn) + ` -d '([^']*)'`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(readme, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestFunctionsWithPipRequirementsThroughUp: through `faas-gpu up` and its HTTP API, a function whose requirements
// install runs on its environment, and one whose install fails answers 503 saying so and naming its logs (which hold
// pip's reason: callers and the status never see pip's output), and is not restarted.
func TestFunctionsWithPipRequirementsThroughUp(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and installs a package from PyPI")
	}
	pyenv.RequireTier(t, "installs a package from PyPI with pip")
	if out, err := exec.Command("python3", "-c", "import venv, ensurepip").CombinedOutput(); err != nil {
		t.Skipf("python3 with the venv and ensurepip modules is needed (Debian: python3-venv): %v %s", err, out)
	}
	// pip shows a download's progress for files over 40 kB that are not in its cache: idna's wheel is 70 kB.
	t.Setenv("PIP_NO_CACHE_DIR", "1")
	root := repoRoot(t)
	work := t.TempDir()
	stateDir := filepath.Join(work, "state")
	for name, requirements := range map[string]string{
		"pip-ok":     "six==1.17.0\nidna==3.10\n",
		"pip-broken": "six==1.17.0\nfaas-gpu-no-such-package==1.0\n",
	} {
		handler := filepath.Join(work, "handlers", name)
		if err := os.MkdirAll(handler, 0o755); err != nil {
			t.Fatal(err)
		}
		code := "import six\n\ndef handle(event, context):\n    return six.__version__\n"
		if err := os.WriteFile(filepath.Join(handler, "handler.py"), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(handler, "requirements.txt"), []byte(requirements), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := shrinkwrap.Assemble(filepath.Join(root, "template", "gpu-python"), handler,
			filepath.Join(work, "build", name)); err != nil {
			t.Fatal(err)
		}
	}
	in := startUp(t, stateDir, "--env-dir", filepath.Join(work, "envs"))
	deploy(t, in, types.FunctionDeployment{Service: "pip-ok", Image: "pip-ok:latest"})
	deploy(t, in, types.FunctionDeployment{Service: "pip-broken", Image: "pip-broken:latest"})

	installing := false // the function's status said it was installing
	testkit.EventuallyNil(t, 5*time.Minute, "pip-ok installed and answering", func() error {
		if a := functionStatus(t, in, "pip-ok").Annotations; a != nil &&
			strings.HasPrefix((*a)[local.StatusAnnotation], "installing ") {
			installing = true
		}
		r := call(t, http.MethodPost, in.url+"/function/pip-ok", "", nil)
		if r.code != http.StatusOK || r.body != "1.17.0" {
			return fmt.Errorf("%d %s", r.code, r.body)
		}
		return nil
	})
	const reason = "No matching distribution found for faas-gpu-no-such-package==1.0"
	// Callers learn that the install failed and where its logs are, never pip's output (it may quote files:
	// docs/security.md, build contexts and requirements); the function's logs, for its owner, have pip's reason.
	const told = "installing its requirements (function/requirements.txt) failed; see the function's logs (faas-cli logs pip-broken)"
	testkit.EventuallyNil(t, 5*time.Minute, "pip-broken failing, naming where its logs are", func() error {
		r := call(t, http.MethodPost, in.url+"/function/pip-broken", "", nil)
		if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, told) || strings.Contains(r.body, reason) {
			return fmt.Errorf("%d %s", r.code, r.body)
		}
		return nil
	})
	r := in.system(t, http.MethodGet, "/system/function/pip-broken", nil)
	var st types.FunctionStatus
	if err := json.Unmarshal([]byte(r.body), &st); err != nil || st.Annotations == nil ||
		!strings.Contains((*st.Annotations)[local.StatusAnnotation], "installing its requirements") ||
		strings.Contains((*st.Annotations)[local.StatusAnnotation], reason) || st.AvailableReplicas != 0 {
		t.Fatalf("status of pip-broken: %d %s; want %s saying the install failed, without pip's output", r.code,
			r.body, local.StatusAnnotation)
	}
	logs := functionLogs(t, in, "pip-broken")
	if !strings.Contains(logs, "pip: ERROR: "+reason) || !strings.Contains(logs, "not restarting until the function is updated") ||
		strings.Contains(logs, "restarting in") {
		t.Fatalf("pip-broken's log: want pip's error and no restart:\n%s", logs)
	}
	if logs := functionLogs(t, in, "pip-ok"); !strings.Contains(logs, "pip: Successfully installed idna-3.10 six-1.17.0") {
		t.Fatalf("pip-ok's log does not show the install:\n%s", logs)
	}
	// Progress: pip's download progress (bytes, percent) is in the function's log and in up's output, and the
	// status said it was installing.
	progress := regexp.MustCompile(`Downloading idna-3\.10-py3-none-any\.whl: [0-9.]+/[0-9.]+ kB \(100%\)`)
	if logs := functionLogs(t, in, "pip-ok"); !progress.MatchString(logs) {
		t.Errorf("pip-ok's log does not show the download's progress:\n%s", logs)
	}
	if !progress.MatchString(in.out.String()) {
		t.Errorf("up's output does not show the download's progress:\n%s", in.out.String())
	}
	if !installing {
		t.Errorf("pip-ok's status never said it was installing (%s)", local.StatusAnnotation)
	}
}
