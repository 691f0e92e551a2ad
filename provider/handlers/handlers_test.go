package handlers

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

func TestFunctionLifecycleLikeFaasCLI(t *testing.T) {
	f := newFixture(t)

	// faas-cli deploy: PUT first (404 for a new function), then POST.
	f.expect(t, http.MethodPut, "/system/functions", deployment("echo"), http.StatusNotFound, "echo")
	f.expect(t, http.MethodPost, "/system/functions", deployment("echo"), http.StatusAccepted, "")
	f.expect(t, http.MethodPost, "/system/functions", deployment("echo"), http.StatusConflict, "already exists")
	f.waitReady(t, "echo", 1)

	out := f.expect(t, http.MethodPost, "/function/echo", "hello, echo", http.StatusOK, "")
	if out != "hello, echo" {
		t.Errorf("echo answered %q", out)
	}
	// The namespace may be named after a dot, as the gateway does.
	f.expect(t, http.MethodPost, "/function/echo.openfaas-fn", "dotted", http.StatusOK, "dotted")

	var list []types.FunctionStatus
	if err := json.Unmarshal([]byte(f.expect(t, http.MethodGet, "/system/functions", nil, http.StatusOK, "")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "echo" || list[0].Replicas != 1 || list[0].AvailableReplicas != 1 {
		t.Errorf("list = %+v", list)
	}

	// Scale to 0: the next call wakes it (the local backend scales from zero) and is answered; then back to 1.
	f.expect(t, http.MethodPost, "/system/scale-function/echo", types.ScaleServiceRequest{ServiceName: "echo", Replicas: 0},
		http.StatusAccepted, "")
	if out := f.expect(t, http.MethodPost, "/function/echo", "x", http.StatusOK, ""); out != "x" {
		t.Errorf("scaled to 0, then invoked: %q, want the function woken and answering", out)
	}
	f.expect(t, http.MethodPost, "/system/scale-function/echo", types.ScaleServiceRequest{Replicas: 1}, http.StatusAccepted, "")
	f.waitReady(t, "echo", 1)
	f.expect(t, http.MethodPost, "/function/echo", "back", http.StatusOK, "back")

	// Update (PUT on an existing function) keeps it serving.
	upd := deployment("echo")
	upd.EnvVars = map[string]string{"A": "b"}
	f.expect(t, http.MethodPut, "/system/functions", upd, http.StatusAccepted, "")
	f.waitReady(t, "echo", 1)
	var st types.FunctionStatus
	_ = json.Unmarshal([]byte(f.expect(t, http.MethodGet, "/system/function/echo", nil, http.StatusOK, "")), &st)
	if st.EnvVars["A"] != "b" {
		t.Errorf("status after update = %+v", st)
	}

	// Delete: the function is gone, a second delete is 404.
	f.expect(t, http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: "echo"}, http.StatusAccepted, "")
	f.expect(t, http.MethodGet, "/system/function/echo", nil, http.StatusNotFound, "echo")
	f.expect(t, http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: "echo"}, http.StatusNotFound, "echo")
	code, hdr, _ := f.do(t, http.MethodGet, "/function/echo", nil)
	if code != http.StatusNotFound || hdr.Get(InternalHeader) == "" {
		t.Errorf("deleted function: %d (internal %q), want 404 with %s", code, hdr.Get(InternalHeader), InternalHeader)
	}
}

