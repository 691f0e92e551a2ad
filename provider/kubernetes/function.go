package kubernetes

import (
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"

	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
)

// Function is a validated FunctionDeployment turned into what both engines deploy: object metadata and a pod spec
// with one function container (index 0). The kubernetes backend wraps it in a Deployment and a Service, the knative
// backend in a Knative Service.
type Function struct {
	Name      string
	Namespace string
	// Labels go on the pods: faas_function, app, controller and the function's own labels.
	Labels map[string]string
	// Annotations go on the objects and the pods: the function's annotations plus prometheus.io.scrape.
	Annotations map[string]string
	// PodSpec runs the function container, with the GPU injection for GPU functions.
	PodSpec corev1.PodSpec
	// GPU is the function's GPU requirement; nil for a CPU function.
	GPU *pool.FunctionSpec
	// MinScale and MaxScale come from com.openfaas.scale.min/max; 0 means unset.
	MinScale, MaxScale int32
}

// invalid wraps provider.ErrInvalid with a message naming the field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", provider.ErrInvalid, field, fmt.Sprintf(format, args...))
}

// GPUFunctionName is the name a GPU function has in its node's gpuserver (gpuspec.FunctionName): the service in
// openfaas-fn, service.namespace elsewhere; the same name the provider's handlers register.
func GPUFunctionName(name, namespace string) string { return gpuspec.FunctionName(name, namespace) }

// Build validates fn and builds its pod spec. secrets holds the Kubernetes Secrets fn names, by name (see
// LookupSecrets); a secret fn names that is missing is an invalid request.
func (c Config) Build(fn types.FunctionDeployment, secrets map[string]*corev1.Secret) (Function, error) {
	out := Function{Name: fn.Service, Namespace: c.namespace(fn.Namespace)}
	if errs := validation.IsDNS1123Label(fn.Service); len(errs) > 0 {
		return out, invalid("service", "%q: %s", fn.Service, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(out.Namespace); len(errs) > 0 {
		return out, invalid("namespace", "%q: %s", out.Namespace, strings.Join(errs, "; "))
	}
	if strings.TrimSpace(fn.Image) == "" {
		return out, invalid("image", "empty")
	}

	var userLabels, userAnnotations map[string]string
	if fn.Labels != nil {
		userLabels = *fn.Labels
	}
	if fn.Annotations != nil {
		userAnnotations = *fn.Annotations
	}
	out.Labels = map[string]string{}
	for k, v := range userLabels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return out, invalid("labels", "key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return out, invalid("labels."+k, "value %q: %s", v, strings.Join(errs, "; "))
		}
		out.Labels[k] = v
	}
	out.Labels[LabelFunction] = fn.Service
	out.Labels[LabelApp] = fn.Service
	out.Labels[LabelController] = fn.Service

	out.Annotations = map[string]string{}
	for k, v := range userAnnotations {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return out, invalid("annotations", "key %q: %s", k, strings.Join(errs, "; "))
		}
		out.Annotations[k] = v
	}
	if _, ok := out.Annotations[AnnotationPrometheusScrape]; !ok {
		out.Annotations[AnnotationPrometheusScrape] = "false"
	}

	var err error
	if out.MinScale, err = scaleLabel(userLabels, LabelScaleMin); err != nil {
		return out, err
	}
	if out.MaxScale, err = scaleLabel(userLabels, LabelScaleMax); err != nil {
		return out, err
	}
	if out.MaxScale > 0 && out.MinScale > out.MaxScale {
		return out, invalid("labels."+LabelScaleMin, "%d is above %s %d", out.MinScale, LabelScaleMax, out.MaxScale)
	}

	gpu, isGPU, err := gpuspec.Parse(userAnnotations, GPUFunctionName(fn.Service, out.Namespace))
	if err != nil {
		return out, err // wraps provider.ErrInvalid and names the annotation
	}
	if isGPU {
		if err := gpu.Validate(); err != nil { // fills the defaults: percentile 98, isolation shared
			return out, fmt.Errorf("%w: annotations: %w", provider.ErrInvalid, err)
		}
		out.GPU = &gpu
	}

	resources, err := buildResources(fn, out.GPU)
	if err != nil {
		return out, err
	}
	selector, err := buildNodeSelector(fn.Constraints)
	if err != nil {
		return out, err
	}

	readOnly := fn.ReadOnlyRootFilesystem
	container := corev1.Container{
		Name:  fn.Service,
		Image: fn.Image,
		Ports: []corev1.ContainerPort{{
			Name: "http", ContainerPort: c.HTTPPort, Protocol: corev1.ProtocolTCP,
		}},
		Env:             buildEnv(fn),
		Resources:       resources,
		ImagePullPolicy: c.ImagePullPolicy,
		SecurityContext: c.containerSecurity(readOnly),
	}
	if c.HTTPProbe {
		container.ReadinessProbe = c.probe(2)
		container.LivenessProbe = c.probe(2)
	}
	serviceLinks := false
	out.PodSpec = corev1.PodSpec{
		Containers:         []corev1.Container{container},
		NodeSelector:       selector,
		RestartPolicy:      corev1.RestartPolicyAlways,
		DNSPolicy:          corev1.DNSClusterFirst,
		EnableServiceLinks: &serviceLinks,
		ServiceAccountName: out.Annotations[AnnotationServiceAccount],
	}
	if readOnly {
		// A read-only root file system still gets a writable /tmp, as in faas-netes.
		out.PodSpec.Volumes = append(out.PodSpec.Volumes, corev1.Volume{
			Name: tmpVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
		})
		out.PodSpec.Containers[0].VolumeMounts = append(out.PodSpec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: tmpVolume, MountPath: "/tmp"})
	}
	if err := addSecrets(&out.PodSpec, fn.Service, fn.Secrets, secrets); err != nil {
		return out, err
	}
	if out.GPU != nil {
		if err := c.GPU.inject(&out.PodSpec, *out.GPU, c.containerSecurity(true)); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (c Config) probe(period int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/_/health", Port: intstr.FromInt32(c.HTTPPort), Scheme: corev1.URISchemeHTTP,
		}},
		TimeoutSeconds:   1,
		PeriodSeconds:    period,
		SuccessThreshold: 1,
		FailureThreshold: 3,
	}
}

