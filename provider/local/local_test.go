package local

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func TestImageDir(t *testing.T) {
	for in, want := range map[string]string{
		"hello-gpu:latest":                  "hello-gpu",
		"hello-gpu":                         "hello-gpu",
		"ghcr.io/x/hello-gpu:0.1":           "hello-gpu",
		"localhost:5000/team/echo":          "echo",
		"localhost:5000/y@sha256:abcdef01":  "y",
		"docker.io/library/echo:1@sha256:0": "echo",
	} {
		if got := ImageDir(in); got != want {
			t.Errorf("ImageDir(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDeployInvokeScaleDelete(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	if err := b.Deploy(ctx, probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)

	r := invokeProbe(t, b, "probe", "/sub/path?x=1", "hello")
	if r.Body != "hello" || r.Path != "/sub/path" || r.Query["x"] != "1" {
		t.Errorf("reply %+v: want body hello, path /sub/path, query x=1", r)
	}
	if r.Env["EXTRA"] != "from-config" || r.Env["FROM_FUNCTION"] != "yes" || r.Env["FAAS_GPU"] != "" {
		t.Errorf("env %v: want EXTRA from Config.Env, FROM_FUNCTION from envVars, no FAAS_GPU", r.Env)
	}
	if r.Hostname != "probe-1" {
		t.Errorf("hostname %q, want the instance name probe-1", r.Hostname)
	}
	testkit.Eventually(t, 60*time.Second, "the request in the logs", func() bool { return strings.Contains(logText(t, b, "probe"), "request POST /sub/path") })

	st, err := b.Status(ctx, provider.DefaultNamespace, "probe")
	if err != nil || st.Replicas != 1 || st.Image != "ghcr.io/example/probe:0.1" || st.Namespace != provider.DefaultNamespace {
		t.Errorf("Status = %+v, %v", st, err)
	}
	list, err := b.List(ctx, "")
	if err != nil || len(list) != 1 || list[0].Name != "probe" {
		t.Errorf("List = %+v, %v", list, err)
	}

	// Scale to 0: the process stops and Resolve says not ready.
	pid := r.PID
	if err := b.Scale(ctx, "", "probe", 0); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("pid %d still alive after scale to 0", pid)
	}
	if _, err := b.Resolve(ctx, "", "probe"); !isErr(err, provider.ErrNotReady) {
		t.Errorf("Resolve after scale to 0 = %v, want ErrNotReady", err)
	}
	if st, _ := b.Status(ctx, "", "probe"); st.Replicas != 0 || st.AvailableReplicas != 0 {
		t.Errorf("Status after scale 0 = %d/%d", st.AvailableReplicas, st.Replicas)
	}

	// Scale to 2: Resolve spreads requests over both.
	if err := b.Scale(ctx, "", "probe", 2); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 2)
	pids := map[int]bool{}
	for i := 0; i < 4; i++ {
		pids[invokeProbe(t, b, "probe", "/", "").PID] = true
	}
	if len(pids) != 2 {
		t.Errorf("4 requests over 2 replicas reached pids %v, want 2 distinct", pids)
	}

	// Delete stops every process and forgets the function.
	running := b.pids("probe")
	if err := b.Delete(ctx, "", "probe"); err != nil {
		t.Fatal(err)
	}
	for _, p := range running {
		if alive(p) {
			t.Errorf("pid %d alive after delete", p)
		}
	}
	if _, err := b.Status(ctx, "", "probe"); !isErr(err, provider.ErrNotFound) {
		t.Errorf("Status after delete = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(e.state, "functions", "probe.json")); !os.IsNotExist(err) {
		t.Errorf("record after delete: %v", err)
	}
	if _, err := b.Logs(ctx, logs.Request{Name: "probe"}); !isErr(err, provider.ErrNotFound) {
		t.Errorf("Logs after delete = %v, want ErrNotFound", err)
	}
}

func TestCrashedReplicaIsRestarted(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	if err := b.Deploy(context.Background(), probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	first := invokeProbe(t, b, "probe", "/", "").PID
	u, err := b.Resolve(context.Background(), "", "probe")
	if err != nil {
		t.Fatal(err)
	}
	// The process exits in the middle of the request.
	if resp, err := httpPost(u.String() + "/?crash=1"); err == nil {
		t.Fatalf("crash request answered %d", resp)
	}
	testkit.Eventually(t, 60*time.Second, "a restarted replica", func() bool {
		if _, err := b.Resolve(context.Background(), "", "probe"); err != nil {
			return false
		}
		p := b.pids("probe")
		return len(p) == 1 && p[0] != first
	})
	if second := invokeProbe(t, b, "probe", "/", "").PID; second == first {
		t.Errorf("same pid %d after crash", first)
	}
	if text := logText(t, b, "probe"); !strings.Contains(text, "exit status 3; restarting in") {
		t.Errorf("logs do not record the crash:\n%s", text)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	b1, err := New(ctx, e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b1.CreateSecret(ctx, types.Secret{Name: "api-key", Value: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	fd := probe("probe")
	fd.Secrets = []string{"api-key"}
	if err := b1.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	if err := b1.Scale(ctx, "", "probe", 2); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b1, "probe", 2)
	old := b1.pids("probe")
	if err := b1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range old {
		if alive(p) {
			t.Errorf("pid %d alive after Close", p)
		}
	}

	b2 := e.open(t)
	waitReady(t, b2, "probe", 2)
	st, err := b2.Status(ctx, "", "probe")
	if err != nil || len(st.Secrets) != 1 || st.Replicas != 2 {
		t.Errorf("restored Status = %+v, %v", st, err)
	}
	code, out := invoke(t, b2, "probe", "/?secret=api-key", "")
	if code != 200 || string(out) != "s3cret" {
		t.Errorf("secret read by restored function: %d %q", code, out)
	}
	secrets, err := b2.ListSecrets(ctx, "")
	if err != nil || len(secrets) != 1 || secrets[0].Name != "api-key" || secrets[0].Value != "" {
		t.Errorf("ListSecrets = %+v, %v", secrets, err)
	}
	if text := logText(t, b2, "probe"); !strings.Contains(text, "probe-1 faas-gpu: stopped") {
		t.Errorf("logs of the previous run are not kept across a restart:\n%s", text)
	}
	fi, err := os.Stat(filepath.Join(e.state, "secrets", "api-key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file: %v, mode %v; want 0600", err, fi.Mode())
	}
}

func TestSecretsSeenByFunction(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	if err := b.CreateSecret(ctx, types.Secret{Name: "token", RawValue: []byte("one")}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSecret(ctx, types.Secret{Name: "token", Value: "again"}); !isErr(err, provider.ErrExists) {
		t.Errorf("duplicate CreateSecret = %v, want ErrExists", err)
	}
	fd := probe("probe")
	fd.Secrets = []string{"token"}
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	if code, out := invoke(t, b, "probe", "/?secret=token", ""); code != 200 || string(out) != "one" {
		t.Errorf("secret = %d %q, want one", code, out)
	}
	if err := b.UpdateSecret(ctx, types.Secret{Name: "token", Value: "two"}); err != nil {
		t.Fatal(err)
	}
	if code, out := invoke(t, b, "probe", "/?secret=token", ""); code != 200 || string(out) != "two" {
		t.Errorf("updated secret = %d %q, want two", code, out)
	}
	if err := b.UpdateSecret(ctx, types.Secret{Name: "nope", Value: "x"}); !isErr(err, provider.ErrNotFound) {
		t.Errorf("UpdateSecret unknown = %v, want ErrNotFound", err)
	}
	if err := b.DeleteSecret(ctx, "", "token"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSecret(ctx, "", "token"); !isErr(err, provider.ErrNotFound) {
		t.Errorf("DeleteSecret twice = %v, want ErrNotFound", err)
	}
	if err := b.CreateSecret(ctx, types.Secret{Name: "../escape", Value: "x"}); !isErr(err, provider.ErrInvalid) {
		t.Errorf("CreateSecret ../escape = %v, want ErrInvalid", err)
	}
}

func TestBadInputs(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	ann := func(k, v string) *map[string]string { return &map[string]string{k: v} }
	bad := []struct {
		name  string
		fd    types.FunctionDeployment
		names string
	}{
		{"no service", types.FunctionDeployment{Image: "probe"}, "service"},
		{"bad name", types.FunctionDeployment{Service: "Bad_Name", Image: "probe"}, "service"},
		{"no image", types.FunctionDeployment{Service: "probe"}, "image"},
		{"other namespace", types.FunctionDeployment{Service: "probe", Image: "probe", Namespace: "prod"}, "prod"},
		{"bad annotation", types.FunctionDeployment{Service: "probe", Image: "probe",
			Annotations: ann("com.openfaas.gpu.memory", "lots")}, "com.openfaas.gpu.memory"},
		{"missing secret", types.FunctionDeployment{Service: "probe", Image: "probe", Secrets: []string{"nope"}}, "nope"},
		{"no build context", types.FunctionDeployment{Service: "ghost", Image: "ghost:latest"}, "ghost"},
		{"no build context, the flag", types.FunctionDeployment{Service: "ghost", Image: "ghost:latest"}, "--build-dir"},
		{"bad scale label", types.FunctionDeployment{Service: "probe", Image: "probe",
			Labels: ann(LabelScaleMin, "many")}, LabelScaleMin},
		{"bad scale max", types.FunctionDeployment{Service: "probe", Image: "probe",
			Labels: ann(autoscale.LabelMax, "11")}, autoscale.LabelMax},
		{"scale type rps (annotation)", types.FunctionDeployment{Service: "probe", Image: "probe",
			Annotations: ann(autoscale.LabelType, "rps")}, autoscale.LabelType},
		{"bad zero duration", types.FunctionDeployment{Service: "probe", Image: "probe",
			Labels: ann(autoscale.LabelZeroDuration, "soon")}, autoscale.LabelZeroDuration},
	}
	for _, tt := range bad {
		err := b.Deploy(ctx, tt.fd)
		if !isErr(err, provider.ErrInvalid) || !strings.Contains(err.Error(), tt.names) {
			t.Errorf("%s: Deploy = %v, want ErrInvalid naming %s", tt.name, err, tt.names)
		}
	}
	if err := b.Update(ctx, probe("probe")); !isErr(err, provider.ErrNotFound) {
		t.Errorf("Update unknown = %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "", "probe"); !isErr(err, provider.ErrNotFound) {
		t.Errorf("Delete unknown = %v, want ErrNotFound", err)
	}
	if err := b.Scale(ctx, "", "probe", 1); !isErr(err, provider.ErrNotFound) {
		t.Errorf("Scale unknown = %v, want ErrNotFound", err)
	}
	if _, err := b.Resolve(ctx, "", "probe"); !isErr(err, provider.ErrNotFound) {
		t.Errorf("Resolve unknown = %v, want ErrNotFound", err)
	}
	fd := probe("probe")
	fd.Labels = &map[string]string{LabelScaleMin: "0"}
	if err := b.Deploy(ctx, fd); err != nil {
		t.Fatal(err)
	}
	if err := b.Deploy(ctx, fd); !isErr(err, provider.ErrExists) {
		t.Errorf("duplicate Deploy = %v, want ErrExists", err)
	}
	if err := b.Scale(ctx, "", "probe", 1000); !isErr(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "replicas") {
		t.Errorf("Scale 1000 = %v, want ErrInvalid naming replicas", err)
	}
	if _, err := b.List(ctx, "prod"); !isErr(err, provider.ErrInvalid) {
		t.Errorf("List(prod) = %v, want ErrInvalid", err)
	}
}

func TestUpdateRestartsWithNewDefinition(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	ctx := context.Background()
	if err := b.Deploy(ctx, probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	before := invokeProbe(t, b, "probe", "/", "")
	fd := probe("probe")
	fd.EnvVars["FROM_FUNCTION"] = "updated"
	fd.Annotations = &map[string]string{"com.openfaas.gpu.memory": "1Gi"}
	if err := b.Update(ctx, fd); err != nil {
		t.Fatal(err)
	}
	// A rolling update: the old replica stops once the new one is ready.
	testkit.Eventually(t, 60*time.Second, "the old replica to stop", func() bool { return !alive(before.PID) })
	waitReady(t, b, "probe", 1)
	// The GPU settings reach the process; without a gpuserver socket the request itself is refused by index.py.
	code, out := invoke(t, b, "probe", "/", "")
	if code != 503 || !strings.Contains(string(out), "gpuserver") {
		t.Errorf("GPU function without gpuserver answered %d %s, want 503 naming the gpuserver", code, out)
	}
}

func TestFallbackTemplateAndHandlerFolders(t *testing.T) {
	needPython(t)
	dir := t.TempDir()
	cfg := Config{StateDir: filepath.Join(dir, "state"), BuildDir: filepath.Join(dir, "build"),
		TemplatesDir: filepath.Join("..", "..", "template"), FunctionsDir: "testdata"}
	b, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	if err := b.Deploy(context.Background(), types.FunctionDeployment{Service: "probe", Image: "probe:latest"}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	if r := invokeProbe(t, b, "probe", "/", "via fallback"); r.Body != "via fallback" {
		t.Errorf("reply %+v", r)
	}
}

func TestLogsFollowTailSince(t *testing.T) {
	e := newEnv(t)
	b := e.open(t)
	if err := b.Deploy(context.Background(), probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := b.Logs(ctx, logs.Request{Name: "probe", Follow: true, Tail: 1})
	if err != nil {
		t.Fatal(err)
	}
	invokeProbe(t, b, "probe", "/followed", "")
	deadline := time.After(60 * time.Second)
	for found := false; !found; {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatal("follow stream ended")
			}
			found = strings.Contains(m.Text, "request POST /followed") && m.Name == "probe" && m.Instance == "probe-1"
		case <-deadline:
			t.Fatal("followed log line never arrived")
		}
	}
	cancel()
	for range ch { // the stream ends with ctx
	}

	tail, err := b.Logs(context.Background(), logs.Request{Name: "probe", Tail: 2})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range tail {
		n++
	}
	if n != 2 {
		t.Errorf("tail 2 gave %d lines", n)
	}
	future := time.Now().Add(time.Hour)
	since, err := b.Logs(context.Background(), logs.Request{Name: "probe", Since: &future})
	if err != nil {
		t.Fatal(err)
	}
	for m := range since {
		t.Errorf("line after since=future: %v", m)
	}
	if data, err := os.ReadFile(filepath.Join(e.state, "logs", "probe.log")); err != nil || !strings.Contains(string(data), "/followed") {
		t.Errorf("log file: %v", err)
	}
}

func TestLogbookRing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	l := newLogbook(3, path)
	for i := 0; i < 5; i++ {
		l.append(logs.Message{Text: strconv.Itoa(i)})
	}
	msgs, seq, _, _ := l.since(0)
	if seq != 5 || len(msgs) != 3 || msgs[0].Text != "2" || msgs[2].Text != "4" {
		t.Errorf("since(0) = %v, seq %d; want 2,3,4 and 5", msgs, seq)
	}
	msgs, _, _, _ = l.since(4)
	if len(msgs) != 1 || msgs[0].Text != "4" {
		t.Errorf("since(4) = %v, want [4]", msgs)
	}
	l.close()

	// A new logbook on the same file starts with the last lines of the old one.
	l2 := newLogbook(2, path)
	defer l2.close()
	l2.append(logs.Message{Text: "5"})
	msgs, _, _, _ = l2.since(0)
	if len(msgs) != 2 || msgs[0].Text != "4" || msgs[1].Text != "5" {
		t.Errorf("reloaded logbook = %v, want 4,5", msgs)
	}
}

// TestChildDiesWithParent runs a backend in a helper process, SIGKILLs the helper and checks that the function
// process it started dies too (parent-death signal).
func TestChildDiesWithParent(t *testing.T) {
	e := newEnv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "FAAS_GPU_LOCAL_HELPER=1", "HELPER_STATE="+e.state, "HELPER_BUILD="+e.build)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var child int
	for child == 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("helper exited before reporting its child")
			}
			if p, found := strings.CutPrefix(l, "CHILD "); found {
				child, _ = strconv.Atoi(p)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("helper never reported its child")
		}
	}
	if !alive(child) {
		t.Fatalf("child %d not alive while helper runs", child)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("child %d to die with its parent", child), func() bool { return !alive(child) })
}

// TestHelperProcess is the helper of TestChildDiesWithParent; it does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("FAAS_GPU_LOCAL_HELPER") != "1" {
		return
	}
	b, err := New(context.Background(), Config{StateDir: os.Getenv("HELPER_STATE"), BuildDir: os.Getenv("HELPER_BUILD")})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Deploy(context.Background(), probe("probe")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, b, "probe", 1)
	fmt.Printf("CHILD %d\n", b.pids("probe")[0])
	select {} // until SIGKILLed
}