func TestGPUFunctionRegisteredAndBound(t *testing.T) {
	f := newFixture(t)
	fd := deployment("hello-gpu")
	fd.Annotations = gpuAnnotations("1536Mi")
	f.deploy(t, fd)
	regs, _ := f.gpu.calls()
	want := pool.FunctionSpec{Name: "hello-gpu", MemoryBytes: 1536 << 20, SLO: 80 * time.Millisecond, Percentile: 98, Isolation: "shared"}
	if len(regs) != 1 || regs[0] != want {
		t.Fatalf("registrations = %+v, want [%+v]", regs, want)
	}
	f.waitReady(t, "hello-gpu", 1)

	// The request is bound to a GPU of the gpuserver's pool, and the binding is released afterwards.
	var reply struct {
		Message string `json:"message"`
		GPU     *int   `json:"gpu"`
		GPUName string `json:"gpu_name"`
		Binding string `json:"binding"`
	}
	out := f.expect(t, http.MethodGet, "/function/hello-gpu?name=test", nil, http.StatusOK, "")
	if err := json.Unmarshal([]byte(out), &reply); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if reply.GPU == nil || *reply.GPU < 0 || *reply.GPU > 1 || !strings.Contains(reply.GPUName, "simulated") || reply.Binding == "" ||
		!strings.Contains(reply.Message, "test") {
		t.Errorf("hello-gpu answered %s", out)
	}
	st, err := client.New(f.socket).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range st.Functions {
		if fn.Name == "hello-gpu" && (fn.Running != 0 || fn.Served != 1) {
			t.Errorf("pool after one request: %+v, want served 1 and nothing running", fn)
		}
	}

	// Removing the annotations deregisters; deleting deregisters too.
	f.expect(t, http.MethodPut, "/system/functions", deployment("hello-gpu"), http.StatusAccepted, "")
	f.expect(t, http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: "hello-gpu"}, http.StatusAccepted, "")
	if _, dels := f.gpu.calls(); len(dels) != 2 || dels[0] != "hello-gpu" {
		t.Errorf("deregistrations = %v, want hello-gpu twice", dels)
	}
}

func TestGPUFunctionAcquireFailure(t *testing.T) {
	f := newFixture(t)
	// Larger than any GPU of the pool: the gpuserver refuses the registration, and the deploy is refused naming the
	// annotation.
	fd := deployment("hello-gpu")
	fd.Annotations = gpuAnnotations("64Gi")
	f.expect(t, http.MethodPost, "/system/functions", fd, http.StatusBadRequest, "com.openfaas.gpu.memory")
	if _, err := f.backend.Status(context.Background(), "", "hello-gpu"); err == nil {
		t.Error("refused function was kept")
	}

	// A function the gpuserver does not know: acquire fails, the handler never runs, the answer is a JSON error.
	fd.Annotations = gpuAnnotations("1Gi")
	f.deploy(t, fd)
	f.waitReady(t, "hello-gpu", 1)
	if err := client.New(f.socket).Deregister(context.Background(), "hello-gpu"); err != nil {
		t.Fatal(err)
	}
	code, _, out := f.do(t, http.MethodGet, "/function/hello-gpu", nil)
	var e struct {
		Error string `json:"error"`
	}
	if code != http.StatusNotFound || json.Unmarshal([]byte(out), &e) != nil || !strings.Contains(e.Error, "hello-gpu") ||
		strings.Contains(out, "message") {
		t.Errorf("unregistered GPU function answered %d %s, want 404 with a JSON error naming it", code, out)
	}
}

