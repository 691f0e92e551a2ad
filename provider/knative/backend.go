// Package knative runs faas-gpu functions as Knative Services. Each function becomes one Knative Service whose
// revision template carries the same pod spec and GPU injection as the kubernetes backend builds; scaling bounds come
// from the com.openfaas.scale.min/max labels, status from the Service's Ready condition, and invocations go to its
// cluster-local address. Secrets, logs and namespaces are the kubernetes backend's.
package knative

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"knative.dev/pkg/apis"
	"knative.dev/serving/pkg/apis/autoscaling"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
	servingclient "knative.dev/serving/pkg/client/clientset/versioned"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/kubernetes"
)

// VisibilityLabel keeps function Services cluster-local: the OpenFaaS gateway is their front door.
const (
	VisibilityLabel        = "networking.knative.dev/visibility"
	VisibilityClusterLocal = "cluster-local"
)

// Backend runs functions as Knative Services. It implements provider.Backend, provider.SecretStore and
// provider.LogSource.
type Backend struct {
	kube    *kubernetes.Backend
	client  k8sclient.Interface
	serving servingclient.Interface
	cfg     kubernetes.Config
}

var (
	_ provider.Backend     = (*Backend)(nil)
	_ provider.SecretStore = (*Backend)(nil)
	_ provider.LogSource   = (*Backend)(nil)
)

// New returns a backend; kube serves secrets, logs and namespaces, serving the Knative Services.
func New(kube k8sclient.Interface, serving servingclient.Interface, cfg kubernetes.Config) (*Backend, error) {
	if serving == nil {
		return nil, fmt.Errorf("%w: knative serving client is nil", provider.ErrInvalid)
	}
	k, err := kubernetes.New(kube, cfg)
	if err != nil {
		return nil, err
	}
	return &Backend{kube: k, client: kube, serving: serving, cfg: cfg}, nil
}

// Deploy creates the function's Knative Service.
func (b *Backend) Deploy(ctx context.Context, fn types.FunctionDeployment) error {
	f, err := b.build(ctx, fn)
	if err != nil {
		return err
	}
	_, err = b.serving.ServingV1().Services(f.Namespace).Create(ctx, b.service(f, nil), metav1.CreateOptions{})
	return kubernetes.APIError("create knative service "+f.Name, err)
}

// Update replaces the function's revision template; Knative rolls out a new revision.
func (b *Backend) Update(ctx context.Context, fn types.FunctionDeployment) error {
	f, err := b.build(ctx, fn)
	if err != nil {
		return err
	}
	services := b.serving.ServingV1().Services(f.Namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := b.get(ctx, f.Namespace, f.Name)
		if err != nil {
			return err
		}
		_, err = services.Update(ctx, b.service(f, cur), metav1.UpdateOptions{})
		return err
	})
	return kubernetes.APIError("update knative service "+f.Name, err)
}

// Delete removes the function's Knative Service (and with it its revisions and pods).
func (b *Backend) Delete(ctx context.Context, namespace, name string) error {
	ns, err := b.target(namespace, name)
	if err != nil {
		return err
	}
	if _, err := b.get(ctx, ns, name); err != nil {
		return kubernetes.APIError("get knative service "+name, err)
	}
	err = b.serving.ServingV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
	return kubernetes.APIError("delete knative service "+name, err)
}

