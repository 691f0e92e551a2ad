package live

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// chartValues installs charts/faas-gpu on the simulated GPU node with the images the harness built.
func (e *env) chartValues(extra ...string) []string {
	img := e.info.Images["faas-gpu"]
	repo, tag, _ := strings.Cut(img, ":dev")
	_ = tag
	sets := []string{
		"image.repository=" + repo, "image.tag=dev", "image.pullPolicy=Never",
		"gpuserver.gpus=v100x4", "gpuserver.deviceAccess=none",
		"socketDir=" + e.info.SocketDir, "gpuserver.repositoryDir=" + e.info.RepositoryDir,
		"nats.image=" + e.info.Images["nats-server"],
		"nats.storage.size=1Gi", "nats.storage.storageClassName=" + storageClass,
		"provider.enabled=true", "provider.functionPullPolicy=Never",
		// The provider's credentials the OpenFaaS way: the basic-auth Secret (created by basicAuthSecret).
		"basicAuth.secretName=basic-auth",
		fmt.Sprintf("queueWorker.gatewayURL=http://%s-gateway.%s:8080", release, namespace),
	}
	sets = append(sets, extra...)
	var args []string
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return args
}

const storageClass = "faas-gpu-local"

// natsUID is the chart's nats.runAsUser.
const natsUID = 1000

// natsVolume is a hostPath PersistentVolume for the NATS StatefulSet's claim (the cluster has no provisioner). The
// kubelet applies no fsGroup to a hostPath volume, so its folder is made the NATS server's (nats.runAsUser) here.
func (e *env) natsVolume(t *testing.T) string {
	dir := filepath.Join(e.info.RunDir, "nats")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, natsUID, natsUID); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %[1]s}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: faas-gpu-nats}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: %[1]s
  persistentVolumeReclaimPolicy: Delete
  hostPath: {path: %[2]s/nats, type: DirectoryOrCreate}