func TestGPURegistrationFailureRollsBack(t *testing.T) {
	f := newFixture(t)
	h := New(Config{Backend: f.backend, Secrets: f.backend, Logs: f.backend, GPU: client.New("/nonexistent/gpuserver.sock")})
	fd := deployment("hello-gpu")
	fd.Annotations = gpuAnnotations("1Gi")
	code, body := serve(t, h, http.MethodPost, "/system/functions", fd)
	if code != http.StatusInternalServerError || !strings.Contains(body, "gpuserver") {
		t.Errorf("deploy with unreachable gpuserver = %d %q, want 500 naming the gpuserver", code, body)
	}
	if _, err := f.backend.Status(context.Background(), "", "hello-gpu"); err == nil {
		t.Error("function kept after failed registration")
	}
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t)
	f.deploy(t, deployment("echo"))
	tests := []struct {
		name, method, path string
		body               any
		want               int
		names              string
	}{
		{"malformed JSON", http.MethodPost, "/system/functions", "{not json", 400, "JSON"},
		{"empty body", http.MethodPost, "/system/functions", "", 400, "JSON"},
		{"missing service", http.MethodPost, "/system/functions", types.FunctionDeployment{Image: "echo:latest"}, 400, "service"},
		{"invalid name", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "Echo!", Image: "x"}, 400, "service"},
		{"missing image", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "x"}, 400, "image"},
		{"invalid annotation", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "hello-gpu", Image: "hello-gpu",
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "1.5 gigs"}}, 400, "com.openfaas.gpu.memory"},
		{"invalid annotation on update", http.MethodPut, "/system/functions", types.FunctionDeployment{Service: "echo", Image: "echo",
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "1Gi", "com.openfaas.gpu.slo": "fast"}}, 400, "com.openfaas.gpu.slo"},
		{"compute limit above a GPU", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "hello-gpu", Image: "hello-gpu",
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "1Gi", "com.openfaas.gpu.compute.limit": "150%"}}, 400, "com.openfaas.gpu.compute.limit"},
		{"compute request above limit", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "hello-gpu", Image: "hello-gpu",
			Annotations: &map[string]string{"com.openfaas.gpu.memory": "1Gi", "com.openfaas.gpu.compute.request": "0.6",
				"com.openfaas.gpu.compute.limit": "50%"}}, 400, "com.openfaas.gpu.compute.request"},
		{"other namespace", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "x", Image: "x", Namespace: "prod"}, 400, "prod"},
		{"missing build context", http.MethodPost, "/system/functions", deployment("ghost"), 400, "ghost"},
		{"duplicate deploy", http.MethodPost, "/system/functions", deployment("echo"), 409, "echo"},
		{"update unknown", http.MethodPut, "/system/functions", deployment("probe"), 404, "probe"},
		{"delete malformed", http.MethodDelete, "/system/functions", "[", 400, "JSON"},
		{"delete no name", http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{}, 400, "functionName"},
		{"delete unknown", http.MethodDelete, "/system/functions", types.DeleteFunctionRequest{FunctionName: "nope"}, 404, "nope"},
		{"status unknown", http.MethodGet, "/system/function/nope", nil, 404, "nope"},
		{"status other namespace", http.MethodGet, "/system/function/echo?namespace=prod", nil, 400, "prod"},
		{"list other namespace", http.MethodGet, "/system/functions?namespace=prod", nil, 400, "prod"},
		{"scale unknown", http.MethodPost, "/system/scale-function/nope", types.ScaleServiceRequest{Replicas: 1}, 404, "nope"},
		{"scale malformed", http.MethodPost, "/system/scale-function/echo", "replicas=1", 400, "JSON"},
		{"scale mismatched name", http.MethodPost, "/system/scale-function/echo", types.ScaleServiceRequest{ServiceName: "x"}, 400, "serviceName"},
		{"scale too many", http.MethodPost, "/system/scale-function/echo", types.ScaleServiceRequest{Replicas: 500}, 400, "replicas"},
		{"logs no name", http.MethodGet, "/system/logs", nil, 400, "name"},
		{"logs bad tail", http.MethodGet, "/system/logs?name=echo&tail=ten", nil, 400, "tail"},
		{"logs bad since", http.MethodGet, "/system/logs?name=echo&since=yesterday", nil, 400, "since"},
		{"logs unknown", http.MethodGet, "/system/logs?name=nope", nil, 404, "nope"},
		{"secret malformed", http.MethodPost, "/system/secrets", "{", 400, "JSON"},
		{"secret bad name", http.MethodPost, "/system/secrets", types.Secret{Name: "../x", Value: "v"}, 400, "name"},
		{"secret unknown update", http.MethodPut, "/system/secrets", types.Secret{Name: "nope", Value: "v"}, 404, "nope"},
		{"secret unknown delete", http.MethodDelete, "/system/secrets", types.Secret{Name: "nope"}, 404, "nope"},
		{"deploy with unknown secret", http.MethodPost, "/system/functions", types.FunctionDeployment{Service: "probe", Image: "probe",
			Secrets: []string{"nope"}}, 400, "nope"},
		{"wrong method", http.MethodPatch, "/system/functions", nil, 405, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, out := f.do(t, tt.method, tt.path, tt.body)
			if code != tt.want || !strings.Contains(out, tt.names) {
				t.Errorf("%s %s = %d %q, want %d naming %q", tt.method, tt.path, code, out, tt.want, tt.names)
			}
		})
	}
	if regs, _ := f.gpu.calls(); len(regs) != 0 {
		t.Errorf("refused deployments reached the gpuserver: %+v", regs)
	}
}

