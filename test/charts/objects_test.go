package charts

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

func find[T any](t *testing.T, objs []object, kind, name string) T {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			v, ok := o.Obj.(T)
			if !ok {
				t.Fatalf("%s %s decoded as %T", kind, name, o.Obj)
			}
			return v
		}
	}
	var zero T
	t.Fatalf("%s %s not rendered", kind, name)
	return zero
}

func TestGPUServerDaemonSet(t *testing.T) {
	objs := decodeAll(t, render(t))
	ds := find[*appsv1.DaemonSet](t, objs, "DaemonSet", "faas-gpu-gpuserver")
	spec := ds.Spec.Template.Spec
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priority class %q", spec.PriorityClassName)
	}
	if spec.NodeSelector["faas-gpu.dev/gpu-node"] != "true" {
		t.Errorf("node selector %v", spec.NodeSelector)
	}
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "nvidia" {
		t.Errorf("runtime class %v", spec.RuntimeClassName)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "nvidia.com/gpu" {
		t.Errorf("tolerations %v", spec.Tolerations)
	}
	paths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			paths[v.Name] = v.HostPath.Path
		}
	}
	if paths["sockets"] != "/var/run/faas-gpu" || paths["repository"] != "/dev/shm/faas-gpu" {
		t.Errorf("host paths %v", paths)
	}
	c := spec.Containers[0]
	if strings.Join(c.Args, " ") != "gpuserver" || c.Image != "ghcr.io/faas-gpu/faas-gpu:0.1.0" {
		t.Errorf("container %s %v", c.Image, c.Args)
	}
	if c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
		t.Error("runtimeClass device access must not be privileged")
	}
	cm := find[*corev1.ConfigMap](t, objs, "ConfigMap", "faas-gpu-gpuserver")
	if cm.Data["FAAS_GPU_SOCKET"] != "/var/run/faas-gpu/gpuserver.sock" || cm.Data["FAAS_GPU_GPUS"] != "auto" {
		t.Errorf("gpuserver config %v", cm.Data)
	}

	// hostPath device access: privileged, the driver's libraries mounted, no runtime class.
	objs = decodeAll(t, render(t, "gpuserver.deviceAccess=hostPath"))
	ds = find[*appsv1.DaemonSet](t, objs, "DaemonSet", "faas-gpu-gpuserver")
	spec = ds.Spec.Template.Spec
	if spec.RuntimeClassName != nil || !*spec.Containers[0].SecurityContext.Privileged {
		t.Error("hostPath device access: want privileged and no runtime class")
	}
}

func TestConfigChecksumRollsGPUServer(t *testing.T) {
	checksum := func(sets ...string) string {
		ds := find[*appsv1.DaemonSet](t, decodeAll(t, render(t, sets...)), "DaemonSet", "faas-gpu-gpuserver")
		return ds.Spec.Template.Annotations["checksum/config"]
	}
	a, b, c := checksum(), checksum("gpuserver.logLevel=debug"), checksum("queueWorker.replicas=3")
	if a == "" || a == b {
		t.Errorf("a gpuserver setting change must change the checksum: %q %q", a, b)
	}
	if a != c {
		t.Error("an unrelated change rolled the gpuserver")
	}
}

func TestQueueWorkerNATSAndFrontDoor(t *testing.T) {
	objs := decodeAll(t, render(t))
	qw := find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-queue-worker")
	env := map[string]string{}
	for _, e := range qw.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["FAAS_GPU_NATS_URL"] != "nats://faas-gpu-nats.faas-gpu.svc:4222" || env["FAAS_GPU_GATEWAY_URL"] == "" {
		t.Errorf("queue worker env %v", env)
	}
	sts := find[*appsv1.StatefulSet](t, objs, "StatefulSet", "faas-gpu-nats")
	if len(sts.Spec.VolumeClaimTemplates) != 1 || !slices.Contains(sts.Spec.Template.Spec.Containers[0].Args, "--jetstream") {
		t.Error("NATS must run JetStream on a persistent volume")
	}
	svc := find[*corev1.Service](t, objs, "Service", "faas-gpu-async")
	if svc.Spec.Ports[0].Port != 8081 || svc.Spec.Selector["app.kubernetes.io/component"] != "queue-worker" {
		t.Errorf("front door service %+v", svc.Spec)
	}

	objs = decodeAll(t, render(t, "nats.enabled=false", "nats.external.url=nats://nats.messaging:4222"))
	for _, o := range objs {
		if o.Kind == "StatefulSet" {
			t.Error("an existing NATS was configured but the chart still installs one")
		}
	}
	qw = find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-queue-worker")
	for _, e := range qw.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "FAAS_GPU_NATS_URL" && e.Value != "nats://nats.messaging:4222" {
			t.Errorf("external NATS URL %q", e.Value)
		}
	}
}

