package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// routeInvoke sends one request the way the provider's proxy does: Route (waiting for readiness), the request,
// then done.
func routeInvoke(ctx context.Context, b *Backend, name, path string) (int, []byte, error) {
	u, done, err := b.Route(ctx, "", name)
	if err != nil {
		return 0, nil, err
	}
	defer done()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String()+path, strings.NewReader("x"))
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// TestRouteWaitsForTheFirstReplica pins deploy-then-invoke with no wait in between: Route waits until the replica
// is ready instead of answering not-ready.
func TestRouteWaitsForTheFirstReplica(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.Deploy(ctx, probe("probe")); err != nil {
		t.Fatal(err)
	}
	code, out, err := routeInvoke(ctx, b, "probe", "/")
	if err != nil || code != http.StatusOK {
		t.Fatalf("first invocation right after Deploy: %d %s %v", code, out, err)
	}
}

// TestRouteReportsReplicasThatNeverStart: a function that fails at import is answered with the reason soon,
// not after the caller's whole deadline.
func TestRouteReportsReplicasThatNeverStart(t *testing.T) {
	e := newEnv(t)
	buildContext(t, e.build, "broken", filepath.Join("testdata", "broken"))
	b := e.open(t)
	if err := b.Deploy(context.Background(), types.FunctionDeployment{Service: "broken", Image: "broken:latest"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour) // would hang the test if Route waited
	defer cancel()
	_, _, err := b.Route(ctx, "", "broken")
	if !errors.Is(err, provider.ErrNotReady) || errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "exit") {
		t.Fatalf("Route of a function that fails at import = %v, want ErrNotReady naming how it exited", err)
	}
}

// TestRollingUpdateUnderSteadyRequests pins the rolling update: while clients send a steady stream of requests,
// three updates each start the new replica before the old one stops, and no request gets anything but 200.
func TestRollingUpdateUnderSteadyRequests(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.Deploy(ctx, probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)

	var sent, failed atomic.Int64
	var failures sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, out, err := routeInvoke(ctx, b, "probe", "/")
				sent.Add(1)
				if err != nil || code != http.StatusOK {
					failed.Add(1)
					failures.Store(fmt.Sprintf("%d %s %v", code, out, err), true)
				}
			}
		}()
	}
	for i := 1; i <= 3; i++ {
		before := b.pids("probe")
		fd := probe("probe")
		want := fmt.Sprintf("v%d", i)
		fd.EnvVars["FROM_FUNCTION"] = want
		if err := b.Update(ctx, fd); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 60*time.Second, "the updated definition to answer", func() bool {
			code, out, err := routeInvoke(ctx, b, "probe", "/")
			var r probeReply
			return err == nil && code == http.StatusOK && json.Unmarshal(out, &r) == nil && r.Env["FROM_FUNCTION"] == want
		})
		testkit.Eventually(t, 60*time.Second, "the previous replica to stop", func() bool {
			for _, p := range before {
				if alive(p) {
					return false
				}
			}
			return true
		})
	}
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		var msgs []string
		failures.Range(func(k, _ any) bool { msgs = append(msgs, k.(string)); return len(msgs) < 5 })
		t.Fatalf("%d of %d requests failed during rolling updates, e.g. %v", failed.Load(), sent.Load(), msgs)
	}
	if sent.Load() < 10 {
		t.Fatalf("only %d requests were sent during the updates; the stream was not steady", sent.Load())
	}
	t.Logf("%d requests during 3 rolling updates, none failed", sent.Load())
}

