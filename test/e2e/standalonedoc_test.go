package e2e

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/provider/handlers"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// docBlock returns the commands of the first sh block after heading in the doc at path (relative to the
// repository): continuation lines joined, comments and blank lines dropped.
func docBlock(t *testing.T, path, heading string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), path))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i := strings.Index(text, heading)
	if i < 0 {
		t.Fatalf("%s has no heading %q", path, heading)
	}
	text = text[i:]
	start := strings.Index(text, "```sh\n")
	if start < 0 {
		t.Fatalf("%s: no sh block after %q", path, heading)
	}
	text = text[start+len("```sh\n"):]
	text = text[:strings.Index(text, "```")]
	var cmds []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		if j := strings.Index(line, " #"); j >= 0 {
			line = line[:j]
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur += strings.TrimSuffix(line, "\\")
			continue
		}
		cmds = append(cmds, strings.Join(strings.Fields(cur+line), " "))
		cur = ""
	}
	return cmds
}

// userCheckout lays out a folder as the repository is after `make run` for the standalone setup (bin/faas-gpu,
// shim/build, template/, functions/echo and vector-add, build/<fn>/), every file a copy, owned by uid (so that
// any user reads it wherever the repository is).
func userCheckout(t *testing.T, uid int) string {
	t.Helper()
	root := repoRoot(t)
	dir, err := os.MkdirTemp("", "fg-doc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string]string{filepath.Join(shimDir(t), "libcuda.so.1"): "shim/build/libcuda.so.1", bin: "bin/faas-gpu"}
	for _, tree := range []string{"template/gpu-python", "functions/echo", "functions/vector-add"} {
		if err := filepath.WalkDir(filepath.Join(root, tree), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || strings.Contains(p, "__pycache__") {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			copies[p] = rel
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for from, to := range copies {
		raw, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, to)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), raw, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, fn := range []string{"echo", "vector-add"} { // make functions
		if err := shrinkwrap.Assemble(filepath.Join(dir, "template", "gpu-python"), filepath.Join(dir, "functions", fn),
			filepath.Join(dir, "build", fn)); err != nil {
			t.Fatal(err)
		}
	}
	if err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() {
			if err := os.Chmod(p, 0o755); err != nil {
				return err
			}
		}
		return os.Lchown(p, uid, uid)
	}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runDocLine runs one documented command line in dir (through setpriv as uid when uid is not this process's) until
// the test ends; its output is logged when the test fails.
func runDocLine(t *testing.T, dir string, uid int, line string) {
	t.Helper()
	out := &testkit.Buffer{}
	argv := []string{"bash", "-eu", "-c", "exec " + line}
	if uid != os.Geteuid() {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("setpriv (util-linux) is not installed: cannot run the setup as another user")
		}
		argv = append([]string{setpriv, "--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(uid),
			"--clear-groups", "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s did not exit after SIGINT", line)
		}
		if t.Failed() {
			t.Logf("%s:\n%s", line, out.String())
		}
	})
}

// TestStandaloneSetupAsDocumented runs docs/openfaas-gateway.md's standalone setup (`faas-gpu gpuserver` and
// `faas-gpu provider` without up) verbatim in a folder laid out as the repository, as root and as an ordinary user
// (nobody): only its /tmp/fg and port 8081 are changed to a folder and a port of the test's own. echo and the CUDA
// function vector-add then answer through the provider.
func TestStandaloneSetupAsDocumented(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu gpuserver, faas-gpu provider and python functions")
	}
	users := []int{os.Geteuid()}
	if os.Geteuid() == 0 {
		users = append(users, 65534) // nobody
	}
	cmds := docBlock(t, "docs/openfaas-gateway.md", "## Setup: `faas-gpu provider` and `faas-gpu gpuserver` without `up`")
	if len(cmds) != 2 || !strings.HasPrefix(cmds[0], "bin/faas-gpu gpuserver ") ||
		!strings.HasPrefix(cmds[1], "bin/faas-gpu provider ") || !strings.Contains(cmds[1], "--port 8081") {
		t.Fatalf("the documented setup is not a gpuserver and a provider command on port 8081: %q", cmds)
	}
	for _, uid := range users {
		t.Run("uid "+strconv.Itoa(uid), func(t *testing.T) {
			dir := userCheckout(t, uid)
			fg := filepath.Join(dir, "fg") // the doc's /tmp/fg
			port := freePort(t)
			for _, line := range cmds {
				line = strings.ReplaceAll(line, "/tmp/fg", fg)
				line = strings.ReplaceAll(line, "--port 8081", "--port "+strconv.Itoa(port))
				runDocLine(t, dir, uid, line)
				if strings.Contains(line, " gpuserver ") {
					testkit.EventuallyNil(t, 60*time.Second, "the gpuserver's sockets", func() error {
						_, err := os.Stat(filepath.Join(fg, "remoting.sock"))
						return err
					})
				}
			}
			in := &instance{url: fmt.Sprintf("http://127.0.0.1:%d", port)}
			testkit.EventuallyNil(t, 60*time.Second, "the provider", func() error {
				creds, err := basicauth.Read(filepath.Join(fg, "provider", "secrets"))
				if err != nil {
					return err
				}
				resp, err := http.Get(in.url + "/healthz")
				if err != nil {
					return err
				}
				resp.Body.Close()
				in.user, in.password = creds.User, creds.Password
				return nil
			})
			// faas-cli version against the provider reads the gateway's shape; a gateway in front reads the provider's.
			var gw handlers.GatewayInfo
			if r := in.system(t, http.MethodGet, "/system/info", nil); json.Unmarshal([]byte(r.body), &gw) != nil ||
				gw.Provider == nil || gw.Provider.Name != "faas-gpu" || gw.Version == nil {
				t.Errorf("/system/info to faas-cli: %d %s, want the gateway's shape", r.code, r.body)
			}
			var p types.ProviderInfo
			if r := call(t, http.MethodGet, in.url+"/system/info", nil, map[string]string{"X-Forwarded-For": "127.0.0.1",
				"Authorization": basicAuth(in.user, in.password)}); json.Unmarshal([]byte(r.body), &p) != nil || p.Name != "faas-gpu" {
				t.Errorf("/system/info to a gateway: %d %s, want the provider's shape", r.code, r.body)
			}
			deploy(t, in, types.FunctionDeployment{Service: "echo", Image: "echo:latest"})
			deploy(t, in, types.FunctionDeployment{Service: "vector-add", Image: "vector-add:latest",
				Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi"}})
			if got := invokeReady(t, in.url+"/function/echo", "hello"); got != "hello" {
				t.Fatalf("echo: %q", got)
			}
			if got := invokeReady(t, in.url+"/function/vector-add", `{"a": [1, 2], "b": [10, 20]}`); !strings.Contains(got, "[11.0, 22.0]") {
				t.Fatalf("vector-add: %q", got)
			}
		})
	}
}
