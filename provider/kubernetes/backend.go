package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/openfaas/faas-provider/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/faas-gpu/faas-gpu/provider"
)

// Backend runs functions as Deployments and Services. It implements provider.Backend, provider.SecretStore and
// provider.LogSource.
//
// Resolve and the replica counts of Status and List read the functions' EndpointSlices from a shared-informer cache
// once Start has run; a Backend that was not started lists them from the API server on every call.
type Backend struct {
	client    kubernetes.Interface
	cfg       Config
	next      atomic.Uint64 // round-robin position of Resolve
	endpoints *endpointCache
	nodes     *nodeReports // nil without Config.GPUServers
	routes    routeCounter // Resolve's picks by what decided them
}

var (
	_ provider.Backend     = (*Backend)(nil)
	_ provider.SecretStore = (*Backend)(nil)
	_ provider.LogSource   = (*Backend)(nil)
)

// New returns a backend using client; cfg is validated.
func New(client kubernetes.Interface, cfg Config) (*Backend, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: kubernetes client is nil", provider.ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Backend{client: client, cfg: cfg, endpoints: newEndpointCache(client)}
	if cfg.GPUServers != "" {
		every, maxAge := cfg.NodeReportEvery, cfg.NodeReportMaxAge
		if every <= 0 {
			every = DefaultNodeReportEvery
		}
		if maxAge <= 0 {
			maxAge = DefaultNodeReportMaxAge
		}
		var token string
		if len(cfg.GPU.RegistrationKey) != 0 {
			token = cfg.GPU.RegistrationKey.AdminToken()
		}
		nr, err := newNodeReports(client, cfg.GPUServers, token, every, maxAge)
		if err != nil {
			return nil, fmt.Errorf("%w: GPUServers: %v", provider.ErrInvalid, err)
		}
		b.nodes = nr
	}
	return b, nil
}

// Start runs the EndpointSlice cache until ctx ends or Stop: an informer for the default namespace starts now, one
// for another function namespace on its first Resolve (after CheckNamespace), Status or List. Start returns at once;
// until a namespace's informer has synced, reads of it go to the API server, so the first requests after start
// are answered too. Starting twice is an error.
func (b *Backend) Start(ctx context.Context) error {
	if err := b.endpoints.start(ctx, b.cfg.DefaultNamespace); err != nil {
		return err
	}
	if b.nodes != nil {
		b.nodes.start(b.endpoints.context())
	}
	return nil
}

// Stop ends the EndpointSlice cache's informers and waits, until ctx ends, for their goroutines to return. The
// backend keeps working afterwards, listing from the API server. Stop without Start returns at once.
func (b *Backend) Stop(ctx context.Context) error {
	err := b.endpoints.stop(ctx)
	if b.nodes != nil {
		err = errors.Join(err, b.nodes.wait(ctx))
	}
	return err
}

// Config returns the backend's settings.
func (b *Backend) Config() Config { return b.cfg }

// Deploy creates the function's Deployment and Service.
func (b *Backend) Deploy(ctx context.Context, fn types.FunctionDeployment) error {
	f, err := b.build(ctx, fn)
	if err != nil {
		return err
	}
	if _, err := b.client.AppsV1().Deployments(f.Namespace).Create(ctx, b.deployment(f, nil), metav1.CreateOptions{}); err != nil {
		return APIError("create deployment "+f.Name, err)
	}
	return b.applyService(ctx, f)
}

// Update replaces the function's pod template and Service; the replica count is kept (raised to the minimum scale).
func (b *Backend) Update(ctx context.Context, fn types.FunctionDeployment) error {
	f, err := b.build(ctx, fn)
	if err != nil {
		return err
	}
	deployments := b.client.AppsV1().Deployments(f.Namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := deployments.Get(ctx, f.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := cur.Labels[LabelFunction]; !ok {
			return apierrors.NewNotFound(appsv1.Resource("deployments"), f.Name)
		}
		_, err = deployments.Update(ctx, b.deployment(f, cur), metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return APIError("update deployment "+f.Name, err)
	}
	return b.applyService(ctx, f)
}

// Delete removes the function's Deployment and Service.
func (b *Backend) Delete(ctx context.Context, namespace, name string) error {
	ns, err := b.target(namespace, name)
	if err != nil {
		return err
	}
	deployments := b.client.AppsV1().Deployments(ns)
	cur, err := deployments.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return APIError("get deployment "+name, err)
	}
	if _, ok := cur.Labels[LabelFunction]; !ok {
		return fmt.Errorf("deployment %s.%s is not a function: %w", name, ns, provider.ErrNotFound)
	}
	if err := deployments.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return APIError("delete deployment "+name, err)
	}
	if err := b.client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return APIError("delete service "+name, err)
	}
	return nil
}