`, storageClass, e.info.RunDir)
}

// testKubernetesChartInstall installs the chart with the provider (kubernetes backend): the gpuserver DaemonSet,
// NATS JetStream, the queue worker and the provider become Ready.
func testKubernetesChartInstall(t *testing.T) {
	e := cluster(t)
	for _, ns := range []string{namespace, functionsNS} {
		e.kubectl(t, "", "create", "namespace", ns)
	}
	e.kubectl(t, e.natsVolume(t), "apply", "-f", "-")
	e.kubectl(t, basicAuthSecret(t), "apply", "-f", "-")
	args := append([]string{"install", release, e.repo + "/charts/faas-gpu", "-n", namespace, "--wait",
		"--timeout", "10m"}, e.chartValues()...)
	e.helm(t, args...)
	for _, w := range []string{"daemonset/" + release + "-gpuserver", "statefulset/" + release + "-nats",
		"deployment/" + release + "-queue-worker", "deployment/" + release + "-provider"} {
		e.kubectl(t, "", "-n", namespace, "rollout", "status", w, "--timeout=5m")
	}
	// A DaemonSet's rollout counts a pod that started; the gpuserver must also stay up and be Ready.
	e.gpuserverPod(t)
	t.Logf("helm install %s: gpuserver, NATS, queue worker and provider Ready", release)
}

func (e *env) provider(t *testing.T) gateway {
	user, pass := e.basicAuth(t, namespace)
	return gateway{url: e.serviceURL(t, namespace, release+"-gateway"), user: user, pass: pass}.serving(t)
}

// deployment is a function as faas-cli deploys it.
func deployment(name string, annotations map[string]string) types.FunctionDeployment {
	fn := types.FunctionDeployment{Service: name, Image: "faas-gpu.test/fn-" + name + ":dev", Namespace: functionsNS}
	if annotations != nil {
		fn.Annotations = &annotations
	}
	return fn
}

var gpuFunctions = map[string]map[string]string{
	"hello-gpu":  {"com.openfaas.gpu.memory": "1536Mi", "com.openfaas.gpu.slo": "80ms"},
	"vector-add": {"com.openfaas.gpu.memory": "64Mi"},
}

// waitReady polls the provider until the function reports an available replica.
func waitReady(t *testing.T, g gateway, name string) types.FunctionStatus {
	t.Helper()
	var st types.FunctionStatus
	testkit.EventuallyNilEvery(t, deadline, time.Second, "function "+name+" ready", func() error {
		code, b, _, err := g.do(http.MethodGet, "/system/function/"+name+"?namespace="+functionsNS, nil, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("%d %s", code, b)
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		if st.AvailableReplicas < 1 {
			return fmt.Errorf("available replicas %d of %d", st.AvailableReplicas, st.Replicas)
		}
		return nil
	})
	return st
}

// invoke calls a function synchronously until it answers 200 (the first calls may find it starting).
func invoke(t *testing.T, g gateway, name, body string) string {
	t.Helper()
	var out string
	testkit.EventuallyNilEvery(t, deadline, time.Second, "invoke "+name, func() error {
		code, b, _, err := g.do(http.MethodPost, "/function/"+name+"."+functionsNS, []byte(body), nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("%d %s", code, b)
		}
		out = string(b)
		return nil
	})
	return out
}

// testKubernetesFunctions deploys echo, hello-gpu and vector-add through the provider API and runs every verb
// faas-cli uses against them.
func testKubernetesFunctions(t *testing.T) {
	e := cluster(t)
	g := e.provider(t)
	g.must(t, http.StatusOK, http.MethodGet, "/system/info", nil)

	// PUT of an unknown function answers 404, so faas-cli falls back to POST.
	g.must(t, http.StatusNotFound, http.MethodPut, "/system/functions", jsonBody(t, deployment("echo", nil)))
	g.must(t, http.StatusAccepted, http.MethodPost, "/system/functions", jsonBody(t, deployment("echo", nil)))
	for name, ann := range gpuFunctions {
		g.must(t, http.StatusAccepted, http.MethodPost, "/system/functions", jsonBody(t, deployment(name, ann)))
	}
	// A bad GPU annotation is refused with 400 naming it.
	code, b, _, err := g.do(http.MethodPost, "/system/functions",
		jsonBody(t, deployment("bad-gpu", map[string]string{"com.openfaas.gpu.memory": "lots"})), nil)
	if err != nil || code != http.StatusBadRequest || !strings.Contains(string(b), "com.openfaas.gpu.memory") {
		t.Errorf("bad annotation: %d %s %v; want 400 naming com.openfaas.gpu.memory", code, b, err)
	}

	for _, name := range []string{"echo", "hello-gpu", "vector-add"} {
		st := waitReady(t, g, name)
		t.Logf("%s ready: %d/%d replicas, image %s", name, st.AvailableReplicas, st.Replicas, st.Image)
	}

	// The GPU pods carry the injection: the shim from the init container, the node's sockets, self-registration.
	for name := range gpuFunctions {
		pods, err := e.kube.CoreV1().Pods(functionsNS).List(ctxFor(t), metav1.ListOptions{LabelSelector: "faas_function=" + name})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("pods of %s: %v (%d)", name, err, len(pods.Items))
		}
		checkGPUPod(t, e, pods.Items[0])
	}

	if got := invoke(t, g, "echo", "hello from the live cluster"); got != "hello from the live cluster" {
		t.Errorf("echo answered %q", got)
	}
	hello := invoke(t, g, "hello-gpu", "{}")
	if !strings.Contains(hello, "gpu") {
		t.Errorf("hello-gpu answered %q; want its GPU binding", hello)
	}
	var sum struct {
		C []float64 `json:"c"`
	}
	out := invoke(t, g, "vector-add", `{"a": [1, 2, 3, 4.5], "b": [10, 20, 30, 40]}`)
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("vector-add answered %q: %v", out, err)
	}
	if want := []float64{11, 22, 33, 44.5}; fmt.Sprint(sum.C) != fmt.Sprint(want) {
		t.Errorf("vector-add = %v; want %v", sum.C, want)
	}
	t.Logf("invoked: echo, hello-gpu %s, vector-add %v", strings.TrimSpace(hello), sum.C)

	// The node's pool has both GPU functions registered and has served them.
	st := e.poolStatus(t)
	for name := range gpuFunctions {
		f, ok := findFunction(st, name)
		if !ok || f.Served < 1 {
			t.Errorf("pool: %s registered %t, served %d; want registered and served", name, ok, f.Served)
		}
	}
}

// findFunction finds a function in a pool status by its service name (openfaas-fn functions register under it).
func findFunction(st pool.Status, name string) (pool.FunctionStatus, bool) {
	for _, f := range st.Functions {
		if f.Name == name || f.Name == name+"."+functionsNS {
			return f, true
		}
	}
	return pool.FunctionStatus{}, false
}

// checkGPUPod checks the GPU injection on a running function pod.
func checkGPUPod(t *testing.T, e *env, pod corev1.Pod) {
	t.Helper()
	var shim bool
	for _, s := range pod.Status.InitContainerStatuses {
		if s.State.Terminated != nil && s.State.Terminated.ExitCode == 0 {
			shim = true
		}
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Image != e.info.Images["faas-gpu"] || !shim {
		t.Errorf("%s: shim init container from %s did not complete: %+v", pod.Name, e.info.Images["faas-gpu"],
			pod.Status.InitContainerStatuses)
	}
	var socket bool
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == e.info.SocketDir {
			socket = true
		}
	}
	if !socket {
		t.Errorf("%s: no hostPath volume of the node's sockets %s", pod.Name, e.info.SocketDir)
	}
	// The shim is the pod's libcuda.so.1, and the gpuserver's sockets are there.
	out := e.kubectl(t, "", "-n", pod.Namespace, "exec", pod.Name, "-c", pod.Spec.Containers[0].Name, "--",
		"sh", "-c", `ls -l "$LD_LIBRARY_PATH/libcuda.so.1" "$FAAS_GPU_SOCKET" "$FAAS_GPU_REMOTING_SOCKET"`)
	for _, want := range []string{"libcuda.so.1", "gpuserver.sock", "remoting.sock"} {
		if !strings.Contains(out, want) {
			t.Errorf("%s: %s missing in the pod:\n%s", pod.Name, want, out)
		}
	}
}

// gpuserverPod is the running gpuserver pod of the node.
func (e *env) gpuserverPod(t *testing.T) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	testkit.EventuallyNilEvery(t, deadline, time.Second, "gpuserver pod running", func() error {
		pods, err := e.kube.CoreV1().Pods(namespace).List(ctxFor(t), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=gpuserver"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && podReady(p) {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("%d gpuserver pods, none running and ready", len(pods.Items))
	})
	return pod
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// poolStatus reads the gpuserver's pool over its TCP API (the chart's gpuserver.metricsPort).
func (e *env) poolStatus(t *testing.T) pool.Status {
	t.Helper()
	pod := e.gpuserverPod(t)
	// GET /v1/pool takes a credential: the administrator's, derived from the gpuservers' key (the chart's Secret).
	secret, err := e.kube.CoreV1().Secrets(namespace).Get(ctxFor(t), release+"-gpuserver-key", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the gpuservers' key: %v", err)
	}
	admin := map[string]string{"Authorization": "Bearer " + auth.Key(secret.Data["gpuserver.key"]).AdminToken()}
	var st pool.Status
	testkit.EventuallyNilEvery(t, deadline, time.Second, "gpuserver pool status", func() error {
		g := gateway{url: "http://" + net.JoinHostPort(pod.Status.PodIP, "8090")}
		code, b, _, err := g.do(http.MethodGet, "/v1/pool", nil, admin)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET /v1/pool: %d %s", code, b)
		}
		return json.Unmarshal(b, &st)
	})
	return st
}

// testKubernetesAsyncCallback invokes asynchronously through the queue worker's front door; the result reaches a
// callback server on the node's address.
func testKubernetesAsyncCallback(t *testing.T) {
	e := cluster(t)
	ln, err := net.Listen("tcp", net.JoinHostPort(e.info.NodeIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	type callback struct {
		header http.Header
		body   string
	}
	got := make(chan callback, 16)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got <- callback{r.Header.Clone(), string(b)}
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	front := gateway{url: e.serviceURL(t, namespace, release+"-async")}
	front.user, front.pass = e.basicAuth(t, namespace)
	cb := "http://" + ln.Addr().String() + "/done"
	for _, c := range []struct{ fn, body, want string }{
		// name.namespace, as `faas-cli invoke --async --namespace openfaas-fn` sends it, and the bare name, as
		// it sends it without --namespace: both are the same function in the default namespace.
		{"echo." + functionsNS, "async hello", "async hello"},
		{"vector-add", `{"a": [1, 2], "b": [3, 4]}`, `{"c": [4.0, 6.0]}`},
	} {
		code, b, hdr, err := front.do(http.MethodPost, "/async-function/"+c.fn, []byte(c.body),
			map[string]string{"X-Callback-Url": cb})
		if err != nil || code != http.StatusAccepted || hdr.Get("X-Call-Id") == "" {
			t.Fatalf("async %s: %d %s %v; want 202 with X-Call-Id", c.fn, code, b, err)
		}
		select {
		case r := <-got:
			if r.header.Get("X-Call-Id") != hdr.Get("X-Call-Id") || r.header.Get("X-Function-Status") != "200" ||
				strings.TrimSpace(r.body) != c.want {
				t.Errorf("callback of %s: call %s status %s body %q; want call %s, 200, %q", c.fn,
					r.header.Get("X-Call-Id"), r.header.Get("X-Function-Status"), r.body, hdr.Get("X-Call-Id"), c.want)
			}
			t.Logf("async %s: 202 call %s, callback with status %s and %q", c.fn, hdr.Get("X-Call-Id"),
				r.header.Get("X-Function-Status"), strings.TrimSpace(r.body))
		case <-time.After(deadline):
			t.Fatalf("no callback for %s within %s", c.fn, deadline)
		}
	}
}

// testKubernetesLifecycle lists, describes, scales to zero and back, reads logs, uses a secret and deletes.
func testKubernetesLifecycle(t *testing.T) {
	e := cluster(t)
	g := e.provider(t)
	var list []types.FunctionStatus
	if err := json.Unmarshal(g.must(t, http.StatusOK, http.MethodGet, "/system/functions?namespace="+functionsNS, nil), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list {
		names = append(names, f.Name)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "echo,hello-gpu,vector-add" {
		t.Errorf("list: %v; want echo, hello-gpu, vector-add", names)
	}
	var st types.FunctionStatus
	if err := json.Unmarshal(g.must(t, http.StatusOK, http.MethodGet, "/system/function/vector-add?namespace="+functionsNS, nil), &st); err != nil {
		t.Fatal(err)
	}
	if st.Annotations == nil || (*st.Annotations)["com.openfaas.gpu.memory"] != "64Mi" {
		t.Errorf("describe vector-add: annotations %v; want com.openfaas.gpu.memory 64Mi", st.Annotations)
	}

	// Scale to zero: the replicas go; back to one: it serves again.
	scale := func(n uint64) {
		g.must(t, http.StatusAccepted, http.MethodPost, "/system/scale-function/echo?namespace="+functionsNS,
			jsonBody(t, types.ScaleServiceRequest{ServiceName: "echo", Replicas: n}))
	}
	scale(0)
	testkit.EventuallyNilEvery(t, deadline, time.Second, "echo scaled to 0", func() error {
		pods, err := e.kube.CoreV1().Pods(functionsNS).List(ctxFor(t), metav1.ListOptions{LabelSelector: "faas_function=echo"})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	scale(1)
	waitReady(t, g, "echo")
	if got := invoke(t, g, "echo", "back"); got != "back" {
		t.Errorf("echo after scaling back: %q", got)
	}

	// Logs of the function, through the provider.
	testkit.EventuallyNilEvery(t, deadline, time.Second, "logs of echo", func() error {
		code, b, _, err := g.do(http.MethodGet, "/system/logs?name=echo&namespace="+functionsNS+"&follow=false&tail=50", nil, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK || len(strings.TrimSpace(string(b))) == 0 {
			return fmt.Errorf("%d %q", code, b)
		}
		return nil
	})

	// A secret: created through the provider, mounted into a function that names it, listed, deleted.
	g.must(t, http.StatusAccepted, http.MethodPost, "/system/secrets",
		jsonBody(t, types.Secret{Name: "api-key", Namespace: functionsNS, Value: "s3cr3t"}))
	var secrets []types.Secret
	if err := json.Unmarshal(g.must(t, http.StatusOK, http.MethodGet, "/system/secrets?namespace="+functionsNS, nil), &secrets); err != nil {
		t.Fatal(err)
	}
	if len(secrets) != 1 || secrets[0].Name != "api-key" || secrets[0].Value != "" {
		t.Errorf("secrets: %+v; want api-key without its value", secrets)
	}
	fn := deployment("echo", nil)
	fn.Secrets = []string{"api-key"}
	g.must(t, http.StatusAccepted, http.MethodPut, "/system/functions", jsonBody(t, fn))
	testkit.EventuallyNilEvery(t, deadline, time.Second, "secret mounted in echo", func() error {
		pods, err := e.kube.CoreV1().Pods(functionsNS).List(ctxFor(t), metav1.ListOptions{LabelSelector: "faas_function=echo"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !podReady(p) {
				continue
			}
			out, err := runErr("", e.info.Kubectl, "--kubeconfig", e.info.Kubeconfig, "-n", functionsNS, "exec", p.Name,
				"--", "cat", "/var/openfaas/secrets/api-key")
			if err == nil && out == "s3cr3t" {
				return nil
			}
			return fmt.Errorf("%s: %v %q", p.Name, err, out)
		}
		return fmt.Errorf("no ready echo pod")
	})

	// Delete: the function goes from the list and its objects from the cluster.
	g.must(t, http.StatusAccepted, http.MethodDelete, "/system/functions", jsonBody(t, types.DeleteFunctionRequest{FunctionName: "echo", Namespace: functionsNS}))
	g.must(t, http.StatusNotFound, http.MethodGet, "/system/function/echo?namespace="+functionsNS, nil)
	testkit.EventuallyNilEvery(t, deadline, time.Second, "echo's pods gone", func() error {
		pods, err := e.kube.CoreV1().Pods(functionsNS).List(ctxFor(t), metav1.ListOptions{LabelSelector: "faas_function=echo"})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	g.must(t, http.StatusAccepted, http.MethodDelete, "/system/secrets", jsonBody(t, types.Secret{Name: "api-key", Namespace: functionsNS}))
}

// testKubernetesGPUServerRestart kills the gpuserver pod: the DaemonSet starts another, the functions register
// again, requests succeed, and the model images survive in the repository hostPath.
func testKubernetesGPUServerRestart(t *testing.T) {
	e := cluster(t)
	g := e.provider(t)
	// mlp loads its weights onto the GPU at initialisation: the gpuserver captures them as its model image in the
	// repository. Small layers keep the simulated node's host-side matrix products quick.
	mlp := deployment("mlp", map[string]string{"com.openfaas.gpu.memory": "64Mi"})
	mlp.EnvVars = map[string]string{"MLP_DIMS": "64,256,32"}
	g.must(t, http.StatusAccepted, http.MethodPost, "/system/functions", jsonBody(t, mlp))
	waitReady(t, g, "mlp")
	x := make([]string, 64)
	for i := range x {
		x[i] = fmt.Sprintf("%d", i%7)
	}
	input := `{"x": [` + strings.Join(x, ", ") + `]}`
	y := invoke(t, g, "mlp", input)
	before := repositoryFiles(t, e.info.RepositoryDir)
	var images int
	for f := range before {
		if strings.Contains(imageName(f), "mlp") {
			images++
		}
	}
	if images == 0 {
		t.Fatalf("no model image of mlp in %s before the restart: %v", e.info.RepositoryDir, sortedNames(before))
	}
	old := e.gpuserverPod(t)
	e.kubectl(t, "", "-n", namespace, "delete", "pod", old.Name, "--wait=true")
	testkit.EventuallyNilEvery(t, deadline, time.Second, "a new gpuserver pod", func() error {
		p := e.gpuserverPod(t)
		if p.UID == old.UID {
			return fmt.Errorf("still the old pod")
		}
		return nil
	})
	if got := invoke(t, g, "vector-add", `{"a": [0.5], "b": [0.25]}`); strings.TrimSpace(got) != `{"c": [0.75]}` {
		t.Errorf("vector-add after the restart: %q", got)
	}
	invoke(t, g, "hello-gpu", "{}")
	if got := invoke(t, g, "mlp", input); got != y {
		t.Errorf("mlp after the restart answered differently:\n%s\nbefore:\n%s", got, y)
	}
	st := e.poolStatus(t)
	for name := range gpuFunctions {
		if f, ok := findFunction(st, name); !ok || f.Served < 1 {
			t.Errorf("after the restart: %s registered %t, served %d", name, ok, f.Served)
		}
	}
	if _, err := os.Stat(filepath.Join(e.info.RepositoryDir, "metering.json")); err != nil {
		t.Errorf("the bill did not survive the restart: %v", err)
	}
	after := repositoryFiles(t, e.info.RepositoryDir)
	for f := range before {
		if !after[f] {
			t.Errorf("model image %s lost in the restart (before %v, after %v)", f, before, after)
		}
	}
	// vector-add's CUDA session lived in the old gpuserver: its process answered 503 and exited, and the kubelet
	// started it again; hello-gpu (no CUDA) just registered again.
	pods, err := e.kube.CoreV1().Pods(functionsNS).List(ctxFor(t), metav1.ListOptions{LabelSelector: "faas_function=vector-add"})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("vector-add pods: %v %+v", err, pods)
	}
	restarts := pods.Items[0].Status.ContainerStatuses[0].RestartCount
	if restarts < 1 {
		t.Errorf("vector-add's container restarted %d times; want it restarted with a new CUDA session", restarts)
	}
	t.Logf("gpuserver %s -> new pod; repository kept %v; vector-add restarted %d time(s) and serves again",
		old.Name, sortedNames(before), restarts)
}

// imageName is the function (or instance: pool.InstanceKey, e.g. mlp@<pod>) whose image file f is: the repository
// names a file x-<hex of the name> when the name has characters a file name should not (gpuserver/repository,
// fileName).
func imageName(f string) string {
	base := filepath.Base(f)
	hexName, ok := strings.CutPrefix(base, "x-")
	if !ok {
		return base
	}
	hexName, _, _ = strings.Cut(hexName, ".")
	if name, err := hex.DecodeString(hexName); err == nil {
		return string(name)
	}
	return base
}

// repositoryFiles lists the model images under the repository hostPath (the harness runs on the node) with their
// sizes: the files in its folders, not the node state beside them.
func repositoryFiles(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !strings.Contains(rel, "/") {
			return nil // the node's own state at the top (the bill, the tenants' slots), which changes as it serves
		}
		out[fmt.Sprintf("%s (%d bytes)", rel, info.Size())] = true
		return nil
	})
	if err != nil {
		t.Fatalf("repository %s: %v", dir, err)
	}
	return out
}

func sortedNames(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// basicAuthSecret is the basic-auth Secret an OpenFaaS installation has (user admin, a random password), which the
// chart's provider mounts (basicAuth.secretName) and the tests read as faas-cli login would be given it.
func basicAuthSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: basic-auth, namespace: %s}
stringData: {basic-auth-user: admin, basic-auth-password: %q}
`, namespace, base64.RawURLEncoding.EncodeToString(b))
}
