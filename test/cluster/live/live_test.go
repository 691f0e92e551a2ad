// Package live holds the tests that run against a live single-node Kubernetes started by `make test-cluster`
// (test/cluster/run.sh). They talk to the API server and, as faas-cli would, to the provider over HTTP. Without
// FAAS_GPU_TEST_CLUSTER (the cluster description the harness writes) every test skips with the reason.
//
// The tests share one cluster and build on each other in file order: the chart is installed first, functions are
// deployed, invoked, scaled and deleted, the gpuserver is restarted, then the stock-chart swap-in and the Knative
// backend run.
package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/faas-gpu/faas-gpu/test/cluster/harness"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

const (
	release     = "faas-gpu"
	namespace   = "openfaas"
	functionsNS = "openfaas-fn"
	// deadline bounds every wait: the machine is small and shared, so waits are generous and poll.
	deadline = 5 * time.Minute
)

// env is the cluster under test.
type env struct {
	info harness.Info
	kube kubernetes.Interface
	repo string
}

// cluster returns the live cluster, or skips the test with the reason it cannot run.
func cluster(t *testing.T) *env {
	t.Helper()
	p := os.Getenv("FAAS_GPU_TEST_CLUSTER")
	if p == "" {
		t.Skip("no live cluster: FAAS_GPU_TEST_CLUSTER is not set (make test-cluster starts one and sets it)")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CLUSTER: %v", err)
	}
	e := &env{}
	if err := json.Unmarshal(b, &e.info); err != nil {
		t.Fatalf("FAAS_GPU_TEST_CLUSTER %s: %v", p, err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", e.info.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if e.kube, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatal(err)
	}
	e.repo = repoRoot(t)
	return e
}

// repoRoot finds the repository from the working directory (the package directory under go test, the repository
// when the harness runs the compiled test).
func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "charts", "faas-gpu", "Chart.yaml")); err == nil {
			return d
		}
	}
	t.Fatalf("no repository above %s", dir)
	return ""
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// run runs a command and fails the test with its output when it fails.
func run(t *testing.T, stdin string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(stdin, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(stdin string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *env) kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	return run(t, stdin, e.info.Kubectl, append([]string{"--kubeconfig", e.info.Kubeconfig}, args...)...)
}

func (e *env) helm(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, "", "helm", append([]string{"--kubeconfig", e.info.Kubeconfig}, args...)...)
}

// serviceURL is http://<ClusterIP>:<port> of a Service: the host reaches ClusterIPs through kube-proxy's rules.
func (e *env) serviceURL(t *testing.T, ns, name string) string {
	t.Helper()
	svc, err := e.kube.CoreV1().Services(ns).Get(ctxFor(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("service %s/%s: %v", ns, name, err)
	}
	return fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
}

// freshClient opens a new connection for every request. A kept-alive connection would pin whatever answered
// first: a request to a Service's ClusterIP made before kube-proxy has written its rule leaves the host by the
// default route (where this machine's network answered 404 for five minutes, Server: keryx), and polling on the same
// connection never reaches the Service once the rule exists.
func freshClient() *http.Client {
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
}

// gateway is an HTTP client of a faas-provider API, as faas-cli uses it.
type gateway struct {
	url        string
	user, pass string
}

// do sends a request and returns the status and body; a transport error is returned as is.
func (g gateway) do(method, path string, body []byte, header map[string]string) (int, []byte, http.Header, error) {
	req, err := http.NewRequest(method, g.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if g.user != "" {
		req.SetBasicAuth(g.user, g.pass)
	}
	if len(body) > 0 && strings.HasPrefix(path, "/system/") {
		req.Header.Set("Content-Type", "application/json") // as faas-cli sends its JSON bodies
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := freshClient().Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header, err
}

// must sends a request and fails the test unless the status is want.
func (g gateway) must(t *testing.T, want int, method, path string, body []byte) []byte {
	t.Helper()
	code, b, _, err := g.do(method, path, body, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if code != want {
		t.Fatalf("%s %s: %d %s; want %d", method, path, code, b, want)
	}
	return b
}

// basicAuth reads the provider's credentials from the basic-auth Secret in ns, the OpenFaaS way; none when the
// Secret does not exist.
func (e *env) basicAuth(t *testing.T, ns string) (string, string) {
	s, err := e.kube.CoreV1().Secrets(ns).Get(ctxFor(t), "basic-auth", metav1.GetOptions{})
	if err != nil {
		return "", ""
	}
	return string(s.Data["basic-auth-user"]), string(s.Data["basic-auth-password"])
}

func jsonBody(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLiveCluster runs the flows in order on the one cluster: each builds on the ones before it (the chart's
// gpuserver serves every later flow), so the first failure of a step that others need stops the rest.
func TestLiveCluster(t *testing.T) {
	cluster(t) // skips without a cluster
	steps := []struct {
		name     string
		fn       func(*testing.T)
		required bool
	}{
		{"KubernetesChartInstall", testKubernetesChartInstall, true},
		{"KubernetesFunctions", testKubernetesFunctions, true},
		{"KubernetesRouting", testKubernetesRouting, false},
		{"KubernetesAsyncCallback", testKubernetesAsyncCallback, false},
		{"KubernetesLifecycle", testKubernetesLifecycle, false},
		{"KubernetesGPUServerRestart", testKubernetesGPUServerRestart, false},
		{"StockChartSwapIn", testStockChartSwapIn, false},
		{"KnativeBackend", testKnativeBackend, false},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.fn) && s.required {
			t.Fatalf("%s failed; the later steps need it", s.name)
		}
	}
}

// serving waits until the gateway answers GET /healthz: a pod that is Ready still takes kube-proxy a moment to put
// behind its Service's address.
func (g gateway) serving(t *testing.T) gateway {
	t.Helper()
	testkit.EventuallyNilEvery(t, deadline, time.Second, "the Service at "+g.url+" serving", func() error {
		var conn httptrace.GotConnInfo
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(c httptrace.GotConnInfo) { conn = c },
		}), http.MethodGet, g.url+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := freshClient().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode != http.StatusOK {
			local, remote := "", ""
			if conn.Conn != nil {
				local, remote = conn.Conn.LocalAddr().String(), conn.Conn.RemoteAddr().String()
			}
			return fmt.Errorf("GET /healthz: %d %q, headers %v (connection %s -> %s, reused %v)", resp.StatusCode, b,
				resp.Header, local, remote, conn.Reused)
		}
		return nil
	})
	return g
}
