package knative

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	"knative.dev/serving/pkg/apis/autoscaling"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingfake "knative.dev/serving/pkg/client/clientset/versioned/fake"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/kubernetes"
)

const ns = provider.DefaultNamespace

func newBackend(t *testing.T) (*Backend, *k8sfake.Clientset, *servingfake.Clientset) {
	t.Helper()
	kube := k8sfake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"openfaas": "1"}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "api-key", Namespace: ns}, Data: map[string][]byte{"api-key": []byte("k")}},
	)
	serving := servingfake.NewSimpleClientset()
	b, err := New(kube, serving, kubernetes.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return b, kube, serving
}

func gpuFunction() types.FunctionDeployment {
	return types.FunctionDeployment{
		Service: "bert",
		Image:   "ghcr.io/example/bert:1",
		Labels:  &map[string]string{kubernetes.LabelScaleMin: "1", kubernetes.LabelScaleMax: "4"},
		Annotations: &map[string]string{
			"com.openfaas.gpu.memory":    "2Gi",
			"com.openfaas.gpu.isolation": "isolated",
		},
		Secrets: []string{"api-key"},
	}
}

func setReady(t *testing.T, serving *servingfake.Clientset, name string, status corev1.ConditionStatus, url string) {
	t.Helper()
	ctx := context.Background()
	s, err := serving.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionReady, Status: status}}
	if url != "" {
		u, err := apis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		s.Status.Address = &duckv1.Addressable{URL: u}
	}
	if _, err := serving.ServingV1().Services(ns).UpdateStatus(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestDeployGPUFunction(t *testing.T) {
	ctx := context.Background()
	b, _, serving := newBackend(t)
	if err := b.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	s, err := serving.ServingV1().Services(ns).Get(ctx, "bert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Labels[kubernetes.LabelFunction] != "bert" || s.Labels[VisibilityLabel] != VisibilityClusterLocal {
		t.Errorf("service labels %v", s.Labels)
	}
	tmpl := s.Spec.Template
	if tmpl.Annotations[autoscaling.MinScaleAnnotationKey] != "1" || tmpl.Annotations[autoscaling.MaxScaleAnnotationKey] != "4" {
		t.Errorf("scale annotations %v", tmpl.Annotations)
	}
	if tmpl.Labels[kubernetes.LabelFunction] != "bert" {
		t.Errorf("template labels %v (logs find pods by faas_function)", tmpl.Labels)
	}
	spec := tmpl.Spec.PodSpec
	if spec.RestartPolicy != "" || spec.DNSPolicy != "" || spec.Containers[0].Ports[0].Name != "" || spec.Containers[0].Ports[0].ContainerPort != 8080 {
		t.Errorf("pod spec has fields Knative refuses: %+v", spec)
	}
	if !kubernetes.IsGPU(spec) || len(spec.InitContainers) != 1 || spec.Affinity == nil {
		t.Fatal("GPU injection missing")
	}
	env := map[string]string{}
	for _, e := range spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["FAAS_GPU"] != "1" || env["FAAS_GPU_FUNCTION"] != "bert" || env["FAAS_GPU_ISOLATION"] != "isolated" ||
		env["LD_LIBRARY_PATH"] != kubernetes.ShimMountPath {
		t.Errorf("env %v", env)
	}
	mem := spec.Containers[0].Resources.Requests[corev1.ResourceMemory]
	if mem.String() != "2Gi" {
		t.Errorf("memory request %s", mem.String())
	}
	if err := b.Deploy(ctx, gpuFunction()); !errors.Is(err, provider.ErrExists) {
		t.Errorf("second deploy: %v", err)
	}
}

func TestStatusScaleResolveDelete(t *testing.T) {
	ctx := context.Background()
	b, _, serving := newBackend(t)
	if err := b.Deploy(ctx, gpuFunction()); err != nil {
		t.Fatal(err)
	}
	st, err := b.Status(ctx, "", "bert")
	if err != nil {
		t.Fatal(err)
	}
	if st.Replicas != 1 || st.AvailableReplicas != 0 || st.Image != "ghcr.io/example/bert:1" || st.EnvVars["FAAS_GPU"] != "" {
		t.Errorf("status before ready %+v", st)
	}
	if _, ok := (*st.Annotations)[autoscaling.MinScaleAnnotationKey]; ok {
		t.Error("knative's own annotations leak into the function's annotations")
	}
	if _, err := b.Resolve(ctx, ns, "bert"); !errors.Is(err, provider.ErrNotReady) {
		t.Errorf("resolve before ready: %v", err)
	}
	setReady(t, serving, "bert", corev1.ConditionTrue, "http://bert.openfaas-fn.svc.cluster.local")
	u, err := b.Resolve(ctx, ns, "bert")
	if err != nil || u.String() != "http://bert.openfaas-fn.svc.cluster.local" {
		t.Errorf("resolve %v %v", u, err)
	}
	if st, _ := b.Status(ctx, ns, "bert"); st.AvailableReplicas != 1 {
		t.Errorf("available after ready %d", st.AvailableReplicas)
	}
	setReady(t, serving, "bert", corev1.ConditionFalse, "")
	if _, err := b.Resolve(ctx, ns, "bert"); !errors.Is(err, provider.ErrNotReady) {
		t.Errorf("resolve when not ready: %v", err)
	}

	if err := b.Scale(ctx, ns, "bert", 6); err != nil {
		t.Fatal(err)
	}
	s, _ := serving.ServingV1().Services(ns).Get(ctx, "bert", metav1.GetOptions{})
	if a := s.Spec.Template.Annotations; a[autoscaling.MinScaleAnnotationKey] != "6" || a[autoscaling.MaxScaleAnnotationKey] != "6" {
		t.Errorf("after scale to 6: %v", a)
	}
	if err := b.Scale(ctx, ns, "bert", 0); err != nil {
		t.Fatal(err)
	}
	s, _ = serving.ServingV1().Services(ns).Get(ctx, "bert", metav1.GetOptions{})
	if _, ok := s.Spec.Template.Annotations[autoscaling.MinScaleAnnotationKey]; ok {
		t.Error("scale to zero must drop min-scale")
	}
	if err := b.Scale(ctx, ns, "nope", 1); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("scale unknown: %v", err)
	}

	list, err := b.List(ctx, "")
	if err != nil || len(list) != 1 || list[0].Name != "bert" || strings.Join(list[0].Secrets, ",") != "api-key" {
		t.Errorf("list %+v %v", list, err)
	}
	if err := b.Delete(ctx, ns, "bert"); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, ns, "bert"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if _, err := b.Status(ctx, ns, "bert"); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("status after delete: %v", err)
	}
}