// scaleLabel reads com.openfaas.scale.min or max: a non-negative integer, or absent (0).
func scaleLabel(labels map[string]string, key string) (int32, error) {
	v, ok := labels[key]
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 {
		return 0, invalid("labels."+key, "%q is not a non-negative integer", v)
	}
	return int32(n), nil
}

// buildEnv returns fprocess and the function's environment, sorted by name.
func buildEnv(fn types.FunctionDeployment) []corev1.EnvVar {
	env := make([]corev1.EnvVar, 0, len(fn.EnvVars)+1)
	if fn.EnvProcess != "" {
		env = append(env, corev1.EnvVar{Name: EnvProcess, Value: fn.EnvProcess})
	}
	for _, k := range sortedKeys(fn.EnvVars) {
		if k == EnvProcess && fn.EnvProcess != "" {
			continue
		}
		env = append(env, corev1.EnvVar{Name: k, Value: fn.EnvVars[k]})
	}
	sort.SliceStable(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	return env
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range maps.Keys(m) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// buildResources parses requests and limits. A GPU function requests no nvidia.com/gpu; its memory request is raised
// to cover its model image (the GPU memory quota), and a memory limit below that is refused.
func buildResources(fn types.FunctionDeployment, gpu *pool.FunctionSpec) (corev1.ResourceRequirements, error) {
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	parse := func(list corev1.ResourceList, name corev1.ResourceName, field, v string) error {
		if v == "" {
			return nil
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			return invalid(field, "%q is not a quantity", v)
		}
		list[name] = q
		return nil
	}
	if r := fn.Requests; r != nil {
		if err := parse(res.Requests, corev1.ResourceMemory, "requests.memory", r.Memory); err != nil {
			return res, err
		}
		if err := parse(res.Requests, corev1.ResourceCPU, "requests.cpu", r.CPU); err != nil {
			return res, err
		}
	}
	if l := fn.Limits; l != nil {
		if err := parse(res.Limits, corev1.ResourceMemory, "limits.memory", l.Memory); err != nil {
			return res, err
		}
		if err := parse(res.Limits, corev1.ResourceCPU, "limits.cpu", l.CPU); err != nil {
			return res, err
		}
		if gpu == nil {
			// A CPU function may still ask for whole GPUs through the device plugin, as with faas-netes.
			if err := parse(res.Limits, "nvidia.com/gpu", "limits.nvidia.com/gpu", l.NvidiaGPU); err != nil {
				return res, err
			}
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceMemory, corev1.ResourceCPU} {
		req, hasReq := res.Requests[name]
		lim, hasLim := res.Limits[name]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			return res, invalid("requests."+string(name), "%s is above limits.%s %s", req.String(), name, lim.String())
		}
	}
	if gpu != nil {
		quota := resource.NewQuantity(int64(gpu.MemoryBytes), resource.BinarySI)
		if req, ok := res.Requests[corev1.ResourceMemory]; !ok || req.Cmp(*quota) < 0 {
			res.Requests[corev1.ResourceMemory] = *quota
		}
		if lim, ok := res.Limits[corev1.ResourceMemory]; ok && lim.Cmp(*quota) < 0 {
			return res, invalid("limits.memory", "%s is below the GPU memory quota %s (annotation %s)",
				lim.String(), quota.String(), "com.openfaas.gpu.memory")
		}
	}
	if len(res.Requests) == 0 {
		res.Requests = nil
	}
	if len(res.Limits) == 0 {
		res.Limits = nil
	}
	return res, nil
}

// buildNodeSelector turns constraints ("key=value" or "key == value") into a node selector.
func buildNodeSelector(constraints []string) (map[string]string, error) {
	if len(constraints) == 0 {
		return nil, nil
	}
	sel := map[string]string{}
	for _, c := range constraints {
		k, v, ok := strings.Cut(strings.Replace(c, "==", "=", 1), "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			return nil, invalid("constraints", "%q is not key=value with a label key and value", c)
		}
		sel[k] = v
	}
	return sel, nil
}

// addSecrets projects the named secrets into one volume mounted at SecretsMountPath; docker config secrets become
// image pull secrets instead, as in faas-netes.
func addSecrets(spec *corev1.PodSpec, function string, names []string, secrets map[string]*corev1.Secret) error {
	var sources []corev1.VolumeProjection
	for _, name := range names {
		s, ok := secrets[name]
		if !ok || s == nil {
			return invalid("secrets", "secret %q does not exist in the function's namespace", name)
		}
		switch s.Type {
		case corev1.SecretTypeDockercfg, corev1.SecretTypeDockerConfigJson:
			spec.ImagePullSecrets = append(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
		default:
			keys := make([]string, 0, len(s.Data)+len(s.StringData))
			for k := range s.Data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			items := make([]corev1.KeyToPath, 0, len(keys))
			for _, k := range keys {
				items = append(items, corev1.KeyToPath{Key: k, Path: k})
			}
			sources = append(sources, corev1.VolumeProjection{Secret: &corev1.SecretProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: name}, Items: items,
			}})
		}
	}
	if len(sources) == 0 {
		return nil
	}
	volume := function + secretsVolumeSuffix
	spec.Volumes = append(spec.Volumes, corev1.Volume{
		Name:         volume,
		VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}},
	})
	spec.Containers[0].VolumeMounts = append(spec.Containers[0].VolumeMounts, corev1.VolumeMount{
		Name: volume, ReadOnly: true, MountPath: SecretsMountPath,
	})
	return nil
}

// secretNames reads back the secrets a pod spec uses: the inverse of addSecrets.
func secretNames(function string, spec corev1.PodSpec) []string {
	var names []string
	for _, s := range spec.ImagePullSecrets {
		names = append(names, s.Name)
	}
	for _, v := range spec.Volumes {
		if v.Name != function+secretsVolumeSuffix || v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.Secret != nil {
				names = append(names, src.Secret.Name)
			}
		}
	}
	sort.Strings(names)
	return names
}
