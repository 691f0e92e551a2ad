package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// startProcess runs the faas-gpu binary with args until the test ends (SIGINT, then SIGKILL).
func startProcess(t *testing.T, args ...string) *testkit.Buffer {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	out := &testkit.Buffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = t.TempDir()
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
			t.Errorf("faas-gpu %s did not exit after SIGINT", args[0])
		}
		if t.Failed() {
			t.Logf("faas-gpu %s output:\n%s", args[0], out.String())
		}
	})
	return out
}

// TestStandaloneProviderRunsCUDAFunctions: `faas-gpu provider` beside `faas-gpu gpuserver` (not `up`) gives GPU
// functions what up gives them (the shim, the remoting socket, the token), keeps their SLO, listens where -host
// says, and the CUDA function answers its first call right after the deploy.
func TestStandaloneProviderRunsCUDAFunctions(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu gpuserver, faas-gpu provider and python functions")
	}
	root := repoRoot(t)
	dir, err := os.MkdirTemp("", "sa") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock, key := filepath.Join(dir, "gpuserver.sock"), filepath.Join(dir, "gpuserver.key")
	gsArgs := []string{"gpuserver", "--socket", sock, "--remoting-socket", filepath.Join(dir, "remoting.sock"),
		"--key-file", key, "--repository-dir", filepath.Join(dir, "repository"), "--gpus", "v100x4",
		"--gpu-memory", "4Gi", "--log-level", "debug"}
	if os.Geteuid() == 0 {
		// The provider sandboxes functions under ids of their own, members of the sandbox's group (the first of
		// its -sandbox-ids): the gpuserver's sockets are theirs to connect to through that group, as up does.
		gsArgs = append(gsArgs, "--socket-group", strconv.Itoa(sandbox.DefaultFirstID))
	}
	startProcess(t, gsArgs...)
	var gs *client.Client
	testkit.EventuallyNil(t, 60*time.Second, "the gpuserver", func() error {
		if gs == nil { // its key file appears as it starts
			c, err := gpuserverAdmin(sock, key)
			if err != nil {
				return err
			}
			gs = c
		}
		_, err := gs.Status(context.Background())
		return err
	})
	port := freePort(t)
	startProcess(t, "provider", "--port", strconv.Itoa(port), "--host", "127.0.0.1",
		"--state-dir", filepath.Join(dir, "provider"), "--build-dir", filepath.Join(dir, "build"),
		"--templates-dir", filepath.Join(root, "template"), "--functions-dir", filepath.Join(root, "functions"),
		"--gpuserver-socket", sock, "--gpuserver-key-file", key, "--shim-dir", shimDir(t), "--log-level", "debug")
	in := &instance{url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	testkit.EventuallyNil(t, 60*time.Second, "the provider", func() error {
		resp, err := http.Get(in.url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		creds, err := basicauth.Read(filepath.Join(dir, "provider", "secrets"))
		if err != nil {
			return err
		}
		in.user, in.password = creds.User, creds.Password
		return nil
	})
	deploy(t, in, types.FunctionDeployment{Service: "vector-add", Image: "vector-add:latest",
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi", "com.openfaas.gpu.slo": "200ms"}})
	r := call(t, http.MethodPost, in.url+"/function/vector-add", `{"a": [1, 2], "b": [10, 20]}`, nil)
	var va struct{ C []float64 }
	if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &va) != nil || len(va.C) != 2 || va.C[0] != 11 || va.C[1] != 22 {
		t.Fatalf("vector-add through the standalone provider: %d %s, want c = [11 22]", r.code, r.body)
	}
	st, err := gs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range st.Functions {
		if f.Name == "vector-add" {
			found = f.SLO == 200*time.Millisecond && f.MemoryBytes == 64<<20 && f.Served >= 1
		}
	}
	if !found {
		t.Fatalf("the gpuserver does not show vector-add with its SLO and a served request: %+v", st.Functions)
	}

	// Scale from zero: scaled to 0, the function is woken by the next call, which is answered.
	if r := in.system(t, http.MethodPost, "/system/scale-function/vector-add",
		types.ScaleServiceRequest{ServiceName: "vector-add", Replicas: 0}); r.code >= 300 {
		t.Fatalf("scale to 0: %d %s", r.code, r.body)
	}
	testkit.EventuallyNil(t, 30*time.Second, "vector-add at 0 replicas", func() error {
		if st := functionStatus(t, in, "vector-add"); st.Replicas != 0 || st.AvailableReplicas != 0 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	r = call(t, http.MethodPost, in.url+"/function/vector-add", `{"a": [1, 2], "b": [10, 20]}`, nil)
	if r.code != http.StatusOK || json.Unmarshal([]byte(r.body), &va) != nil || len(va.C) != 2 || va.C[0] != 11 || va.C[1] != 22 {
		t.Fatalf("vector-add at 0 replicas through the standalone provider: %d %s, want it woken and c = [11 22]",
			r.code, r.body)
	}
}
