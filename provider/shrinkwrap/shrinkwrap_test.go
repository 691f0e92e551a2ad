package shrinkwrap

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
)

var repo = filepath.Join("..", "..")

// TestRepositoryStack checks the root stack.yml: echo without GPU annotations, hello-gpu with valid ones, both
// gpu-python with handlers under functions/.
func TestRepositoryStack(t *testing.T) {
	s, err := ReadStack(filepath.Join(repo, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Provider.Name != "openfaas" || s.Provider.Gateway != "http://127.0.0.1:8080" {
		t.Errorf("provider = %+v", s.Provider)
	}
	echo, hello := s.Functions["echo"], s.Functions["hello-gpu"]
	if echo.Lang != "gpu-python" || echo.Handler != "./functions/echo" || echo.Image != "echo:latest" {
		t.Errorf("echo = %+v", echo)
	}
	if _, isGPU, err := gpuspec.Parse(echo.Annotations, "echo"); err != nil || isGPU {
		t.Errorf("echo annotations: GPU %v, %v; want a CPU function", isGPU, err)
	}
	if hello.Lang != "gpu-python" || hello.Handler != "./functions/hello-gpu" || hello.Image != "hello-gpu:latest" {
		t.Errorf("hello-gpu = %+v", hello)
	}
	spec, isGPU, err := gpuspec.Parse(hello.Annotations, "hello-gpu")
	if err != nil || !isGPU || spec.MemoryBytes != 1536<<20 || spec.SLO.Milliseconds() != 80 {
		t.Errorf("hello-gpu annotations: %+v %v %v", spec, isGPU, err)
	}
}

// TestBuildLaysOutShrinkwrap builds the repository's stack and checks the faas-cli shrinkwrap layout: the
// template's files at the top, the handler's files over function/.
func TestBuildLaysOutShrinkwrap(t *testing.T) {
	out := t.TempDir()
	built, err := Build(filepath.Join(repo, "stack.yml"), filepath.Join(repo, "template"), out)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ReadStack(filepath.Join(repo, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(built) != len(s.Functions) {
		t.Fatalf("built %v for %d functions", built, len(s.Functions))
	}
	for _, name := range []string{"echo", "hello-gpu"} {
		for _, f := range []string{"index.py", "template.yml", "Dockerfile", "requirements.txt", "function/handler.py",
			"function/requirements.txt"} {
			if _, err := os.Stat(filepath.Join(out, name, f)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		got, _ := os.ReadFile(filepath.Join(out, name, "function", "handler.py"))
		want, _ := os.ReadFile(filepath.Join(repo, "functions", name, "handler.py"))
		if string(got) != string(want) || len(want) == 0 {
			t.Errorf("%s: function/handler.py is not the function's handler", name)
		}
	}
	// A second build replaces the first (files removed from a handler disappear).
	stale := filepath.Join(out, "echo", "function", "stale.py")
	if err := os.WriteFile(stale, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(filepath.Join(repo, "stack.yml"), filepath.Join(repo, "template"), out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale file survived a rebuild: %v", err)
	}
}

func TestReadStackRefusesBadFunctions(t *testing.T) {
	for name, body := range map[string]string{
		"no lang":    "functions:\n  f:\n    handler: ./f\n",
		"no handler": "functions:\n  f:\n    lang: gpu-python\n",
		"bad name":   "functions:\n  Bad_Name:\n    lang: gpu-python\n    handler: ./f\n",
		"not yaml":   "functions: [\n",
	} {
		p := filepath.Join(t.TempDir(), "stack.yml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadStack(p); err == nil {
			t.Errorf("%s: ReadStack accepted %q", name, body)
		}
	}
	p := filepath.Join(t.TempDir(), "stack.yml")
	_ = os.WriteFile(p, []byte("functions:\n  f:\n    lang: nope\n    handler: ./f\n"), 0o644)
	if _, err := Build(p, filepath.Join(repo, "template"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "template") {
		t.Errorf("Build with a missing template: %v", err)
	}
}

// TestTemplateShape lints template/gpu-python: the files faas-cli expects, and a Dockerfile that runs index.py
// behind of-watchdog in http mode as a non-root user.
func TestTemplateShape(t *testing.T) {
	dir := filepath.Join(repo, "template", "gpu-python")
	for _, f := range []string{"template.yml", "Dockerfile", "index.py", "requirements.txt", "function/handler.py",
		"function/requirements.txt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("template file: %v", err)
		}
	}
	tpl, _ := os.ReadFile(filepath.Join(dir, "template.yml"))
	for _, want := range []string{"language: gpu-python", "fprocess: python3 index.py", "welcome_message:"} {
		if !strings.Contains(string(tpl), want) {
			t.Errorf("template.yml lacks %q", want)
		}
	}
	handler, _ := os.ReadFile(filepath.Join(dir, "function", "handler.py"))
	if !strings.Contains(string(handler), "def handle(event, context):") {
		t.Error("function/handler.py lacks handle(event, context)")
	}
	df, err := os.ReadFile(filepath.Join(dir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	lint := dockerfileLint(string(df))
	for _, p := range lint {
		t.Error("Dockerfile: " + p)
	}
}

// dockerfileLint returns the problems of a gpu-python Dockerfile.
func dockerfileLint(df string) []string {
	var problems []string
	lines := strings.Split(df, "\n")
	stages, lastUser := 0, ""
	known := map[string]bool{"FROM": true, "ARG": true, "RUN": true, "COPY": true, "ENV": true, "USER": true,
		"WORKDIR": true, "CMD": true, "HEALTHCHECK": true, "EXPOSE": true, "LABEL": true, "ENTRYPOINT": true}
	for i, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if i > 0 && strings.HasSuffix(strings.TrimSpace(lines[i-1]), "\\") {
			continue
		}
		word := strings.Fields(l)[0]
		if !known[word] {
			problems = append(problems, "unknown instruction "+word)
		}
		switch word {
		case "FROM":
			stages++
		case "USER":
			lastUser = strings.Fields(l)[1]
		}
	}
	for _, want := range []string{"of-watchdog", `mode="http"`, `upstream_url="http://127.0.0.1:5000"`,
		`fprocess="python3 index.py"`, `CMD ["fwatchdog"]`, "function/requirements.txt"} {
		if !strings.Contains(df, want) {
			problems = append(problems, "missing "+want)
		}
	}
	if stages < 2 {
		problems = append(problems, "not a multi-stage build")
	}
	if lastUser == "" || lastUser == "root" || lastUser == "0" {
		problems = append(problems, "the final stage runs as root")
	}
	return problems
}

func TestDockerfileLintFindsProblems(t *testing.T) {
	if p := dockerfileLint("FROM python\nUSER root\nCMD [\"python\", \"index.py\"]\n"); len(p) < 3 {
		t.Errorf("lint of a bad Dockerfile found only %v", p)
	}
}

// Each function folder deploys on its own (it is a build context of its own), so the example functions, and the
// replay's model function (embedded into the binary with go:embed, which cannot reach outside its package), carry
// their own copy of the ctypes driver wrapper; the copies must not drift apart.
func TestFunctionDriverCopiesStayIdentical(t *testing.T) {
	copies := []string{
		filepath.Join("functions", "vector-add", "cudadrv.py"),
		filepath.Join("functions", "mlp", "cudadrv.py"),
		filepath.Join("gpuserver", "simulate", "replay", "function", "cudadrv.py"),
	}
	first, err := os.ReadFile(filepath.Join(repo, copies[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range copies[1:] {
		b, err := os.ReadFile(filepath.Join(repo, c))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, b) {
			t.Errorf("%s and %s differ: change every copy (%v)", copies[0], c, copies)
		}
	}
}
