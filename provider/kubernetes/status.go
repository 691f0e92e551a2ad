package kubernetes

import (
	"context"
	"fmt"
	"sort"

	"github.com/openfaas/faas-provider/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/provider"
)

// List returns every function (Deployment labelled faas_function) of a namespace.
func (b *Backend) List(ctx context.Context, namespace string) ([]types.FunctionStatus, error) {
	ns := b.cfg.namespace(namespace)
	deps, err := b.client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelFunction})
	if err != nil {
		return nil, APIError("list deployments in "+ns, err)
	}
	if len(deps.Items) > 0 {
		b.endpoints.ensure(ns) // a namespace holding functions: cache its endpoints from now on
	}
	ready, err := b.readyEndpoints(ctx, ns, "")
	if err != nil {
		return nil, err
	}
	out := make([]types.FunctionStatus, 0, len(deps.Items))
	for _, d := range deps.Items {
		out = append(out, FunctionStatus(d, ready))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Status returns one function with its desired replicas (from the Deployment) and available replicas (its ready
// endpoints, or the Deployment's available replicas before any EndpointSlice exists).
func (b *Backend) Status(ctx context.Context, namespace, name string) (types.FunctionStatus, error) {
	ns, err := b.target(namespace, name)
	if err != nil {
		return types.FunctionStatus{}, err
	}
	d, err := b.client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return types.FunctionStatus{}, APIError("get deployment "+name, err)
	}
	if _, ok := d.Labels[LabelFunction]; !ok {
		return types.FunctionStatus{}, fmt.Errorf("deployment %s.%s is not a function: %w", name, ns, provider.ErrNotFound)
	}
	b.endpoints.ensure(ns)
	ready, err := b.readyEndpoints(ctx, ns, name)
	if err != nil {
		return types.FunctionStatus{}, err
	}
	return FunctionStatus(*d, ready), nil
}

// readyEndpoints counts the ready endpoints of each Service of a namespace (or of one Service) by Service name,
// from the endpoint cache when it has synced (see endpointSlices). A Service with slices but no ready endpoint maps
// to 0; a Service without slices is absent.
func (b *Backend) readyEndpoints(ctx context.Context, ns, service string) (map[string]int, error) {
	slices, err := b.endpointSlices(ctx, ns, service)
	if err != nil {
		return nil, err
	}
	return countReady(slices), nil
}

func endpointReady(e discoveryv1.Endpoint) bool {
	return e.Conditions.Ready == nil || *e.Conditions.Ready
}

// FunctionStatus reads a function Deployment back into the faas-provider form; ready holds the ready endpoints by
// Service name (see Status).
func FunctionStatus(d appsv1.Deployment, ready map[string]int) types.FunctionStatus {
	var replicas uint64
	if d.Spec.Replicas != nil {
		replicas = uint64(*d.Spec.Replicas)
	}
	available := uint64(d.Status.AvailableReplicas)
	if n, ok := ready[d.Name]; ok {
		available = uint64(n)
	}
	st := ReadPodSpec(d.Name, d.Spec.Template)
	st.Namespace = d.Namespace
	st.Replicas = replicas
	st.AvailableReplicas = available
	st.CreatedAt = d.CreationTimestamp.Time
	return st
}

// ReadPodSpec reads the function-facing part of a pod template: image, environment, labels, annotations, secrets
// and resources. The injected GPU environment is left out, so that what a user deployed is what they read back.
func ReadPodSpec(name string, t corev1.PodTemplateSpec) types.FunctionStatus {
	st := types.FunctionStatus{Name: name}
	labels := copyMap(t.Labels)
	annotations := copyMap(t.Annotations)
	for _, k := range []string{LabelApp, LabelController} {
		if labels[k] == name {
			delete(labels, k)
		}
	}
	st.Labels = &labels
	st.Annotations = &annotations
	st.Secrets = secretNames(name, t.Spec)
	if len(t.Spec.Containers) == 0 {
		return st
	}
	c := t.Spec.Containers[0]
	st.Image = c.Image
	if c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil {
		st.ReadOnlyRootFilesystem = *c.SecurityContext.ReadOnlyRootFilesystem
	}
	gpu := IsGPU(t.Spec)
	env := map[string]string{}
	for _, e := range c.Env {
		if gpu && isInjectedEnv(e.Name) {
			continue
		}
		if e.Name == EnvProcess {
			st.EnvProcess = e.Value
		}
		env[e.Name] = e.Value
	}
	if len(env) > 0 {
		st.EnvVars = env
	}
	st.Requests = readResources(c.Resources.Requests)
	st.Limits = readResources(c.Resources.Limits)
	for k, v := range t.Spec.NodeSelector {
		st.Constraints = append(st.Constraints, k+"="+v)
	}
	sort.Strings(st.Constraints)
	return st
}

// isInjectedEnv reports whether an environment variable is one the GPU injection sets.
func isInjectedEnv(name string) bool {
	switch name {
	case contract.EnvGPU, contract.EnvFunction, contract.EnvSocket, contract.EnvRemotingSocket, EnvLDLibraryPath,
		contract.EnvMemoryBytes, contract.EnvSLO, contract.EnvPercentile, contract.EnvIsolation, contract.EnvScratch, contract.EnvModel, contract.EnvSelfRegister, contract.EnvRegistrationTicket:
		return true
	}
	return false
}

func readResources(l corev1.ResourceList) *types.FunctionResources {
	if len(l) == 0 {
		return nil
	}
	r := &types.FunctionResources{}
	if q, ok := l[corev1.ResourceMemory]; ok {
		r.Memory = q.String()
	}
	if q, ok := l[corev1.ResourceCPU]; ok {
		r.CPU = q.String()
	}
	if q, ok := l["nvidia.com/gpu"]; ok {
		r.NvidiaGPU = q.String()
	}
	return r
}
