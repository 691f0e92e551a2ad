package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
)

const ns = provider.DefaultNamespace

func newBackend(t *testing.T, objects ...runtime.Object) (*Backend, *fake.Clientset) {
	t.Helper()
	objects = append(objects, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	client := fake.NewClientset(objects...)
	b, err := New(client, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return b, client
}

func gpuFunction() types.FunctionDeployment {
	return types.FunctionDeployment{
		Service:    "resnet",
		Image:      "ghcr.io/example/resnet:1",
		EnvProcess: "python index.py",
		EnvVars:    map[string]string{"MODEL": "resnet50", "LD_LIBRARY_PATH": "/usr/lib/user"},
		Labels:     &map[string]string{"team": "vision", LabelScaleMin: "2"},
		Annotations: &map[string]string{
			"com.openfaas.gpu.memory": "1536Mi",
			"com.openfaas.gpu.slo":    "80ms",
		},
		Requests: &types.FunctionResources{Memory: "256Mi", CPU: "500m"},
	}
}

func envMap(env []corev1.EnvVar) map[string]string {
	m := map[string]string{}
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

func TestDeployGPUFunction(t *testing.T) {
	ctx := context.Background()
	b, client := newBackend(t)
	if err := b.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	d, err := client.AppsV1().Deployments(ns).Get(ctx, "resnet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Labels[LabelFunction] != "resnet" || d.Spec.Selector.MatchLabels[LabelFunction] != "resnet" {
		t.Errorf("deployment labels %v selector %v", d.Labels, d.Spec.Selector.MatchLabels)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %d, want com.openfaas.scale.min 2", *d.Spec.Replicas)
	}
	pod := d.Spec.Template
	for k, v := range map[string]string{LabelFunction: "resnet", LabelApp: "resnet", LabelController: "resnet", "team": "vision"} {
		if pod.Labels[k] != v {
			t.Errorf("pod label %s = %q, want %q", k, pod.Labels[k], v)
		}
	}
	if pod.Annotations[AnnotationPrometheusScrape] != "false" || d.Annotations["com.openfaas.gpu.memory"] != "1536Mi" {
		t.Errorf("annotations: pod %v deployment %v", pod.Annotations, d.Annotations)
	}
	spec := pod.Spec
	terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || terms[0].MatchExpressions[0].Key != DefaultGPUNodeLabelKey ||
		terms[0].MatchExpressions[0].Values[0] != "true" || terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpIn {
		t.Errorf("node affinity %+v", terms)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "nvidia.com/gpu" {
		t.Errorf("tolerations %+v", spec.Tolerations)
	}
	if len(spec.InitContainers) != 1 {
		t.Fatalf("init containers %+v", spec.InitContainers)
	}
	ic := spec.InitContainers[0]
	if ic.Image != DefaultShimImage || strings.Join(ic.Command, " ") != "cp "+DefaultShimPath+" /opt/faas-gpu/lib/libcuda.so.1" {
		t.Errorf("init container %s %v", ic.Image, ic.Command)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	if vols[ShimVolume].EmptyDir == nil {
		t.Errorf("shim volume %+v", vols[ShimVolume])
	}
	if hp := vols[SocketVolume].HostPath; hp == nil || hp.Path != DefaultSocketDir {
		t.Errorf("socket volume %+v", vols[SocketVolume])
	}
	c := spec.Containers[0]
	env := envMap(c.Env)
	want := map[string]string{
		"FAAS_GPU": "1", "FAAS_GPU_FUNCTION": "resnet",
		"FAAS_GPU_SOCKET": "/var/run/faas-gpu/gpuserver.sock", "FAAS_GPU_REMOTING_SOCKET": "/var/run/faas-gpu/remoting.sock",
		"LD_LIBRARY_PATH": "/opt/faas-gpu/lib", "FAAS_GPU_MEMORY_BYTES": "1610612736", "FAAS_GPU_SLO": "80ms",
		"FAAS_GPU_SLO_PERCENTILE": "98", "FAAS_GPU_ISOLATION": "shared", "fprocess": "python index.py", "MODEL": "resnet50",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
	if len(env) != len(c.Env) {
		t.Errorf("duplicate environment variables: %v", c.Env)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts[ShimVolume] != ShimMountPath || mounts[SocketVolume] != DefaultSocketDir {
		t.Errorf("mounts %v", mounts)
	}
	mem := c.Resources.Requests[corev1.ResourceMemory]
	if mem.Cmp(resource.MustParse("1536Mi")) != 0 {
		t.Errorf("memory request %s, want the GPU quota 1536Mi", mem.String())
	}
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
		t.Error("a GPU function must not request nvidia.com/gpu")
	}
	if _, ok := c.Resources.Requests["nvidia.com/gpu"]; ok {
		t.Error("a GPU function must not request nvidia.com/gpu")
	}

	svc, err := client.CoreV1().Services(ns).Get(ctx, "resnet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Selector[LabelFunction] != "resnet" || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].TargetPort.IntValue() != 8080 {
		t.Errorf("service %+v", svc.Spec)
	}

	// What the user deployed is what they read back: the injected variables are hidden.
	st, err := b.Status(ctx, "", "resnet")
	if err != nil {
		t.Fatal(err)
	}
	if st.EnvProcess != "python index.py" || st.EnvVars["MODEL"] != "resnet50" || st.EnvVars["FAAS_GPU"] != "" {
		t.Errorf("status env %q %v", st.EnvProcess, st.EnvVars)
	}
	if (*st.Annotations)["com.openfaas.gpu.slo"] != "80ms" || (*st.Labels)["team"] != "vision" || st.Image != "ghcr.io/example/resnet:1" {
		t.Errorf("status %+v", st)
	}
	if st.Replicas != 2 || st.AvailableReplicas != 0 {
		t.Errorf("replicas %d available %d", st.Replicas, st.AvailableReplicas)
	}

	if err := b.Deploy(ctx, gpuFunction()); !errors.Is(err, provider.ErrExists) {
		t.Errorf("second deploy: %v, want ErrExists", err)
	}
}

func TestDeployCPUFunctionWithSecrets(t *testing.T) {
	ctx := context.Background()
	b, client := newBackend(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "api-key", Namespace: ns}, Data: map[string][]byte{"api-key": []byte("k")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: ns}, Type: corev1.SecretTypeDockerConfigJson},
	)
	fn := types.FunctionDeployment{
		Service: "echo", Image: "ghcr.io/example/echo:1", Secrets: []string{"api-key", "registry"},
		Constraints:            []string{"kubernetes.io/arch == amd64"},
		ReadOnlyRootFilesystem: true,
		Annotations:            &map[string]string{AnnotationPrometheusScrape: "true"},
		Limits:                 &types.FunctionResources{Memory: "128Mi"},
	}
	if err := b.Deploy(ctx, fn); err != nil {
		t.Fatal(err)
	}
	d, err := client.AppsV1().Deployments(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	if spec.Affinity != nil || len(spec.InitContainers) != 0 || IsGPU(spec) {
		t.Error("a CPU function got the GPU injection")
	}
	if spec.NodeSelector["kubernetes.io/arch"] != "amd64" {
		t.Errorf("node selector %v", spec.NodeSelector)
	}
	if len(spec.ImagePullSecrets) != 1 || spec.ImagePullSecrets[0].Name != "registry" {
		t.Errorf("image pull secrets %v", spec.ImagePullSecrets)
	}
	var projected *corev1.ProjectedVolumeSource
	for _, v := range spec.Volumes {
		if v.Name == "echo-projected-secrets" {
			projected = v.Projected
		}
	}
	if projected == nil || len(projected.Sources) != 1 || projected.Sources[0].Secret.Name != "api-key" {
		t.Fatalf("projected secrets %+v", projected)
	}
	mounts := map[string]string{}
	for _, m := range spec.Containers[0].VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	if mounts["echo-projected-secrets"] != SecretsMountPath || mounts[tmpVolume] != "/tmp" {
		t.Errorf("mounts %v", mounts)
	}
	if d.Spec.Template.Annotations[AnnotationPrometheusScrape] != "true" {
		t.Errorf("a function's own prometheus.io.scrape must be kept: %v", d.Spec.Template.Annotations)
	}
	st, err := b.Status(ctx, ns, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(st.Secrets, ",") != "api-key,registry" || !st.ReadOnlyRootFilesystem || st.Limits.Memory != "128Mi" ||
		strings.Join(st.Constraints, ",") != "kubernetes.io/arch=amd64" {
		t.Errorf("status %+v", st)
	}
}

func TestUpdateKeepsReplicas(t *testing.T) {
	ctx := context.Background()
	b, client := newBackend(t)
	fn := gpuFunction()
	if err := b.Update(ctx, fn); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("update of an unknown function: %v, want ErrNotFound", err)
	}
	if err := b.Deploy(ctx, fn); err != nil {
		t.Fatal(err)
	}
	if err := b.Scale(ctx, ns, "resnet", 5); err != nil {
		t.Fatal(err)
	}
	fn.Image = "ghcr.io/example/resnet:2"
	(*fn.Annotations)["com.openfaas.gpu.memory"] = "3Gi"
	if err := b.Update(ctx, fn); err != nil {
		t.Fatal(err)
	}
	d, err := client.AppsV1().Deployments(ns).Get(ctx, "resnet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "ghcr.io/example/resnet:2" || *d.Spec.Replicas != 5 {
		t.Errorf("image %s replicas %d", c.Image, *d.Spec.Replicas)
	}
	if envMap(c.Env)["FAAS_GPU_MEMORY_BYTES"] != "3221225472" || len(d.Spec.Template.Spec.InitContainers) != 1 {
		t.Errorf("update did not re-inject: %v", c.Env)
	}
	mem := c.Resources.Requests[corev1.ResourceMemory]
	if mem.String() != "3Gi" {
		t.Errorf("memory request %s", mem.String())
	}

	// Turning a GPU function into a CPU function removes the injection.
	delete(*fn.Annotations, "com.openfaas.gpu.memory")
	delete(*fn.Annotations, "com.openfaas.gpu.slo")
	if err := b.Update(ctx, fn); err != nil {
		t.Fatal(err)
	}
	d, _ = client.AppsV1().Deployments(ns).Get(ctx, "resnet", metav1.GetOptions{})
	if IsGPU(d.Spec.Template.Spec) || len(d.Spec.Template.Spec.InitContainers) != 0 {
		t.Error("injection left after the GPU annotations were removed")
	}
}

func TestDeleteScaleStatusResolve(t *testing.T) {
	ctx := context.Background()
	b, client := newBackend(t)
	if err := b.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Resolve(ctx, ns, "resnet"); !errors.Is(err, provider.ErrNotReady) {
		t.Errorf("resolve without endpoints: %v, want ErrNotReady", err)
	}
	if _, err := b.Resolve(ctx, ns, "nope"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("resolve of an unknown function: %v, want ErrNotFound", err)
	}
	yes, no := true, false
	port, name := int32(8080), "http"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "resnet-abcde", Namespace: ns, Labels: map[string]string{LabelServiceName: "resnet"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
			{Addresses: []string{"10.0.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
		},
	}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for range 4 {
		u, err := b.Resolve(ctx, "", "resnet")
		if err != nil {
			t.Fatal(err)
		}
		seen[u.String()] = true
	}
	if len(seen) != 2 || !seen["http://10.0.0.1:8080"] || !seen["http://10.0.0.3:8080"] {
		t.Errorf("resolved %v, want both ready endpoints and never the unready one", seen)
	}
	st, err := b.Status(ctx, ns, "resnet")
	if err != nil {
		t.Fatal(err)
	}
	if st.AvailableReplicas != 2 {
		t.Errorf("available replicas %d, want the 2 ready endpoints", st.AvailableReplicas)
	}
	list, err := b.List(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "resnet" || list[0].AvailableReplicas != 2 {
		t.Errorf("list %+v", list)
	}

	if err := b.Scale(ctx, ns, "resnet", 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Status(ctx, ns, "resnet"); st.Replicas != 0 {
		t.Errorf("replicas after scale to zero: %d", st.Replicas)
	}
	if err := b.Scale(ctx, ns, "nope", 1); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("scale of an unknown function: %v", err)
	}
	if _, err := b.Status(ctx, ns, "nope"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("status of an unknown function: %v", err)
	}

	if err := b.Delete(ctx, ns, "resnet"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services(ns).Get(ctx, "resnet", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("service left after delete: %v", err)
	}
	if err := b.Delete(ctx, ns, "resnet"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
	if list, _ := b.List(ctx, ns); len(list) != 0 {
		t.Errorf("list after delete: %+v", list)
	}
}

func TestBadInputs(t *testing.T) {
	ctx := context.Background()
	b, _ := newBackend(t)
	cases := []struct {
		name   string
		mutate func(*types.FunctionDeployment)
		field  string
	}{
		{"bad name", func(f *types.FunctionDeployment) { f.Service = "Bad_Name" }, "service"},
		{"empty image", func(f *types.FunctionDeployment) { f.Image = " " }, "image"},
		{"bad gpu memory", func(f *types.FunctionDeployment) { (*f.Annotations)["com.openfaas.gpu.memory"] = "lots" }, "com.openfaas.gpu.memory"},
		{"bad slo", func(f *types.FunctionDeployment) { (*f.Annotations)["com.openfaas.gpu.slo"] = "fast" }, "com.openfaas.gpu.slo"},
		{"typo gpu annotation", func(f *types.FunctionDeployment) { (*f.Annotations)["com.openfaas.gpu.memroy"] = "1Gi" }, "com.openfaas.gpu.memroy"},
		{"bad scale label", func(f *types.FunctionDeployment) { (*f.Labels)[LabelScaleMin] = "-1" }, LabelScaleMin},
		{"min above max", func(f *types.FunctionDeployment) { (*f.Labels)[LabelScaleMax] = "1" }, LabelScaleMin},
		{"bad label value", func(f *types.FunctionDeployment) { (*f.Labels)["team"] = "a b" }, "labels.team"},
		{"bad constraint", func(f *types.FunctionDeployment) { f.Constraints = []string{"gpu"} }, "constraints"},
		{"bad memory", func(f *types.FunctionDeployment) { f.Requests.Memory = "1 GB" }, "requests.memory"},
		{"limit below quota", func(f *types.FunctionDeployment) { f.Limits = &types.FunctionResources{Memory: "1Gi"} }, "limits.memory"},
		{"request above limit", func(f *types.FunctionDeployment) { f.Limits = &types.FunctionResources{CPU: "100m"} }, "requests.cpu"},
		{"missing secret", func(f *types.FunctionDeployment) { f.Secrets = []string{"nope"} }, "secrets"},
		{"bad namespace", func(f *types.FunctionDeployment) { f.Namespace = "Not-OK" }, "namespace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fn := gpuFunction()
			tc.mutate(&fn)
			err := b.Deploy(ctx, fn)
			if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("deploy: %v, want ErrInvalid naming %s", err, tc.field)
			}
			if provider.StatusCode(err) != 400 {
				t.Errorf("status %d", provider.StatusCode(err))
			}
		})
	}
	if err := b.Scale(ctx, ns, "x", 1<<40); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("huge scale: %v", err)
	}
	if _, err := b.Status(ctx, ns, "a/b"); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("bad name in status: %v", err)
	}
}

func TestNamespaces(t *testing.T) {
	ctx := context.Background()
	b, _ := newBackend(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Labels: map[string]string{LabelNamespace: "1"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{LabelNamespace: "1"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}},
	)
	got, err := b.Namespaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "openfaas-fn,team-a,team-b" {
		t.Errorf("namespaces %v", got)
	}
	fn := gpuFunction()
	fn.Namespace = "team-a"
	if err := b.Deploy(ctx, fn); err != nil {
		t.Fatal(err)
	}
	if list, _ := b.List(ctx, "team-a"); len(list) != 1 || list[0].Namespace != "team-a" {
		t.Errorf("list team-a %+v", list)
	}
	fn.Namespace = "kube-system"
	if err := b.Deploy(ctx, fn); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "namespace") {
		t.Errorf("deploy to an unlabelled namespace: %v", err)
	}
	fn.Namespace = "missing"
	if err := b.Deploy(ctx, fn); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("deploy to a missing namespace: %v", err)
	}
}

func TestNamespacesWithNamespacedRBAC(t *testing.T) {
	ctx := context.Background()
	b, client := newBackend(t)
	client.PrependReactor("*", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("namespaces"), "", fmt.Errorf("role"))
	})
	got, err := b.Namespaces(ctx)
	if err != nil || len(got) != 1 || got[0] != ns {
		t.Errorf("namespaces %v %v, want only the default", got, err)
	}
	fn := gpuFunction()
	if err := b.Deploy(ctx, fn); err != nil {
		t.Errorf("deploy to the default namespace needs no namespace access: %v", err)
	}
	fn.Namespace = "other"
	if err := b.Deploy(ctx, fn); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("deploy to another namespace: %v", err)
	}
}