// List returns every function (Knative Service labelled faas_function) of a namespace.
func (b *Backend) List(ctx context.Context, namespace string) ([]types.FunctionStatus, error) {
	ns := b.cfg.DefaultNamespace
	if namespace != "" {
		ns = namespace
	}
	list, err := b.serving.ServingV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelFunction})
	if err != nil {
		return nil, kubernetes.APIError("list knative services in "+ns, err)
	}
	out := make([]types.FunctionStatus, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, FunctionStatus(&list.Items[i]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Status returns one function. Knative's autoscaler owns the pod count, so replicas are the minimum scale (at least
// 1: a Ready Service serves, through the activator when scaled to zero) and available replicas are that many when
// the Ready condition is True, else 0.
func (b *Backend) Status(ctx context.Context, namespace, name string) (types.FunctionStatus, error) {
	ns, err := b.target(namespace, name)
	if err != nil {
		return types.FunctionStatus{}, err
	}
	s, err := b.get(ctx, ns, name)
	if err != nil {
		return types.FunctionStatus{}, kubernetes.APIError("get knative service "+name, err)
	}
	return FunctionStatus(s), nil
}

// Scale sets the revision template's minimum scale (autoscaling.knative.dev/min-scale); 0 lets Knative scale the
// function to zero. The maximum scale is raised when it is below. Knative rolls out a new revision for the change.
func (b *Backend) Scale(ctx context.Context, namespace, name string, replicas uint64) error {
	ns, err := b.target(namespace, name)
	if err != nil {
		return err
	}
	if replicas > math.MaxInt32 {
		return fmt.Errorf("%w: replicas: %d is above %d", provider.ErrInvalid, replicas, math.MaxInt32)
	}
	services := b.serving.ServingV1().Services(ns)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := b.get(ctx, ns, name)
		if err != nil {
			return err
		}
		a := s.Spec.Template.Annotations
		if a == nil {
			a = map[string]string{}
		}
		if replicas == 0 {
			delete(a, autoscaling.MinScaleAnnotationKey)
		} else {
			a[autoscaling.MinScaleAnnotationKey] = strconv.FormatUint(replicas, 10)
		}
		if m, err := strconv.ParseUint(a[autoscaling.MaxScaleAnnotationKey], 10, 32); err == nil && m > 0 && m < replicas {
			a[autoscaling.MaxScaleAnnotationKey] = strconv.FormatUint(replicas, 10)
		}
		s.Spec.Template.Annotations = a
		_, err = services.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	return kubernetes.APIError("scale knative service "+name, err)
}

// Resolve returns the Service's cluster-local address (status.address.url, else status.url) once it is Ready.
func (b *Backend) Resolve(ctx context.Context, namespace, name string) (*url.URL, error) {
	ns, err := b.target(namespace, name)
	if err != nil {
		return nil, err
	}
	s, err := b.get(ctx, ns, name)
	if err != nil {
		return nil, kubernetes.APIError("get knative service "+name, err)
	}
	if !ready(s) {
		return nil, fmt.Errorf("knative service %s.%s is not ready: %w", name, ns, provider.ErrNotReady)
	}
	var u *apis.URL
	if s.Status.Address != nil && s.Status.Address.URL != nil {
		u = s.Status.Address.URL
	} else if s.Status.URL != nil {
		u = s.Status.URL
	}
	if u == nil || u.Host == "" {
		return nil, fmt.Errorf("knative service %s.%s has no URL yet: %w", name, ns, provider.ErrNotReady)
	}
	return u.URL(), nil
}

// Namespaces, secrets and logs are the kubernetes backend's.

// Namespaces lists the default namespace and those labelled openfaas: "1".
func (b *Backend) Namespaces(ctx context.Context) ([]string, error) { return b.kube.Namespaces(ctx) }

// ListSecrets lists the namespace's OpenFaaS secrets.
func (b *Backend) ListSecrets(ctx context.Context, namespace string) ([]types.Secret, error) {
	return b.kube.ListSecrets(ctx, namespace)
}

// CreateSecret creates a Kubernetes Secret.
func (b *Backend) CreateSecret(ctx context.Context, s types.Secret) error {
	return b.kube.CreateSecret(ctx, s)
}

// UpdateSecret replaces a secret's value.
func (b *Backend) UpdateSecret(ctx context.Context, s types.Secret) error {
	return b.kube.UpdateSecret(ctx, s)
}

// DeleteSecret removes a secret.
func (b *Backend) DeleteSecret(ctx context.Context, namespace, name string) error {
	return b.kube.DeleteSecret(ctx, namespace, name)
}

// Logs streams the function container's output from its pods (Knative keeps the template's faas_function label).
func (b *Backend) Logs(ctx context.Context, req logs.Request) (<-chan logs.Message, error) {
	return b.kube.Logs(ctx, req)
}

func (b *Backend) target(namespace, name string) (string, error) {
	ns := b.cfg.DefaultNamespace
	if namespace != "" {
		ns = namespace
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return ns, fmt.Errorf("%w: name: %q: %s", provider.ErrInvalid, name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return ns, fmt.Errorf("%w: namespace: %q: %s", provider.ErrInvalid, ns, strings.Join(errs, "; "))
	}
	return ns, nil
}

// get returns a Knative Service that is a function; any other Service of that name is not found.
func (b *Backend) get(ctx context.Context, ns, name string) (*servingv1.Service, error) {
	s, err := b.serving.ServingV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if _, ok := s.Labels[kubernetes.LabelFunction]; !ok {
		return nil, apierrors.NewNotFound(servingv1.Resource("services"), name)
	}
	return s, nil
}

func (b *Backend) build(ctx context.Context, fn types.FunctionDeployment) (kubernetes.Function, error) {
	if fn.Namespace == "" {
		fn.Namespace = b.cfg.DefaultNamespace
	}
	if errs := validation.IsDNS1123Label(fn.Service); len(errs) > 0 {
		return kubernetes.Function{}, fmt.Errorf("%w: service: %q: %s", provider.ErrInvalid, fn.Service, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(fn.Namespace); len(errs) > 0 {
		return kubernetes.Function{}, fmt.Errorf("%w: namespace: %q: %s", provider.ErrInvalid, fn.Namespace, strings.Join(errs, "; "))
	}
	if err := b.kube.CheckNamespace(ctx, fn.Namespace); err != nil {
		return kubernetes.Function{}, err
	}
	secrets, err := kubernetes.LookupSecrets(ctx, b.client, fn.Namespace, fn.Secrets)
	if err != nil {
		return kubernetes.Function{}, err
	}
	return b.cfg.Build(fn, secrets)
}

// service builds the Knative Service of f; cur is the existing one on update.
func (b *Backend) service(f kubernetes.Function, cur *servingv1.Service) *servingv1.Service {
	s := &servingv1.Service{}
	if cur != nil {
		s = cur.DeepCopy()
	}
	s.Name, s.Namespace = f.Name, f.Namespace
	s.Labels = map[string]string{kubernetes.LabelFunction: f.Name, VisibilityLabel: VisibilityClusterLocal}
	s.Annotations = copyMap(f.Annotations)

	tmpl := copyMap(f.Annotations)
	if f.MinScale > 0 {
		tmpl[autoscaling.MinScaleAnnotationKey] = strconv.Itoa(int(f.MinScale))
	}
	if f.MaxScale > 0 {
		tmpl[autoscaling.MaxScaleAnnotationKey] = strconv.Itoa(int(f.MaxScale))
	}
	s.Spec.Template = servingv1.RevisionTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: copyMap(f.Labels), Annotations: tmpl},
		Spec:       servingv1.RevisionSpec{PodSpec: podSpec(f.PodSpec)},
	}
	s.Spec.RouteSpec = servingv1.RouteSpec{}
	return s
}

// podSpec adapts the kubernetes pod spec to what Knative accepts: one port named "" (Knative allows only "",
// http1 and h2c), and no restart or DNS policy (Knative sets them).
func podSpec(in corev1.PodSpec) corev1.PodSpec {
	p := *in.DeepCopy()
	p.RestartPolicy = ""
	p.DNSPolicy = ""
	for i := range p.Containers[0].Ports {
		p.Containers[0].Ports[i].Name = ""
	}
	return p
}

func ready(s *servingv1.Service) bool {
	c := s.Status.GetCondition(apis.ConditionReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// FunctionStatus reads a function's Knative Service back into the faas-provider form (see Backend.Status).
func FunctionStatus(s *servingv1.Service) types.FunctionStatus {
	t := s.Spec.Template
	st := kubernetes.ReadPodSpec(s.Name, corev1.PodTemplateSpec{ObjectMeta: t.ObjectMeta, Spec: t.Spec.PodSpec})
	ann := map[string]string{}
	for k, v := range t.Annotations {
		if k != autoscaling.MinScaleAnnotationKey && k != autoscaling.MaxScaleAnnotationKey {
			ann[k] = v
		}
	}
	st.Annotations = &ann
	st.Namespace = s.Namespace
	st.CreatedAt = s.CreationTimestamp.Time
	replicas := uint64(1)
	if n, err := strconv.ParseUint(t.Annotations[autoscaling.MinScaleAnnotationKey], 10, 32); err == nil && n > 0 {
		replicas = n
	}
	st.Replicas = replicas
	if ready(s) {
		st.AvailableReplicas = replicas
	}
	return st
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
