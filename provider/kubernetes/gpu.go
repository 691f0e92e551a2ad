package kubernetes

import (
	"fmt"
	"path"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
)

// inject prepares a GPU function's pod: no nvidia.com/gpu is requested; instead the pod
//   - is pinned to GPU nodes by a required node affinity (and tolerates their taint),
//   - gets the shim copied by an init container from the faas-gpu image into an emptyDir,
//   - mounts the node's gpuserver socket directory (hostPath, at the same path, read-only),
//   - has the shim's environment: FAAS_GPU, FAAS_GPU_FUNCTION, the two sockets, LD_LIBRARY_PATH, and the GPU
//     requirements so that the function registers itself with its node's gpuserver.
//
// The host memory request covering the model image is set by buildResources.
func (g GPUConfig) inject(spec *corev1.PodSpec, gpu pool.FunctionSpec, security *corev1.SecurityContext) error {
	term := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
		Key: g.NodeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{g.NodeLabelValue},
	}}}
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	req := na.RequiredDuringSchedulingIgnoredDuringExecution
	req.NodeSelectorTerms = append(req.NodeSelectorTerms, term)
	if g.Toleration != "" {
		spec.Tolerations = append(spec.Tolerations, corev1.Toleration{
			Key: g.Toleration, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
		})
	}

	hostPathType := corev1.HostPathDirectoryOrCreate
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: ShimVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: SocketVolume, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: g.SocketDir, Type: &hostPathType,
		}}},
	)
	spec.InitContainers = append(spec.InitContainers, corev1.Container{
		Name:            ShimInitContainer,
		Image:           g.ShimImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"cp", g.ShimPath, path.Join(ShimMountPath, ShimLibrary)},
		VolumeMounts:    []corev1.VolumeMount{{Name: ShimVolume, MountPath: ShimMountPath}},
		SecurityContext: security,
	})

	c := &spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: ShimVolume, MountPath: ShimMountPath, ReadOnly: true},
		// Read-only: the function connects to the sockets (connect needs no write access to the mount) but
		// cannot remove, rename or replace them, nor create anything beside them.
		corev1.VolumeMount{Name: SocketVolume, MountPath: g.SocketDir, ReadOnly: true},
	)
	gpuEnv := []corev1.EnvVar{
		{Name: contract.EnvGPU, Value: "1"},
		{Name: contract.EnvFunction, Value: gpu.Name},
		{Name: contract.EnvSocket, Value: path.Join(g.SocketDir, g.ControlSocket)},
		{Name: contract.EnvRemotingSocket, Value: path.Join(g.SocketDir, g.RemotingSocket)},
		{Name: EnvLDLibraryPath, Value: ShimMountPath},
		{Name: contract.EnvMemoryBytes, Value: strconv.FormatUint(gpu.MemoryBytes, 10)},
		{Name: contract.EnvSLO, Value: gpu.SLO.String()},
		{Name: contract.EnvPercentile, Value: strconv.FormatFloat(gpu.Percentile, 'g', -1, 64)},
		{Name: contract.EnvIsolation, Value: gpu.Isolation},
		{Name: contract.EnvSelfRegister, Value: "1"},
	}
	if gpu.Scratch != "" {
		gpuEnv = append(gpuEnv, corev1.EnvVar{Name: contract.EnvScratch, Value: gpu.Scratch})
	}
	if gpu.Model != "" {
		gpuEnv = append(gpuEnv, corev1.EnvVar{Name: contract.EnvModel, Value: gpu.Model})
	}
	if len(g.RegistrationKey) != 0 {
		ticket, err := g.RegistrationKey.Ticket(gpu)
		if err != nil {
			return fmt.Errorf("%w: GPU spec of %s: %v", provider.ErrInvalid, gpu.Name, err)
		}
		gpuEnv = append(gpuEnv, corev1.EnvVar{Name: contract.EnvRegistrationTicket, Value: ticket})
	}
	if g.SocketGroup != 0 {
		if spec.SecurityContext == nil {
			spec.SecurityContext = &corev1.PodSecurityContext{}
		}
		spec.SecurityContext.SupplementalGroups = append(spec.SecurityContext.SupplementalGroups, g.SocketGroup)
	}
	// The injected values win over a function's own variables of the same name.
	env := c.Env[:0]
	for _, e := range c.Env {
		if !isInjectedEnv(e.Name) {
			env = append(env, e)
		}
	}
	c.Env = append(env, gpuEnv...)
	return nil
}

// IsGPU reports whether a pod spec carries the GPU injection.
func IsGPU(spec corev1.PodSpec) bool {
	for _, v := range spec.Volumes {
		if v.Name == SocketVolume {
			return true
		}
	}
	return false
}