func TestSecrets(t *testing.T) {
	ctx := context.Background()
	b, client := newBackend(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-ours", Namespace: ns}},
	)
	if err := b.CreateSecret(ctx, types.Secret{Name: "token", Value: "s3cret"}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSecret(ctx, types.Secret{Name: "blob", Namespace: ns, RawValue: []byte{0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSecret(ctx, types.Secret{Name: "token", Value: "x"}); !errors.Is(err, provider.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	list, err := b.ListSecrets(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "blob" || list[1].Name != "token" || list[0].Value != "" {
		t.Errorf("list %+v, want only OpenFaaS secrets, without values", list)
	}
	s, _ := client.CoreV1().Secrets(ns).Get(ctx, "token", metav1.GetOptions{})
	if string(s.Data["token"]) != "s3cret" || s.Labels[LabelSecretManagedBy] != SecretManagedByValue {
		t.Errorf("stored secret %+v", s)
	}
	if err := b.UpdateSecret(ctx, types.Secret{Name: "token", Value: "new"}); err != nil {
		t.Fatal(err)
	}
	s, _ = client.CoreV1().Secrets(ns).Get(ctx, "token", metav1.GetOptions{})
	if string(s.Data["token"]) != "new" {
		t.Errorf("updated secret %q", s.Data["token"])
	}
	if err := b.UpdateSecret(ctx, types.Secret{Name: "nope", Value: "x"}); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("update unknown: %v", err)
	}
	if err := b.DeleteSecret(ctx, "", "token"); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteSecret(ctx, "", "token"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if err := b.CreateSecret(ctx, types.Secret{Name: "../etc", Value: "x"}); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "name") {
		t.Errorf("bad secret name: %v", err)
	}
}

func TestLogs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelFunction: "resnet"}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
	}
	pending := running("resnet-pending")
	pending.Status.Phase = corev1.PodPending
	b, _ := newBackend(t, running("resnet-1"), running("resnet-2"), pending)
	ch, err := b.Logs(ctx, logs.Request{Name: "resnet", Tail: 10})
	if err != nil {
		t.Fatal(err)
	}
	instances := map[string]bool{}
	for m := range ch {
		if m.Name != "resnet" || m.Namespace != ns || m.Text == "" {
			t.Errorf("message %+v", m)
		}
		instances[m.Instance] = true
	}
	if len(instances) != 2 || !instances["resnet-1"] || !instances["resnet-2"] {
		t.Errorf("instances %v, want the two running pods", instances)
	}
	ch, err = b.Logs(ctx, logs.Request{Name: "resnet", Instance: "resnet-2"})
	if err != nil {
		t.Fatal(err)
	}
	for m := range ch {
		if m.Instance != "resnet-2" {
			t.Errorf("instance %s", m.Instance)
		}
	}
	if _, err := b.Logs(ctx, logs.Request{Name: "resnet", Tail: -1}); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("negative tail: %v", err)
	}
}

func TestReadLogTimestamps(t *testing.T) {
	out := make(chan logs.Message, 2)
	readLog(context.Background(), strings.NewReader("2026-01-02T03:04:05.5Z hello world\nno timestamp\n"), logs.Message{Name: "f"}, out)
	close(out)
	m1, m2 := <-out, <-out
	if m1.Text != "hello world" || m1.Timestamp.Year() != 2026 || m2.Text != "no timestamp" {
		t.Errorf("messages %+v %+v", m1, m2)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := map[string]func(*Config){
		"DefaultNamespace":   func(c *Config) { c.DefaultNamespace = "" },
		"HTTPPort":           func(c *Config) { c.HTTPPort = 0 },
		"ImagePullPolicy":    func(c *Config) { c.ImagePullPolicy = "Sometimes" },
		"GPU.NodeLabelKey":   func(c *Config) { c.GPU.NodeLabelKey = "bad key" },
		"GPU.NodeLabelValue": func(c *Config) { c.GPU.NodeLabelValue = "a b" },
		"GPU.Toleration":     func(c *Config) { c.GPU.Toleration = "-x" },
		"GPU.ShimImage":      func(c *Config) { c.GPU.ShimImage = "" },
		"GPU.ShimPath":       func(c *Config) { c.GPU.ShimPath = "lib/libcuda.so.1" },
		"GPU.SocketDir":      func(c *Config) { c.GPU.SocketDir = "/var/run/../x" },
		"GPU.ControlSocket":  func(c *Config) { c.GPU.ControlSocket = "a/b" },
		"GPU.RemotingSocket": func(c *Config) { c.GPU.RemotingSocket = "" },
	}
	for field, mutate := range cases {
		c := DefaultConfig()
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), field+":") {
			t.Errorf("%s: %v", field, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Error(err)
	}
	if _, err := New(nil, DefaultConfig()); err == nil {
		t.Error("nil client accepted")
	}
}

// TestGPUPodsGetTheirRegistrationTicket: with the gpuservers' key, a GPU pod carries the ticket that registers
// exactly its spec (the gpuserver refuses any other spec with it) and the sockets' group.
func TestGPUPodsGetTheirRegistrationTicket(t *testing.T) {
	ctx := context.Background()
	key, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.GPU.RegistrationKey, cfg.GPU.SocketGroup = key, 2042
	client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	b, err := New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	d, err := client.AppsV1().Deployments(ns).Get(ctx, "resnet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env := envMap(d.Spec.Template.Spec.Containers[0].Env)
	spec := pool.FunctionSpec{Name: env[contract.EnvFunction], MemoryBytes: 1536 << 20, SLO: 80 * time.Millisecond}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	if !key.IsTicket(spec, env[contract.EnvRegistrationTicket]) {
		t.Errorf("ticket %q does not register %+v", env[contract.EnvRegistrationTicket], spec)
	}
	other := spec
	other.MemoryBytes *= 2
	if key.IsTicket(other, env[contract.EnvRegistrationTicket]) {
		t.Error("the ticket also registers a larger quota")
	}
	sc := d.Spec.Template.Spec.SecurityContext
	if sc == nil || len(sc.SupplementalGroups) != 1 || sc.SupplementalGroups[0] != 2042 {
		t.Errorf("pod security context %+v, want supplementary group 2042", sc)
	}
	// Without the key the pod gets no ticket (and the provider warns at start).
	plain, client2 := newBackend(t)
	if err := plain.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	d2, err := client2.AppsV1().Deployments(ns).Get(ctx, "resnet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := envMap(d2.Spec.Template.Spec.Containers[0].Env)[contract.EnvRegistrationTicket]; ok {
		t.Error("a ticket without a key")
	}
}