func TestSecretsReadByFunction(t *testing.T) {
	f := newFixture(t)
	f.expect(t, http.MethodPost, "/system/secrets", types.Secret{Name: "api-key", Value: "first"}, http.StatusAccepted, "")
	f.expect(t, http.MethodPost, "/system/secrets", types.Secret{Name: "api-key", Value: "again"}, http.StatusConflict, "api-key")
	list := f.expect(t, http.MethodGet, "/system/secrets", nil, http.StatusOK, "api-key")
	if strings.Contains(list, "first") {
		t.Errorf("secret list shows a value: %s", list)
	}
	fd := deployment("echo")
	fd.Secrets = []string{"api-key"}
	f.deploy(t, fd)
	f.waitReady(t, "echo", 1)
	if out := f.expect(t, http.MethodGet, "/function/echo?secret=api-key", nil, http.StatusOK, ""); out != "first" {
		t.Errorf("echo read secret %q, want first", out)
	}
	f.expect(t, http.MethodPut, "/system/secrets", types.Secret{Name: "api-key", Value: "second"}, http.StatusAccepted, "")
	if out := f.expect(t, http.MethodGet, "/function/echo?secret=api-key", nil, http.StatusOK, ""); out != "second" {
		t.Errorf("echo read updated secret %q, want second", out)
	}
	f.expect(t, http.MethodGet, "/function/echo?secret=other", nil, http.StatusNotFound, "other")
	f.expect(t, http.MethodDelete, "/system/secrets", types.Secret{Name: "api-key"}, http.StatusAccepted, "")
	if list := f.expect(t, http.MethodGet, "/system/secrets", nil, http.StatusOK, ""); strings.Contains(list, "api-key") {
		t.Errorf("deleted secret still listed: %s", list)
	}
}

func TestLogsNDJSON(t *testing.T) {
	f := newFixture(t)
	f.deploy(t, deployment("probe"))
	f.waitReady(t, "probe", 1)

	// follow: a line the function prints after the stream opened arrives on it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/system/logs?name=probe&follow=true&tail=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("logs: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	f.expect(t, http.MethodPost, "/function/probe/marker", "", http.StatusOK, "")
	sc := bufio.NewScanner(resp.Body)
	found := false
	for !found && sc.Scan() {
		var m logs.Message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not NDJSON: %q", sc.Text())
		}
		found = m.Name == "probe" && m.Namespace == "openfaas-fn" && strings.Contains(m.Text, "request POST /marker") &&
			!m.Timestamp.IsZero()
	}
	if !found {
		t.Fatalf("followed line never arrived: %v", sc.Err())
	}
	cancel()

	// no follow: the stream ends by itself.
	out := f.expect(t, http.MethodGet, "/system/logs?name=probe&tail=2", nil, http.StatusOK, "")
	if n := strings.Count(strings.TrimSpace(out), "\n") + 1; n != 2 {
		t.Errorf("tail=2 gave %d lines: %s", n, out)
	}
}

func TestSystemEndpoints(t *testing.T) {
	f := newFixture(t)
	f.expect(t, http.MethodGet, "/healthz", nil, http.StatusOK, "OK")
	var gw GatewayInfo // asked directly, as faas-cli version does (TestInfoShapes: both shapes)
	_ = json.Unmarshal([]byte(f.expect(t, http.MethodGet, "/system/info", nil, http.StatusOK, "")), &gw)
	if info := gw.Provider; info == nil || info.Name != "faas-gpu" || info.Orchestration != "local" ||
		info.Version == nil || info.Version.Release != "test" {
		t.Errorf("info = %+v", gw)
	}
	f.expect(t, http.MethodGet, "/system/namespaces", nil, http.StatusOK, `["openfaas-fn"]`)
	f.expect(t, http.MethodGet, "/system/functions", nil, http.StatusOK, "[]")
	f.expect(t, http.MethodGet, "/metrics", nil, http.StatusOK, `provider_http_requests_total{code="200",method="GET",path="/system/functions"} 1`)
}

func TestSyncGPU(t *testing.T) {
	f := newFixture(t)
	fd := deployment("hello-gpu")
	fd.Annotations = gpuAnnotations("2Gi")
	f.deploy(t, fd)
	f.deploy(t, deployment("echo"))
	reg := &recordingRegistry{next: client.New(f.socket)}
	if err := SyncGPU(context.Background(), f.backend, reg); err != nil {
		t.Fatal(err)
	}
	if regs, _ := reg.calls(); len(regs) != 1 || regs[0].Name != "hello-gpu" || regs[0].MemoryBytes != 2<<30 {
		t.Errorf("SyncGPU registered %+v, want hello-gpu only", regs)
	}
}