func TestUpdate(t *testing.T) {
	ctx := context.Background()
	b, _, serving := newBackend(t)
	fn := gpuFunction()
	if err := b.Update(ctx, fn); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("update unknown: %v", err)
	}
	// A Knative Service that is not a function is not ours to update.
	other := &servingv1.Service{ObjectMeta: metav1.ObjectMeta{Name: "bert", Namespace: ns}}
	if _, err := serving.ServingV1().Services(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Update(ctx, fn); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("update of a foreign service: %v", err)
	}
	if err := serving.ServingV1().Services(ns).Delete(ctx, "bert", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Deploy(ctx, fn); err != nil {
		t.Fatal(err)
	}
	fn.Image = "ghcr.io/example/bert:2"
	(*fn.Labels)[kubernetes.LabelScaleMax] = "8"
	if err := b.Update(ctx, fn); err != nil {
		t.Fatal(err)
	}
	s, _ := serving.ServingV1().Services(ns).Get(ctx, "bert", metav1.GetOptions{})
	if s.Spec.Template.Spec.Containers[0].Image != "ghcr.io/example/bert:2" || s.Spec.Template.Annotations[autoscaling.MaxScaleAnnotationKey] != "8" {
		t.Errorf("after update %+v", s.Spec.Template)
	}
}

func TestBadInputsAndSharedParts(t *testing.T) {
	ctx := context.Background()
	b, _, _ := newBackend(t)
	for field, mutate := range map[string]func(*types.FunctionDeployment){
		"service":                 func(f *types.FunctionDeployment) { f.Service = "" },
		"com.openfaas.gpu.memory": func(f *types.FunctionDeployment) { (*f.Annotations)["com.openfaas.gpu.memory"] = "-1Gi" },
		"secrets":                 func(f *types.FunctionDeployment) { f.Secrets = []string{"missing"} },
		"namespace":               func(f *types.FunctionDeployment) { f.Namespace = "default" },
		"labels." + kubernetes.LabelScaleMax: func(f *types.FunctionDeployment) {
			(*f.Labels)[kubernetes.LabelScaleMax] = "many"
		},
	} {
		fn := gpuFunction()
		mutate(&fn)
		if err := b.Deploy(ctx, fn); !errors.Is(err, provider.ErrInvalid) && !errors.Is(err, provider.ErrNotFound) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
	nss, err := b.Namespaces(ctx)
	if err != nil || strings.Join(nss, ",") != "openfaas-fn,team-a" {
		t.Errorf("namespaces %v %v", nss, err)
	}
	if err := b.CreateSecret(ctx, types.Secret{Name: "token", Value: "v"}); err != nil {
		t.Fatal(err)
	}
	if err := b.UpdateSecret(ctx, types.Secret{Name: "token", Value: "w"}); err != nil {
		t.Fatal(err)
	}
	if list, err := b.ListSecrets(ctx, ""); err != nil || len(list) != 1 || list[0].Name != "token" {
		t.Errorf("secrets %+v %v", list, err)
	}
	if err := b.DeleteSecret(ctx, "", "token"); err != nil {
		t.Fatal(err)
	}
	ch, err := b.Logs(ctx, logs.Request{Name: "bert"})
	if err != nil {
		t.Fatal(err)
	}
	for range ch {
		t.Error("logs of a function without pods")
	}
	if _, err := New(k8sfake.NewClientset(), nil, kubernetes.DefaultConfig()); err == nil {
		t.Error("nil serving client accepted")
	}
}
