package live

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

const (
	knRelease = "faas-gpu-kn"
	knNS      = "openfaas-kn"
)

// testKnativeBackend installs a second release of the chart with only the provider, on the knative backend, and
// deploys a GPU function: it becomes a Knative Service whose revision pod runs with the GPU injection beside
// Knative's queue-proxy, registers with the node's gpuserver and serves through the queue-proxy; status, scale
// bounds and delete behave. Knative's ingress and activator do not run here (harness.KnativeInfo.NotRunning), so
// the request goes to the revision's queue-proxy directly instead of through the provider's proxy.
func testKnativeBackend(t *testing.T) {
	e := cluster(t)
	if e.info.Knative == nil {
		t.Skip("Knative Serving is not running in this cluster (cluster run without -knative-bin)")
	}
	for what, why := range e.info.Knative.NotRunning {
		t.Logf("Knative %s %s: not run: %s", e.info.Knative.Version, what, why)
	}
	e.kubectl(t, "", "create", "namespace", knNS)
	args := append([]string{"install", knRelease, e.repo + "/charts/faas-gpu", "-n", namespace, "--wait", "--timeout", "10m"},
		e.chartValues("gpuserver.enabled=false", "queueWorker.enabled=false", "nats.enabled=false",
			"swapIn.enabled=false", "provider.backend=knative", "functionNamespace="+knNS,
			// The node's gpuservers are the first release's: the provider issues tickets from their key.
			"gpuserver.keySecret="+release+"-gpuserver-key")...)
	e.helm(t, args...)
	g := gateway{url: e.serviceURL(t, namespace, knRelease+"-gateway")}
	g.user, g.pass = e.basicAuth(t, namespace)
	g = g.serving(t)

	fn := types.FunctionDeployment{Service: "kn-vector-add", Image: e.info.Images["fn-vector-add"], Namespace: knNS,
		Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi"},
		Labels:      &map[string]string{"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "2"}}
	g.must(t, http.StatusAccepted, http.MethodPost, "/system/functions", jsonBody(t, fn))

	// The Knative Service carries the scale bounds on its revision template.
	out := e.kubectl(t, "", "-n", knNS, "get", "ksvc", fn.Service, "-o",
		`jsonpath={.spec.template.metadata.annotations.autoscaling\.knative\.dev/min-scale}/{.spec.template.metadata.annotations.autoscaling\.knative\.dev/max-scale}`)
	if out != "1/2" {
		t.Errorf("ksvc scale bounds %q; want min 1 / max 2", out)
	}

	// Knative's controller turns it into a revision whose pod runs the function and the queue-proxy.
	var pod corev1.Pod
	testkit.EventuallyNilEvery(t, deadline, time.Second, "revision pod of "+fn.Service+" running 2/2", func() error {
		pods, err := e.kube.CoreV1().Pods(knNS).List(ctxFor(t), metav1.ListOptions{
			LabelSelector: "serving.knative.dev/service=" + fn.Service})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			ready := 0
			for _, c := range p.Status.ContainerStatuses {
				if c.Ready {
					ready++
				}
			}
			if p.DeletionTimestamp == nil && ready == 2 && len(p.Spec.Containers) == 2 {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("%d pods, none with 2 ready containers", len(pods.Items))
	})
	checkGPUPod(t, e, pod)
	var queue bool
	for _, c := range pod.Spec.Containers {
		if c.Name == "queue-proxy" && c.Image == e.info.Images["queue"] {
			queue = true
		}
	}
	if !queue {
		t.Errorf("revision pod %s has no queue-proxy from %s", pod.Name, e.info.Images["queue"])
	}

	// The provider describes it.
	var st types.FunctionStatus
	if err := json.Unmarshal(g.must(t, http.StatusOK, http.MethodGet, "/system/function/"+fn.Service+"?namespace="+knNS, nil), &st); err != nil {
		t.Fatal(err)
	}
	if st.Name != fn.Service || st.Image != fn.Image || (*st.Annotations)["com.openfaas.gpu.memory"] != "64Mi" {
		t.Errorf("describe: %+v", st)
	}

	// A request through the revision's queue-proxy runs on the pool.
	qp := gateway{url: "http://" + net.JoinHostPort(pod.Status.PodIP, "8012")}
	testkit.EventuallyNilEvery(t, deadline, time.Second, "invoke through the queue-proxy", func() error {
		code, b, _, err := qp.do(http.MethodPost, "/", []byte(`{"a": [1.5], "b": [2]}`), nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK || strings.TrimSpace(string(b)) != `{"c": [3.5]}` {
			return fmt.Errorf("%d %s", code, b)
		}
		return nil
	})
	if served, ok := findFunctionIn(e.poolStatus(t), fn.Service+"."+knNS); !ok || served < 1 {
		t.Errorf("pool: %s.%s registered %t, served %d", fn.Service, knNS, ok, served)
	}

	// Scale sets the minimum (and lifts the maximum with it).
	g.must(t, http.StatusAccepted, http.MethodPost, "/system/scale-function/"+fn.Service+"?namespace="+knNS,
		jsonBody(t, types.ScaleServiceRequest{ServiceName: fn.Service, Replicas: 3}))
	out = e.kubectl(t, "", "-n", knNS, "get", "ksvc", fn.Service, "-o",
		`jsonpath={.spec.template.metadata.annotations.autoscaling\.knative\.dev/min-scale}/{.spec.template.metadata.annotations.autoscaling\.knative\.dev/max-scale}`)
	if out != "3/3" {
		t.Errorf("after scale 3: bounds %q; want 3/3", out)
	}

	g.must(t, http.StatusAccepted, http.MethodDelete, "/system/functions",
		jsonBody(t, types.DeleteFunctionRequest{FunctionName: fn.Service, Namespace: knNS}))
	testkit.EventuallyNilEvery(t, deadline, time.Second, "the Knative Service and its pods gone", func() error {
		if _, err := runErr("", e.info.Kubectl, "--kubeconfig", e.info.Kubeconfig, "-n", knNS, "get", "ksvc", fn.Service); err == nil {
			return fmt.Errorf("ksvc still there")
		}
		pods, err := e.kube.CoreV1().Pods(knNS).List(ctxFor(t), metav1.ListOptions{LabelSelector: "serving.knative.dev/service=" + fn.Service})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
	g.must(t, http.StatusNotFound, http.MethodGet, "/system/function/"+fn.Service+"?namespace="+knNS, nil)
}

// findFunctionIn returns whether the pool has the function registered under exactly name, and how often it served.
func findFunctionIn(st pool.Status, name string) (int64, bool) {
	for _, f := range st.Functions {
		if f.Name == name {
			return f.Served, true
		}
	}
	return 0, false
}