// TestUpdateDrainsRequestsInFlight: the replica an update replaces stops only after the request it was serving
// has ended, and that request answers 200.
func TestUpdateDrainsRequestsInFlight(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.Deploy(ctx, probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	old := b.pids("probe")
	release := filepath.Join(t.TempDir(), "release")
	type result struct {
		code int
		out  []byte
		err  error
	}
	held := make(chan result, 1)
	go func() {
		code, out, err := routeInvoke(ctx, b, "probe", "/?hold="+release)
		held <- result{code, out, err}
	}()
	testkit.Eventually(t, 60*time.Second, "the held request to reach the function", func() bool {
		return strings.Contains(logText(t, b, "probe"), "holding "+release)
	})
	fd := probe("probe")
	fd.EnvVars["FROM_FUNCTION"] = "next"
	if err := b.Update(ctx, fd); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "the new replica to serve", func() bool {
		code, out, err := routeInvoke(ctx, b, "probe", "/")
		var r probeReply
		return err == nil && code == 200 && json.Unmarshal(out, &r) == nil && r.Env["FROM_FUNCTION"] == "next"
	})
	testkit.Eventually(t, 60*time.Second, "the old replica to be retired", func() bool {
		return strings.Contains(logText(t, b, "probe"), "replaced by the updated definition")
	})
	for _, p := range old {
		if !alive(p) {
			t.Fatalf("the old replica (pid %d) stopped while a request was in flight on it", p)
		}
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := <-held
	if r.err != nil || r.code != http.StatusOK || !bytes.Contains(r.out, []byte(`"held"`)) {
		t.Fatalf("the request held across the update: %d %s %v", r.code, r.out, r.err)
	}
	testkit.Eventually(t, 60*time.Second, "the drained replica to stop", func() bool {
		for _, p := range old {
			if alive(p) {
				return false
			}
		}
		return true
	})
}

// TestEnvProcessRunsWithTheConfiguredInterpreter: faas-cli deploys gpu-python with envProcess "python3 index.py"
// (older templates say "python index.py"); the backend runs either with Config.Python.
func TestEnvProcessRunsWithTheConfiguredInterpreter(t *testing.T) {
	e := newEnv(t)
	py, err := execLookPython()
	if err != nil {
		t.Skip(err)
	}
	wrapper := filepath.Join(t.TempDir(), "my-python")
	script := "#!/bin/sh\nVIA_INTERPRETER=my-python exec " + py + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e.cfg.Python = wrapper
	b := e.open(t)
	for i, envProcess := range []string{"python index.py", "python3 index.py", ""} {
		name := fmt.Sprintf("probe-%d", i)
		buildContext(t, e.build, name, filepath.Join("testdata", "probe"))
		fd := probe(name)
		fd.EnvProcess = envProcess
		if err := b.Deploy(context.Background(), fd); err != nil {
			t.Fatal(err)
		}
		waitReady(t, b, name, 1)
		if r := invokeProbe(t, b, name, "/", ""); r.Env["VIA_INTERPRETER"] != "my-python" {
			t.Errorf("envProcess %q did not run with Config.Python: env %v", envProcess, r.Env)
		}
	}
}

// TestCorruptRecordIsMovedAside: a truncated record and one naming another function are moved aside with a loud
// log line; every other function starts.
func TestCorruptRecordIsMovedAside(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b1, err := New(ctx, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	buildContext(t, e.build, "other", filepath.Join("testdata", "probe"))
	for _, n := range []string{"probe", "other"} {
		if err := b1.Deploy(ctx, probe(n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.state, "functions")
	raw, err := os.ReadFile(filepath.Join(dir, "other.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "other.json"), raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "stray.json"), []byte(`{"deployment":{"service":"probe","image":"x"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "huge.json"), []byte(`{"deployment":{"service":"huge","image":"x"},"replicas":100000}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testkit.Buffer
	e.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b2 := e.open(t)
	waitReady(t, b2, "probe", 1)
	if _, err := b2.Status(ctx, "", "other"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("the function of the corrupt record: %v, want not restored", err)
	}
	for _, n := range []string{"other", "stray", "huge"} {
		matches, _ := filepath.Glob(filepath.Join(dir, n+".json.corrupt-*"))
		if len(matches) != 1 {
			t.Errorf("%s.json was not moved aside: %v", n, matches)
		}
		if _, err := os.Stat(filepath.Join(dir, n+".json")); !os.IsNotExist(err) {
			t.Errorf("%s.json is still in place: %v", n, err)
		}
		if !strings.Contains(logs.String(), n+".json") || !strings.Contains(logs.String(), "CORRUPT") {
			t.Errorf("no loud log line about %s.json:\n%s", n, logs.String())
		}
	}
	// The function can be deployed again under the same name.
	if err := b2.Deploy(ctx, probe("other")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b2, "other", 1)
}

// TestGPUEnvironmentCarriesTheWholeSpec: a GPU function's replicas get every requirement, so that one that
// registers itself (FAAS_GPU_SELF_REGISTER=1) keeps its SLO, percentile and isolation.
func TestGPUEnvironmentCarriesTheWholeSpec(t *testing.T) {
	e := newEnv(t)
	e.cfg.GPUEnv = func(fn string) map[string]string { return map[string]string{"FAAS_GPU_TOKEN": "t-" + fn} }
	b := e.open(t)
	fd := probe("probe")
	fd.Annotations = &map[string]string{"com.openfaas.gpu.memory": "1Gi", "com.openfaas.gpu.slo": "80ms",
		"com.openfaas.gpu.slo.percentile": "99.5", "com.openfaas.gpu.isolation": "isolated"}
	env := map[string]string{}
	for _, kv := range b.env(record{Deployment: fd}, "probe-1", 1234) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for k, want := range map[string]string{"FAAS_GPU": "1", "FAAS_GPU_FUNCTION": "probe",
		"FAAS_GPU_MEMORY_BYTES": "1073741824", "FAAS_GPU_SLO": "80ms", "FAAS_GPU_SLO_PERCENTILE": "99.5",
		"FAAS_GPU_ISOLATION": "isolated", "FAAS_GPU_TOKEN": "t-probe", "PORT": "1234"} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
}

// TestMissingBuildContextNamesEachFolderOnce: the error for a function without code names the folders it looked in,
// each once (the image and the function usually share a name).
func TestMissingBuildContextNamesEachFolderOnce(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	err := b.Deploy(context.Background(), types.FunctionDeployment{Service: "ghost", Image: "ghost:latest"})
	want := filepath.Join(e.build, "ghost")
	if !errors.Is(err, provider.ErrInvalid) || strings.Count(err.Error(), want) != 1 {
		t.Fatalf("Deploy without a build context: %v, want ErrInvalid naming %s once", err, want)
	}
	err = b.Deploy(context.Background(), types.FunctionDeployment{Service: "ghost", Image: "team/spectre:1"})
	if err == nil || strings.Count(err.Error(), want) != 1 || !strings.Contains(err.Error(), filepath.Join(e.build, "spectre")) {
		t.Fatalf("Deploy without a build context: %v, want both folders named once", err)
	}
}