// build resolves the namespace and the named secrets and builds the function.
func (b *Backend) build(ctx context.Context, fn types.FunctionDeployment) (Function, error) {
	fn.Namespace = b.cfg.namespace(fn.Namespace)
	if errs := validation.IsDNS1123Label(fn.Service); len(errs) > 0 {
		return Function{}, invalid("service", "%q: %s", fn.Service, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(fn.Namespace); len(errs) > 0 {
		return Function{}, invalid("namespace", "%q: %s", fn.Namespace, strings.Join(errs, "; "))
	}
	if err := b.CheckNamespace(ctx, fn.Namespace); err != nil {
		return Function{}, err
	}
	secrets, err := LookupSecrets(ctx, b.client, fn.Namespace, fn.Secrets)
	if err != nil {
		return Function{}, err
	}
	return b.cfg.Build(fn, secrets)
}

// target validates a namespace and function name from a request.
func (b *Backend) target(namespace, name string) (string, error) {
	ns := b.cfg.namespace(namespace)
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return ns, invalid("name", "%q: %s", name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return ns, invalid("namespace", "%q: %s", ns, strings.Join(errs, "; "))
	}
	return ns, nil
}

// deployment builds the Deployment of f; cur is the existing one on update.
func (b *Backend) deployment(f Function, cur *appsv1.Deployment) *appsv1.Deployment {
	replicas := int32(1)
	if f.MinScale > 0 {
		replicas = f.MinScale
	}
	d := &appsv1.Deployment{}
	if cur != nil {
		d = cur.DeepCopy()
		if d.Spec.Replicas != nil && *d.Spec.Replicas > replicas {
			replicas = *d.Spec.Replicas
		}
		if f.MaxScale > 0 && replicas > f.MaxScale {
			replicas = f.MaxScale
		}
	}
	d.Name = f.Name
	d.Namespace = f.Namespace
	d.Labels = map[string]string{LabelFunction: f.Name}
	d.Annotations = copyMap(f.Annotations)
	maxUnavailable := intstr.FromInt32(0)
	maxSurge := intstr.FromInt32(1)
	history := int32(10)
	d.Spec.Replicas = &replicas
	d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{LabelFunction: f.Name}}
	d.Spec.Strategy = appsv1.DeploymentStrategy{
		Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{
			MaxUnavailable: &maxUnavailable, MaxSurge: &maxSurge,
		},
	}
	d.Spec.RevisionHistoryLimit = &history
	d.Spec.Template = corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Name:        f.Name,
			Labels:      copyMap(f.Labels),
			Annotations: copyMap(f.Annotations),
		},
		Spec: f.PodSpec,
	}
	return d
}

// service builds the ClusterIP Service selecting the function's pods on the HTTP port.
func (b *Backend) service(f Function) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name:        f.Name,
			Namespace:   f.Namespace,
			Labels:      map[string]string{LabelFunction: f.Name},
			Annotations: copyMap(f.Annotations),
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{LabelFunction: f.Name},
			Ports: []corev1.ServicePort{{
				Name:       "http",
				Protocol:   corev1.ProtocolTCP,
				Port:       b.cfg.HTTPPort,
				TargetPort: intstr.FromInt32(b.cfg.HTTPPort),
			}},
		},
	}
}

// applyService creates the function's Service or brings an existing one up to date.
func (b *Backend) applyService(ctx context.Context, f Function) error {
	services := b.client.CoreV1().Services(f.Namespace)
	want := b.service(f)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := services.Get(ctx, f.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = services.Create(ctx, want, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		next := cur.DeepCopy()
		next.Labels, next.Annotations = want.Labels, want.Annotations
		next.Spec.Selector, next.Spec.Ports = want.Spec.Selector, want.Spec.Ports
		_, err = services.Update(ctx, next, metav1.UpdateOptions{})
		return err
	})
	return APIError("apply service "+f.Name, err)
}

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
