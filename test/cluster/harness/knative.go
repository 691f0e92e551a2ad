package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// KnativeServing is the version of Knative Serving the harness runs (build-bins.sh builds the same).
const KnativeServing = "v0.50.0"

// KnativeImages are the images of Knative's components, built from build-bins.sh's binaries.
type KnativeImages struct {
	Controller, Autoscaler, Queue string
}

// StartKnative installs Knative Serving's CRDs and ConfigMaps from the modules' own config/ directories (in
// modDir, the module cache build-bins.sh filled) and runs its controller and autoscaler as pods. The webhook,
// the activator and an ingress do not run (see KnativeInfo.NotRunning).
func (c *Cluster) StartKnative(ctx context.Context, modDir string, img KnativeImages) (*KnativeInfo, error) {
	t := time.Now()
	serving := filepath.Join(modDir, "knative.dev", "serving@"+KnativeServing)
	networking, err := onlyDir(filepath.Join(modDir, "knative.dev", "networking@*"))
	if err != nil {
		return nil, err
	}
	caching, err := onlyDir(filepath.Join(modDir, "knative.dev", "caching@*"))
	if err != nil {
		return nil, err
	}
	var files []string
	files = append(files, filepath.Join(serving, "config", "core", "100-namespace.yaml"))
	for _, glob := range []string{
		filepath.Join(serving, "config", "core", "300-resources", "*.yaml"),
		filepath.Join(networking, "config", "*.yaml"),
		filepath.Join(caching, "config", "image.yaml"),
		filepath.Join(serving, "config", "core", "configmaps", "*.yaml"),
	} {
		m, _ := filepath.Glob(glob)
		sort.Strings(m)
		if len(m) == 0 {
			return nil, fmt.Errorf("no %s", glob)
		}
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if _, err := c.Kubectl(ctx, strings.NewReader(string(b)), "apply", "--server-side", "-f", "-"); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	if _, err := c.Kubectl(ctx, nil, "wait", "--for=condition=Established", "--timeout=120s", "crd/services.serving.knative.dev",
		"crd/serverlessservices.networking.internal.knative.dev", "crd/images.caching.internal.knative.dev"); err != nil {
		return nil, err
	}
	// The queue-proxy sidecar is the image built here; tags under faas-gpu.test are not resolved to digests (there
	// is no registry to ask); the activator is never put in the request path (it does not run).
	patches := map[string]string{
		"config-deployment": fmt.Sprintf(`{"data":{"queue-sidecar-image":%q,"registries-skipping-tag-resolving":"faas-gpu.test"}}`, img.Queue),
		"config-autoscaler": `{"data":{"target-burst-capacity":"0"}}`,
	}
	for cm, p := range patches {
		if _, err := c.Kubectl(ctx, nil, "-n", "knative-serving", "patch", "configmap", cm, "--type=merge", "-p", p); err != nil {
			return nil, err
		}
	}
	if _, err := c.Kubectl(ctx, strings.NewReader(knativeManifest(img)), "apply", "-f", "-"); err != nil {
		return nil, err
	}
	for _, d := range []string{"controller", "autoscaler"} {
		if _, err := c.Kubectl(ctx, nil, "-n", "knative-serving", "rollout", "status", "deployment/"+d, "--timeout=300s"); err != nil {
			return nil, fmt.Errorf("knative %s: %w", d, err)
		}
	}
	c.logf("Knative Serving %s: CRDs, ConfigMaps, controller and autoscaler (%.1fs)", KnativeServing, time.Since(t).Seconds())
	return &KnativeInfo{
		Version:    KnativeServing,
		Components: []string{"controller", "autoscaler", "queue-proxy"},
		NotRunning: map[string]string{
			"webhook":   "not needed by the tests: the provider writes complete Services (defaults and validation are the webhook's)",
			"activator": "scale from zero through the activator is not exercised; target-burst-capacity 0 keeps it out of the path",
			"ingress":   "no ingress: net-kourier needs Envoy, which is not built from Go modules; Routes stay not Ready and requests go to the revision's pods directly",
		},
	}, nil
}

func onlyDir(glob string) (string, error) {
	m, _ := filepath.Glob(glob)
	if len(m) != 1 {
		return "", fmt.Errorf("%s: want one directory, found %v", glob, m)
	}
	return m[0], nil
}

// knativeManifest runs Knative's controller and autoscaler as pods with a cluster-admin ServiceAccount (Knative's
// own install binds its ClusterRole knative-serving-admin the same way).
func knativeManifest(img KnativeImages) string {
	var b strings.Builder
	b.WriteString(`apiVersion: v1
kind: ServiceAccount
metadata: {name: controller, namespace: knative-serving}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: faas-gpu-test-knative-serving}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: controller, namespace: knative-serving}]
`)
	for _, d := range []struct{ name, image string }{{"controller", img.Controller}, {"autoscaler", img.Autoscaler}} {
		fmt.Fprintf(&b, `---
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: knative-serving}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      serviceAccountName: controller
      containers:
        - name: %[1]s
          image: %[2]s
          imagePullPolicy: Never
          env:
            - {name: SYSTEM_NAMESPACE, value: knative-serving}
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
            - {name: CONFIG_LOGGING_NAME, value: config-logging}
            - {name: CONFIG_OBSERVABILITY_NAME, value: config-observability}
            - {name: METRICS_DOMAIN, value: knative.dev/serving}
`, d.name, d.image)
	}
	b.WriteString(`---
apiVersion: v1
kind: Service
metadata: {name: autoscaler, namespace: knative-serving}
spec:
  selector: {app: autoscaler}
  ports:
    - {name: http-metrics, port: 9090, targetPort: 9090}
    - {name: http-profiling, port: 8008, targetPort: 8008}
    - {name: http, port: 8080, targetPort: 8080}
`)
	return b.String()
}
