package live

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
	"github.com/openfaas/faas-provider/types"
)

// stockProvider reproduces what the stock openfaas chart (faas-netes chart, clusterRole false, operator false)
// gives its provider, from the chart's documented values: the <release>-controller ServiceAccount, a Role of that
// name in the function namespace (services, deployments and secrets read-write; pods, pods/log, namespaces and
// endpoints read; events list), and the faas-netes container of the gateway pod started as ./faas-netes with its
// environment. Only the image is faas-gpu's (faasnetes.image), as a user swaps it in; image_pull_policy is Never
// because the images were imported into the node (functions.imagePullPolicy); basic auth is on (basic_auth true,
// the basic-auth Secret mounted at /var/secrets, as the stock chart does). The faas-gpu chart's swapIn Role
// (EndpointSlices) is already bound to this ServiceAccount by the release testKubernetesChartInstall installed.
//
// What the stock chart cannot express is added as charts/faas-gpu/README.md (gpuserver.keySecret) tells a user to
// patch it in: the gpuserver
// key Secret mounted (0440, the pod's fsGroup) with FAAS_GPU_GPUSERVER_KEY_FILE, and FAAS_GPU_SOCKET_GROUP, so
// that GPU pods get registration tickets and the sockets' group.
func stockProvider(image string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: openfaas-controller, namespace: %[2]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: openfaas-controller, namespace: %[3]s}
rules:
  - apiGroups: [""]
    resources: [services]
    verbs: [get, list, watch, create, delete, update]
  - apiGroups: [extensions, apps]
    resources: [deployments]
    verbs: [get, list, watch, create, delete, update]
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, list, watch, create, update, patch, delete]
  - apiGroups: [""]
    resources: [pods, pods/log, namespaces, endpoints]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [events]
    verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: openfaas-controller, namespace: %[3]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: openfaas-controller}
subjects: [{kind: ServiceAccount, name: openfaas-controller, namespace: %[2]s}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: gateway, namespace: %[2]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: gateway}}
  template:
    metadata: {labels: {app: gateway}}
    spec:
      serviceAccountName: openfaas-controller
      securityContext: {fsGroup: 65532}
      volumes:
        - {name: faas-netes-temp-volume, emptyDir: {}}
        - name: auth
          secret: {secretName: basic-auth}
        - name: gpuserver-key
          secret: {secretName: %[4]s, defaultMode: 0440}
      containers:
        - name: faas-netes
          image: %[1]s
          imagePullPolicy: Never
          command: [./faas-netes]
          env:
            - {name: port, value: "8081"}
            - {name: function_namespace, value: %[3]s}
            - {name: profiles_namespace, value: %[2]s}
            - {name: image_pull_policy, value: Never}
            - {name: http_probe, value: "true"}
            - {name: set_nonroot_user, value: "false"}
            - {name: readiness_probe_period_seconds, value: "2"}
            - {name: liveness_probe_period_seconds, value: "2"}
            - {name: cluster_role, value: "false"}
            - {name: basic_auth, value: "true"}
            - {name: secret_mount_path, value: /var/secrets}
            - {name: FAAS_GPU_GPUSERVER_KEY_FILE, value: /var/run/secrets/faas-gpu-key/gpuserver.key}
            - {name: FAAS_GPU_SOCKET_GROUP, value: "2042"}
          volumeMounts:
            - {mountPath: /tmp, name: faas-netes-temp-volume}
            - {mountPath: /var/secrets, name: auth, readOnly: true}
            - {mountPath: /var/run/secrets/faas-gpu-key, name: gpuserver-key, readOnly: true}
          ports:
            - {name: provider, containerPort: 8081, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata: {name: stock-provider, namespace: %[2]s}
spec:
  selector: {app: gateway}
  ports:
    - {name: provider, port: 8081, targetPort: provider}
`, image, namespace, functionsNS, release+"-gpuserver-key")
}

// existingFunction is a function as faas-netes deployed it before the swap: a Deployment and a Service with
// faas-netes' labels, created directly.
func existingFunction(image string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: legacy
  namespace: %[2]s
  labels: {faas_function: legacy}
  annotations: {prometheus.io.scrape: "false"}
spec:
  replicas: 1
  selector: {matchLabels: {faas_function: legacy}}
  template:
    metadata:
      labels: {faas_function: legacy, app: legacy}
      annotations: {prometheus.io.scrape: "false"}
    spec:
      containers:
        - name: legacy
          image: %[1]s
          imagePullPolicy: Never
          ports: [{containerPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: legacy, namespace: %[2]s}
spec:
  selector: {faas_function: legacy}
  ports: [{name: http, port: 8080, targetPort: 8080, protocol: TCP}]
`, image, functionsNS)
}

// testStockChartSwapIn runs faas-gpu as faas-netes with what the stock chart gives it: it lists a Deployment
// faas-netes made before the swap and deploys and serves a GPU function.
func testStockChartSwapIn(t *testing.T) {
	e := cluster(t)
	e.kubectl(t, existingFunction(e.info.Images["fn-echo"]), "apply", "-f", "-")
	e.kubectl(t, stockProvider(e.info.Images["faas-gpu"]), "apply", "-f", "-")
	e.kubectl(t, "", "-n", namespace, "rollout", "status", "deployment/gateway", "--timeout=5m")
	e.kubectl(t, "", "-n", functionsNS, "rollout", "status", "deployment/legacy", "--timeout=5m")
	g := gateway{url: e.serviceURL(t, namespace, "stock-provider")}
	g.user, g.pass = e.basicAuth(t, namespace)
	g = g.serving(t)

	testkit.EventuallyNilEvery(t, deadline, time.Second, "the stock provider lists the existing function", func() error {
		code, b, _, err := g.do(http.MethodGet, "/system/functions", nil, nil)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("%d %s", code, b)
		}
		var list []types.FunctionStatus
		if err := json.Unmarshal(b, &list); err != nil {
			return err
		}
		for _, f := range list {
			if f.Name == "legacy" && f.AvailableReplicas >= 1 {
				return nil
			}
		}
		return fmt.Errorf("legacy not listed with a ready replica: %s", b)
	})
	if got := invoke(t, g, "legacy", "from before the swap"); got != "from before the swap" {
		t.Errorf("legacy answered %q", got)
	}

	fn := deployment("vector-add", gpuFunctions["vector-add"])
	fn.Service = "stock-vector-add"
	g.must(t, http.StatusAccepted, http.MethodPost, "/system/functions", jsonBody(t, fn))
	waitReady(t, g, fn.Service)
	out := invoke(t, g, fn.Service, `{"a": [2, 4], "b": [0.5, 0.25]}`)
	if strings.TrimSpace(out) != `{"c": [2.5, 4.25]}` {
		t.Errorf("%s through the stock provider: %q", fn.Service, out)
	}
	if f, ok := findFunction(e.poolStatus(t), fn.Service); !ok || f.Served < 1 {
		t.Errorf("pool: %s registered %t, served %d", fn.Service, ok, f.Served)
	}
	g.must(t, http.StatusAccepted, http.MethodDelete, "/system/functions",
		jsonBody(t, types.DeleteFunctionRequest{FunctionName: fn.Service, Namespace: functionsNS}))
	t.Logf("faas-gpu as ./faas-netes with the stock chart's ServiceAccount, Role and environment: listed legacy, served %s (%s)",
		fn.Service, strings.TrimSpace(out))
}