func TestRBAC(t *testing.T) {
	// Swap-in: EndpointSlices for the stock provider's ServiceAccount, in the function namespace.
	objs := decodeAll(t, render(t))
	role := find[*rbacv1.Role](t, objs, "Role", "faas-gpu-swapin")
	if role.Namespace != "openfaas-fn" || !grants(role.Rules, "discovery.k8s.io", "endpointslices", "list") {
		t.Errorf("swap-in role %+v", role)
	}
	rb := find[*rbacv1.RoleBinding](t, objs, "RoleBinding", "faas-gpu-swapin")
	if rb.Subjects[0].Name != "openfaas-controller" || rb.Subjects[0].Namespace != "openfaas" {
		t.Errorf("swap-in binding %+v", rb.Subjects)
	}

	// Standalone knative provider: everything the backend calls.
	objs = decodeAll(t, render(t, "provider.enabled=true", "provider.backend=knative", "provider.clusterRole=true"))
	cr := find[*rbacv1.ClusterRole](t, objs, "ClusterRole", "faas-gpu-provider")
	for _, g := range []struct{ group, resource, verb string }{
		{"apps", "deployments", "create"}, {"", "services", "update"},
		{"", "pods/log", "get"}, {"discovery.k8s.io", "endpointslices", "list"},
		{"serving.knative.dev", "services", "create"}, {"", "namespaces", "list"},
	} {
		if !grants(cr.Rules, g.group, g.resource, g.verb) {
			t.Errorf("provider ClusterRole does not grant %s %s/%s", g.verb, g.group, g.resource)
		}
	}
	dep := find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-provider")
	if strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " ") != "provider -backend knative" ||
		dep.Spec.Template.Spec.ServiceAccountName != "faas-gpu-provider" {
		t.Errorf("provider deployment %+v", dep.Spec.Template.Spec.Containers[0].Args)
	}
}

