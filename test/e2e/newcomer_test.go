package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// faasCLIVersion is the faas-cli the README was tried with.
const faasCLIVersion = "0.18.12"

// faasCLI finds the real faas-cli: $FAAS_GPU_FAAS_CLI, else faas-cli on PATH, else faas-cli-0.18.12 in
// ${FAAS_GPU_CACHE:-~/.cache/faas-gpu}/bin (built there from faas-cli's public source at tag 0.18.12, whose vendored
// dependencies build offline: `go build -mod=vendor -o .../faas-cli-0.18.12 .`). "" when there is none: the tests
// then send the requests faas-cli sends.
func faasCLI() string {
	if p := os.Getenv("FAAS_GPU_FAAS_CLI"); p != "" {
		return p
	}
	if p, err := exec.LookPath("faas-cli"); err == nil {
		return p
	}
	cache := os.Getenv("FAAS_GPU_CACHE")
	if cache == "" {
		if c, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(c, "faas-gpu")
		}
	}
	p := filepath.Join(cache, "bin", "faas-cli-"+faasCLIVersion)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	return ""
}

// checkout lays out a folder as the repository is after `make run` (bin/faas-gpu, shim/build, template/, functions/,
// stack.yml and build/<fn>/ from `make functions`), so that README commands run there verbatim: `faas-gpu up` with
// its defaults finds the shim, the build contexts and ./.faas-gpu as in the repository.
func checkout(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	shimDir(t) // builds it
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{"bin/faas-gpu": bin}
	for _, name := range []string{"shim", "template", "functions", "stack.yml"} {
		links[name] = filepath.Join(root, name)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	// make functions: go run ./cmd/shrinkwrap -f stack.yml -templates template -out build
	if _, err := shrinkwrap.Build(filepath.Join(dir, "stack.yml"), filepath.Join(dir, "template"),
		filepath.Join(dir, "build")); err != nil {
		t.Fatalf("make functions: %v", err)
	}
	return dir
}

// shell runs a README command line with bash in dir, with env added, and returns its output.
func shell(t *testing.T, dir string, env []string, line string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "-eu", "-o", "pipefail", "-c", line)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// readmeCLI runs the README's faas-cli lines with the real faas-cli (a folder on PATH holds it as faas-cli), against
// in: the gateway address is the only change (OPENFAAS_URL, which faas-cli reads when stack.yml names the default
// gateway, and the --gateway of faas-cli login), and faas-cli's config goes to a folder of the test's own.
type readmeCLI struct {
	t   *testing.T
	dir string
	env []string
	in  *instance
}

func newReadmeCLI(t *testing.T, dir string, in *instance) *readmeCLI {
	t.Helper()
	path := faasCLI()
	if path == "" {
		return &readmeCLI{t: t, dir: dir, in: in}
	}
	binDir := t.TempDir()
	if err := os.Symlink(path, filepath.Join(binDir, "faas-cli")); err != nil {
		t.Fatal(err)
	}
	return &readmeCLI{t: t, dir: dir, in: in, env: []string{"PATH=" + binDir + ":" + os.Getenv("PATH"),
		"OPENFAAS_URL=" + in.url, "OPENFAAS_CONFIG=" + t.TempDir()}}
}

// real says whether the real faas-cli runs the lines.
func (c *readmeCLI) real() bool { return len(c.env) > 0 }

// run runs one README line (with http://127.0.0.1:8080 replaced by the instance's address) and fails on an error.
func (c *readmeCLI) run(line string) string {
	c.t.Helper()
	line = strings.ReplaceAll(line, "http://127.0.0.1:8080", c.in.url)
	out, err := shell(c.t, c.dir, c.env, line)
	if err != nil {
		c.t.Fatalf("%s: %v\n%s", line, err, out)
	}
	return out
}

// deploy is `faas-cli deploy --name NAME --image IMAGE [--env K=V]`.
func (c *readmeCLI) deploy(name, image, env string) {
	c.t.Helper()
	if c.real() {
		line := "faas-cli deploy --name " + name + " --image " + image
		if env != "" {
			line += " --env " + env
		}
		c.run(line)
		return
	}
	fd := types.FunctionDeployment{Service: name, Image: image, EnvVars: map[string]string{}}
	if k, v, ok := strings.Cut(env, "="); ok {
		fd.EnvVars[k] = v
	}
	deploy(c.t, c.in, fd)
}

// invoke is `echo -n BODY | faas-cli invoke NAME`; it fails unless the function answers 200.
func (c *readmeCLI) invoke(name, body string) string {
	c.t.Helper()
	if c.real() {
		return c.run("printf %s '" + body + "' | faas-cli invoke " + name)
	}
	r := call(c.t, http.MethodPost, c.in.url+"/function/"+name, body, nil)
	if r.code != http.StatusOK {
		c.t.Fatalf("invoke %s: %d %s", name, r.code, r.body)
	}
	return r.body
}

// describe is `faas-cli describe NAME` (without faas-cli: the status as JSON).
func (c *readmeCLI) describe(name string) string {
	c.t.Helper()
	if c.real() {
		return c.run("faas-cli describe " + name)
	}
	return c.in.system(c.t, http.MethodGet, "/system/function/"+name, nil).body
}

// list is `faas-cli list --json` (the annotations are in the JSON only).
func (c *readmeCLI) list() string {
	c.t.Helper()
	if c.real() {
		return c.run("faas-cli list --json")
	}
	return c.in.system(c.t, http.MethodGet, "/system/functions", nil).body
}

// TestReadmePyTorchFlowOnTheDefaultNode runs the README's PyTorch flow as a newcomer types it, on the defaults:
// `faas-gpu up --sim-kernels=dry` (no -gpus: on a machine without a GPU the simulated default node, which must be
// one the pinned CUDA 13 stack supports), `faas-cli login`, `faas-cli deploy -f stack.yml` (every function of
// stack.yml), then resnet and bert invoked with the README's examples through `faas-cli invoke`. Without a faas-cli
// the same requests are sent over HTTP. The first run installs resnet's and bert's pip requirements (2.8 GB) into
// the cache.
func TestReadmePyTorchFlowOnTheDefaultNode(t *testing.T) {
	pyEnv(t)
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Skip("this machine has an NVIDIA GPU: up serves it, and --sim-kernels=dry concerns simulated nodes only")
	}
	dir := checkout(t)
	// make run RUN_ARGS=--sim-kernels=dry, on a free port instead of 8080 (other tests share this machine).
	in := startUpIn(t, dir, filepath.Join(dir, ".faas-gpu"), 0, "--sim-kernels=dry")
	if !strings.Contains(in.out.String(), "node h100x8") {
		t.Fatalf("up without -gpus does not serve the simulated h100x8 node:\n%s", in.out.String())
	}
	cli := newReadmeCLI(t, dir, in)
	stack, err := shrinkwrap.ReadStack(filepath.Join(dir, "stack.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if cli.real() {
		cli.run("cat .faas-gpu/secrets/basic-auth-password | faas-cli login --gateway http://127.0.0.1:8080 " +
			"--username admin --password-stdin")
		cli.run("faas-cli deploy -f stack.yml")
	} else {
		t.Logf("no faas-cli (FAAS_GPU_FAAS_CLI, PATH, the cache's faas-cli-%s): sending its requests over HTTP",
			faasCLIVersion)
		for name, f := range stack.Functions {
			annotations := f.Annotations
			deploy(t, in, types.FunctionDeployment{Service: name, Image: f.Image, Annotations: &annotations})
		}
	}
	for _, fn := range []string{"resnet", "bert"} {
		waitStarted(t, in, fn)
	}
	invoke := func(fn, body string) string {
		t.Helper()
		if cli.real() {
			return cli.run(fmt.Sprintf("echo '%s' | faas-cli invoke %s", body, fn))
		}
		r := call(t, http.MethodPost, in.url+"/function/"+fn, body+"\n", nil)
		if r.code != http.StatusOK {
			t.Fatalf("invoke %s %s: %d %s", fn, body, r.code, r.body)
		}
		return r.body
	}
	for _, body := range []string{`{"seed": 1, "top_k": 3}`, `{"seed": 7, "batch": 4, "logits": true}`} {
		var a resnetAnswer
		out := invoke("resnet", body)
		if err := json.Unmarshal([]byte(out), &a); err != nil || a.Device != "cuda" || a.Batch < 1 ||
			len(a.TopK) != a.Batch {
			t.Fatalf("resnet %s: %v\n%.2000s\nits log:\n%s", body, err, out, tail(functionLogs(t, in, "resnet"), 40))
		}
	}
	for _, body := range []string{`{"text": "faas-gpu runs BERT on a pool of GPUs"}`, `{"seed": 1, "seq_len": 64, "batch": 8}`} {
		var a bertAnswer
		out := invoke("bert", body)
		if err := json.Unmarshal([]byte(out), &a); err != nil || a.Device != "cuda" || a.Pooled.Shape[1] != 768 {
			t.Fatalf("bert %s: %v\n%.2000s\nits log:\n%s", body, err, out, tail(functionLogs(t, in, "bert"), 40))
		}
	}
	if cli.real() {
		list := cli.run("faas-cli list")
		for name := range stack.Functions {
			if !strings.Contains(list, name) {
				t.Errorf("faas-cli list lacks %s:\n%s", name, list)
			}
		}
		if d := cli.run("faas-cli describe resnet"); !strings.Contains(d, "Ready") {
			t.Errorf("faas-cli describe resnet:\n%s", d)
		}
	}
	// The example functions beside them still compute exactly.
	if out := invoke("vector-add", `{"a": [1, 2, 3], "b": [10, 20, 30]}`); !strings.Contains(out, "[11.0, 22.0, 33.0]") {
		t.Fatalf("vector-add: %s", out)
	}
}

// TestFaasCLIAgainstUp drives `faas-gpu up` with the real faas-cli where one is found (else the requests it sends):
// a failed update shows in `faas-cli describe` and the list while the previous definition answers, and a fix rolls
// forward; `faas-cli version` shows the gateway and the provider parts, and `faas-cli version --json` decodes (up
// answers /system/info in the gateway's shape).
func TestFaasCLIAgainstUp(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up")
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	in := startUp(t, stateDir)
	login := func(t *testing.T) *readmeCLI {
		cli := newReadmeCLI(t, t.TempDir(), in)
		if cli.real() {
			cli.run("cat " + filepath.Join(stateDir, "secrets", "basic-auth-password") +
				" | faas-cli login --gateway http://127.0.0.1:8080 --username admin --password-stdin")
		}
		return cli
	}
	// Build contexts of echo and of a handler that fails at import, as a newcomer's typo would.
	broken := filepath.Join(t.TempDir(), "broken")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "handler.py"), []byte("import no_such_module\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, handler := range map[string]string{"broken": broken, "echo": filepath.Join(repoRoot(t), "functions", "echo")} {
		if err := shrinkwrap.Assemble(filepath.Join(repoRoot(t), "template", "gpu-python"), handler,
			filepath.Join(stateDir, "..", "build", name)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("failed update", func(t *testing.T) {
		cli := login(t)
		cli.deploy("greeter", "echo:latest", "")
		if got := cli.invoke("greeter", "hello"); got != "hello" {
			t.Fatalf("greeter: %q", got)
		}
		cli.deploy("greeter", "broken:latest", "")
		var text string
		testkit.EventuallyNil(t, 60*time.Second, "describe to show the failed update", func() error {
			if text = cli.describe("greeter"); !strings.Contains(text, "update not ready") {
				return fmt.Errorf("%s", text)
			}
			return nil
		})
		for _, want := range []string{"image broken:latest", "No module named 'no_such_module'",
			"previous definition (image echo:latest) keeps serving"} {
			if !strings.Contains(text, want) {
				t.Errorf("describe during a failed update lacks %q:\n%s", want, text)
			}
		}
		if !strings.Contains(cli.list(), "update not ready") {
			t.Errorf("the list (JSON) does not show the failed update")
		}
		if got := cli.invoke("greeter", "still here"); got != "still here" {
			t.Fatalf("during the failed update: %q, want the previous definition answering", got)
		}
		cli.deploy("greeter", "echo:latest", "FIXED=1") // a fix rolls forward
		testkit.EventuallyNil(t, 60*time.Second, "the fix to roll forward", func() error {
			if text = cli.describe("greeter"); strings.Contains(text, "faas-gpu/status") || !strings.Contains(text, "FIXED") {
				return fmt.Errorf("%s", text)
			}
			return nil
		})
		if got := cli.invoke("greeter", "fixed"); got != "fixed" {
			t.Fatalf("after the fix: %q", got)
		}
	})

	t.Run("limits", func(t *testing.T) {
		cli := login(t)
		stack := "version: 1.0\nprovider:\n  name: openfaas\nfunctions:\n  greedy:\n    image: echo:latest\n" +
			"    limits:\n      memory: lots\n"
		if err := os.WriteFile(filepath.Join(cli.dir, "stack.yml"), []byte(stack), 0o644); err != nil {
			t.Fatal(err)
		}
		var out string
		if cli.real() {
			var err error
			if out, err = shell(t, cli.dir, cli.env, "faas-cli deploy -f stack.yml"); err == nil {
				t.Fatalf("faas-cli deploy with limits.memory: lots succeeded:\n%s", out)
			}
		} else {
			r := in.system(t, http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "greedy",
				Image: "echo:latest", Limits: &types.FunctionResources{Memory: "lots"}})
			out = fmt.Sprintf("%d %s", r.code, r.body)
		}
		if !strings.Contains(out, "400") || !strings.Contains(out, `limits.memory: "lots" is not a quantity`) {
			t.Fatalf("deploy with limits.memory: lots: want 400 naming the field:\n%s", out)
		}
	})

	t.Run("async with a callback", func(t *testing.T) {
		cli := login(t)
		cli.deploy("echo", "echo:latest", "")
		type callback struct {
			status, body string
		}
		got := make(chan callback, 4)
		cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			got <- callback{r.Header.Get("X-Function-Status"), string(body)}
		}))
		defer cb.Close()
		// As the README shows it.
		line := "echo later | faas-cli invoke --async echo -H 'X-Callback-Url: " + cb.URL + "/'"
		if cli.real() {
			cli.run(line)
		} else {
			r := call(t, http.MethodPost, in.url+"/async-function/echo.openfaas-fn", "later\n",
				map[string]string{"X-Callback-Url": cb.URL + "/"})
			if r.code != http.StatusAccepted {
				t.Fatalf("%s: %d %s", line, r.code, r.body)
			}
		}
		select {
		case c := <-got:
			if c.status != "200" || c.body != "later\n" {
				t.Fatalf("callback: %+v", c)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("no callback within 60s")
		}
		// The natural mistake: faas-cli refuses it with a clear error (it never reaches the server); a misspelt
		// header name that does reach the front door is refused naming it.
		if cli.real() {
			out, err := shell(t, cli.dir, cli.env, "echo later | faas-cli invoke --async echo -H X-Callback-Url="+cb.URL+"/")
			if err == nil || !strings.Contains(out, "invalid header field name") {
				t.Errorf("faas-cli -H X-Callback-Url=URL: %v\n%s", err, out)
			}
		}
		r := call(t, http.MethodPost, in.url+"/async-function/echo", "later", map[string]string{"X-Callback": cb.URL})
		if r.code != http.StatusBadRequest || !strings.Contains(r.body, "header X-Callback: the callback URL goes in X-Callback-Url") {
			t.Errorf("a misspelt callback header: %d %s, want 400 naming it", r.code, r.body)
		}
		select {
		case c := <-got:
			t.Errorf("a refused call called back: %+v", c)
		default:
		}
	})

	t.Run("a function of your own", func(t *testing.T) {
		// The README's lines, in a folder laid out as the repository: ./template for faas-cli, ./build for up.
		cli := login(t)
		if !cli.real() {
			t.Skip("needs the real faas-cli (faas-cli new and build --shrinkwrap write the files)")
		}
		if err := os.Symlink(filepath.Join(repoRoot(t), "template"), filepath.Join(cli.dir, "template")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(stateDir, "..", "build"), filepath.Join(cli.dir, "build")); err != nil {
			t.Fatal(err)
		}
		stack := "version: 1.0\nprovider:\n  name: openfaas\n  gateway: http://127.0.0.1:8080\nfunctions:\n"
		if err := os.WriteFile(filepath.Join(cli.dir, "stack.yml"), []byte(stack), 0o644); err != nil {
			t.Fatal(err)
		}
		cli.run("faas-cli new my-fn --lang gpu-python --append stack.yml")
		cli.run("faas-cli build --shrinkwrap -f stack.yml --filter my-fn")
		cli.run("faas-cli deploy -f stack.yml --filter my-fn")
		var out string
		testkit.EventuallyNil(t, 60*time.Second, "my-fn answering", func() error {
			var err error
			if out, err = shell(t, cli.dir, cli.env, "echo | faas-cli invoke my-fn"); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		if !strings.Contains(out, "Hello from OpenFaaS!") {
			t.Fatalf("echo | faas-cli invoke my-fn: %s", out)
		}
	})

	t.Run("version", func(t *testing.T) {
		cli := login(t)
		var v struct {
			Gateway struct {
				URI, Version, SHA string
			} `json:"gateway"`
			Provider struct {
				Name, Orchestration, Version, SHA string
			} `json:"provider"`
		}
		if !cli.real() {
			r := in.system(t, http.MethodGet, "/system/info", nil)
			var g struct {
				Provider *struct {
					Name          string             `json:"provider"`
					Orchestration string             `json:"orchestration"`
					Version       *types.VersionInfo `json:"version"`
				} `json:"provider"`
				Version *types.VersionInfo `json:"version"`
			}
			if err := json.Unmarshal([]byte(r.body), &g); err != nil || g.Provider == nil || g.Version == nil ||
				g.Provider.Version == nil {
				t.Fatalf("/system/info is not in the gateway's shape: %d %s", r.code, r.body)
			}
			v.Gateway.Version, v.Provider.Name, v.Provider.Orchestration = g.Version.Release, g.Provider.Name, g.Provider.Orchestration
		} else {
			// --warn-update=false: the default asks GitHub for faas-cli's latest release, which this machine cannot.
			text := cli.run("faas-cli version --warn-update=false")
			for _, want := range []string{"Gateway", "uri:     " + in.url, "Provider", "name:          faas-gpu",
				"orchestration: local"} {
				if !strings.Contains(text, want) {
					t.Errorf("faas-cli version lacks %q:\n%s", want, text)
				}
			}
			if err := json.Unmarshal([]byte(cli.run("faas-cli version --json")), &v); err != nil {
				t.Fatalf("faas-cli version --json: %v", err)
			}
		}
		if v.Gateway.Version == "" || v.Provider.Name != "faas-gpu" || v.Provider.Orchestration != "local" {
			t.Fatalf("version: %+v", v)
		}
	})
}