func grants(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// TestOverlay renders the stand-in of the stock openfaas chart with the overlay: the provider container must run
// the faas-gpu image as ./faas-netes, and every key the overlay sets must exist in the stock chart's values.
func TestOverlay(t *testing.T) {
	objs := decodeAll(t, helm(t, "template", "openfaas", standin, "-n", "openfaas", "-f", overlay))
	gw := find[*appsv1.Deployment](t, objs, "Deployment", "gateway")
	c := gw.Spec.Template.Spec.Containers[0]
	if !strings.HasPrefix(c.Image, "ghcr.io/faas-gpu/faas-gpu:") || strings.Join(c.Command, " ") != "./faas-netes" {
		t.Errorf("provider container %s %v", c.Image, c.Command)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	// The variables faas-gpu's provider reads when it runs as faas-netes.
	if env["function_namespace"] != "openfaas-fn" || env["image_pull_policy"] != "IfNotPresent" || env["http_probe"] != "true" ||
		env["port"] != "8081" || env["set_nonroot_user"] != "true" {
		t.Errorf("provider env %v", env)
	}

	var over, stock map[string]any
	readYAML(t, overlay, &over)
	readYAML(t, standin+"/values.yaml", &stock)
	for _, k := range leafKeys("", over) {
		if !hasKey(stock, k) {
			t.Errorf("overlay sets %s, which the stock openfaas chart does not have", k)
		}
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// leafKeys lists the dotted paths of a values tree; maps that are values themselves (resources) count as leaves
// below their first level.
func leafKeys(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 && k != "resources" {
			out = append(out, leafKeys(p, sub)...)
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func hasKey(m map[string]any, path string) bool {
	cur := any(m)
	for _, part := range strings.Split(path, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = mm[part]; !ok {
			return false
		}
	}
	return true
}

// TestValuesDocumented: every key of values.yaml has a comment above it and appears in the chart's README.
func TestValuesDocumented(t *testing.T) {
	readme, err := os.ReadFile(chartDir + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	readYAML(t, chartDir+"/values.yaml", &values)
	for _, k := range leafKeys("", values) {
		if !strings.Contains(string(readme), "`"+k+"`") {
			t.Errorf("values key %s is not documented in charts/faas-gpu/README.md", k)
		}
	}
	raw, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	key := regexp.MustCompile(`^\s*[A-Za-z][A-Za-z0-9]*:`)
	inResources := -1
	for i, line := range lines {
		if !key.MatchString(line) {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if inResources >= 0 && indent > inResources {
			continue // the contents of a resources block document themselves
		}
		inResources = -1
		if strings.TrimSpace(line) == "resources:" {
			inResources = indent
		}
		if i == 0 || !strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") {
			t.Errorf("values.yaml line %d (%s) has no comment above it", i+1, strings.TrimSpace(line))
		}
	}
}

// TestGPUServerPoolPage: gpuserver.ui serves the live pool page from each gpuserver behind basic auth: off by
// default; on, the gpuserver gets -ui-addr and -ui-auth-dir through its ConfigMap (so its pods roll), a "ui" port,
// and the credentials' Secret (ui.secretName, else basicAuth's) mounted read-only at the folder -ui-auth-dir names;
// its NetworkPolicy admits ui.from on that port (every peer when empty). Without credentials, or on the metrics
// port, the chart refuses to render, naming the value.
func TestGPUServerPoolPage(t *testing.T) {
	type page struct {
		env               map[string]string
		port              int32
		mountPath, secret string
		readOnly          bool
		mode              int32
		checksum          string
		admitted          []string
	}
	read := func(sets ...string) page {
		t.Helper()
		objs := decodeAll(t, render(t, sets...))
		var p page
		p.env = find[*corev1.ConfigMap](t, objs, "ConfigMap", "faas-gpu-gpuserver").Data
		ds := find[*appsv1.DaemonSet](t, objs, "DaemonSet", "faas-gpu-gpuserver")
		p.checksum = ds.Spec.Template.Annotations["checksum/config"]
		c := ds.Spec.Template.Spec.Containers[0]
		for _, port := range c.Ports {
			if port.Name == "ui" {
				p.port = port.ContainerPort
			}
		}
		for _, m := range c.VolumeMounts {
			if m.Name == "ui-auth" {
				p.mountPath, p.readOnly = m.MountPath, m.ReadOnly
			}
		}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == "ui-auth" && v.Secret != nil {
				p.secret = v.Secret.SecretName
				if v.Secret.DefaultMode != nil {
					p.mode = *v.Secret.DefaultMode
				}
			}
		}
		np := find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "faas-gpu-gpuserver")
		p.admitted = ingressPorts(np)[p.port]
		return p
	}
	off := read("provider.enabled=true")
	if off.port != 0 || off.secret != "" || off.mountPath != "" || off.env["FAAS_GPU_UI_ADDR"] != "" ||
		off.env["FAAS_GPU_UI_AUTH_DIR"] != "" {
		t.Errorf("the pool page is served by default: %+v", off)
	}

	on := read("provider.enabled=true", "gpuserver.ui.enabled=true")
	if on.env["FAAS_GPU_UI_ADDR"] != ":8091" || on.env["FAAS_GPU_UI_AUTH_DIR"] != "/var/secrets" ||
		on.mountPath != "/var/secrets" || !on.readOnly || on.port != 8091 || on.mode != 0o400 {
		t.Errorf("pool page on: %+v; want -ui-addr :8091 on port ui and the credentials read-only at -ui-auth-dir", on)
	}
	if on.secret != "faas-gpu-basic-auth" {
		t.Errorf("pool page credentials from %q, want the provider's basic-auth Secret", on.secret)
	}
	if on.checksum == off.checksum {
		t.Error("turning the pool page on does not roll the gpuserver pods")
	}
	if !slices.Equal(on.admitted, []string{"any"}) {
		t.Errorf("the pool page's port admits %v, want every peer (it asks for credentials)", on.admitted)
	}
	if p := read("gpuserver.ui.enabled=true", "basicAuth.secretName=basic-auth"); p.secret != "basic-auth" {
		t.Errorf("beside the stock chart the page's credentials come from %q, want basic-auth", p.secret)
	}
	p := read("provider.enabled=true", "gpuserver.ui.enabled=true", "gpuserver.ui.secretName=pool-page",
		"gpuserver.ui.port=9000", "gpuserver.ui.from[0].namespaceSelector.matchLabels.name=ingress")
	if p.secret != "pool-page" || p.port != 9000 || p.env["FAAS_GPU_UI_ADDR"] != ":9000" ||
		!slices.Equal(p.admitted, []string{"namespaces"}) {
		t.Errorf("ui.secretName, ui.port and ui.from: %+v", p)
	}
	if p := read("gpuserver.ui.enabled=true", "basicAuth.secretName=basic-auth", "gpuserver.metricsPort=0"); p.port != 8091 ||
		!slices.Equal(p.admitted, []string{"any"}) {
		t.Errorf("the pool page without the metrics port: %+v", p)
	}

	for _, bad := range []struct {
		sets []string
		says string
	}{
		{[]string{"gpuserver.ui.enabled=true"}, "gpuserver.ui.enabled"},
		{[]string{"gpuserver.ui.enabled=true", "provider.enabled=true", "basicAuth.enabled=false"}, "gpuserver.ui.enabled"},
		{[]string{"gpuserver.ui.enabled=true", "provider.enabled=true", "gpuserver.ui.port=8090"}, "gpuserver.ui.port"},
	} {
		args := []string{"template", "x", chartDir}
		for _, v := range bad.sets {
			args = append(args, "--set", v)
		}
		out, err := exec.Command(helmBinary(t), args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), bad.says) {
			t.Errorf("%v: %v, want a failure naming %s:\n%.300s", bad.sets, err, bad.says, out)
		}
	}
}
