package kubernetes

import (
	"fmt"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/provider"
)

// Defaults of Config; docs/kubernetes.md explains each.
const (
	DefaultHTTPPort        = 8080
	DefaultGPUNodeLabelKey = "faas-gpu.dev/gpu-node"
	DefaultGPUNodeLabelVal = "true"
	DefaultGPUToleration   = "nvidia.com/gpu"
	DefaultShimImage       = "ghcr.io/faas-gpu/faas-gpu:latest"
	DefaultShimPath        = "/usr/local/lib/faas-gpu/libcuda.so.1"
	DefaultSocketDir       = "/var/run/faas-gpu"
	DefaultControlSocket   = "gpuserver.sock"
	DefaultRemotingSocket  = "remoting.sock"
	// DefaultRunAsUser is the user function containers run as: faas-netes' non-root id (its set_nonroot_user).
	DefaultRunAsUser = 12000
)

// Config says how functions are turned into Kubernetes objects. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// DefaultNamespace is used when a request names no namespace.
	DefaultNamespace string
	// HTTPPort is the port function containers listen on (of-watchdog: 8080).
	HTTPPort int32
	// ImagePullPolicy of function containers: Always, IfNotPresent or Never.
	ImagePullPolicy corev1.PullPolicy
	// HTTPProbe adds readiness and liveness probes on GET /_/health of HTTPPort.
	HTTPProbe bool
	// RunAsUser is the user id function containers (and the shim's init container) run as, with runAsNonRoot;
	// 0 leaves the image's user. Either way function containers run without capabilities, without privilege
	// escalation and with the runtime's default seccomp profile (the Pod Security Standard "restricted" asks for
	// these; a GPU function's read-only hostPath socket directory is what keeps it at "privileged").
	RunAsUser int64
	// GPU says how GPU functions reach the node's gpuserver.
	GPU GPUConfig
	// GPUServers, when set ("namespace/name" of the gpuservers' headless Service, whose endpoints run one per GPU
	// node), makes Resolve route each request to the replica whose node suits it best now - the function's model
	// on a GPU there, the shortest queue, not shedding it - from the pool status each gpuserver reports (polled
	// every NodeReportEvery over the Service's port, with the administrator's credential derived from
	// GPU.RegistrationKey: the gpuserver answers 401 without one); round robin where reports are missing or older
	// than NodeReportMaxAge. Empty: round robin.
	GPUServers       string
	NodeReportEvery  time.Duration
	NodeReportMaxAge time.Duration
}

// GPUConfig is the injection applied to GPU functions.
type GPUConfig struct {
	// NodeLabelKey and NodeLabelValue select GPU nodes (required node affinity); the gpuserver DaemonSet runs there.
	NodeLabelKey   string
	NodeLabelValue string
	// Toleration is a taint key GPU function pods tolerate (Exists, NoSchedule); empty adds none.
	Toleration string
	// ShimImage is the image the init container copies the shim from (the faas-gpu image).
	ShimImage string
	// ShimPath is the shim's path inside ShimImage.
	ShimPath string
	// SocketDir is the host directory holding the gpuserver's sockets; it is mounted at the same path.
	SocketDir string
	// ControlSocket and RemotingSocket are the socket file names in SocketDir.
	ControlSocket  string
	RemotingSocket string
	// RegistrationKey is the gpuservers' key: each GPU function pod gets the ticket that registers exactly its spec
	// (FAAS_GPU_REGISTRATION_TICKET). Without it pods cannot register themselves.
	RegistrationKey auth.Key
	// SocketGroup is the group of the gpuserver's sockets (the gpuserver's -socket-group); GPU function pods get it
	// as a supplementary group. 0 adds none.
	SocketGroup int64
}

// DefaultConfig returns the settings documented in docs/kubernetes.md.
func DefaultConfig() Config {
	return Config{
		DefaultNamespace: provider.DefaultNamespace,
		HTTPPort:         DefaultHTTPPort,
		ImagePullPolicy:  corev1.PullAlways,
		HTTPProbe:        true,
		RunAsUser:        DefaultRunAsUser,
		GPU: GPUConfig{
			NodeLabelKey:   DefaultGPUNodeLabelKey,
			NodeLabelValue: DefaultGPUNodeLabelVal,
			Toleration:     DefaultGPUToleration,
			ShimImage:      DefaultShimImage,
			ShimPath:       DefaultShimPath,
			SocketDir:      DefaultSocketDir,
			ControlSocket:  DefaultControlSocket,
			RemotingSocket: DefaultRemotingSocket,
		},
	}
}

// Validate checks every setting; the error names the first bad one.
func (c Config) Validate() error {
	bad := func(field, msg string) error { return fmt.Errorf("%w: %s: %s", provider.ErrInvalid, field, msg) }
	if errs := validation.IsDNS1123Label(c.DefaultNamespace); len(errs) > 0 {
		return bad("DefaultNamespace", strings.Join(errs, "; "))
	}
	if c.HTTPPort < 1 || c.HTTPPort > 65535 {
		return bad("HTTPPort", fmt.Sprintf("%d is not a port", c.HTTPPort))
	}
	if c.RunAsUser < 0 {
		return bad("RunAsUser", fmt.Sprintf("%d is not a user id (0: the image's user)", c.RunAsUser))
	}
	switch c.ImagePullPolicy {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return bad("ImagePullPolicy", fmt.Sprintf("%q is not Always, IfNotPresent or Never", c.ImagePullPolicy))
	}
	g := c.GPU
	if errs := validation.IsQualifiedName(g.NodeLabelKey); len(errs) > 0 {
		return bad("GPU.NodeLabelKey", strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(g.NodeLabelValue); len(errs) > 0 {
		return bad("GPU.NodeLabelValue", strings.Join(errs, "; "))
	}
	if g.Toleration != "" {
		if errs := validation.IsQualifiedName(g.Toleration); len(errs) > 0 {
			return bad("GPU.Toleration", strings.Join(errs, "; "))
		}
	}
	if g.ShimImage == "" {
		return bad("GPU.ShimImage", "empty")
	}
	for _, s := range [][2]string{{"GPU.ShimPath", g.ShimPath}, {"GPU.SocketDir", g.SocketDir}} {
		if !path.IsAbs(s[1]) || path.Clean(s[1]) != s[1] {
			return bad(s[0], fmt.Sprintf("%q is not a clean absolute path", s[1]))
		}
	}
	for _, s := range [][2]string{{"GPU.ControlSocket", g.ControlSocket}, {"GPU.RemotingSocket", g.RemotingSocket}} {
		if s[1] == "" || strings.Contains(s[1], "/") {
			return bad(s[0], fmt.Sprintf("%q is not a file name", s[1]))
		}
	}
	return nil
}

func (c Config) namespace(ns string) string {
	if ns == "" {
		return c.DefaultNamespace
	}
	return ns
}

// containerSecurity is the security context of function containers and the shim's init container: no privilege
// escalation, no capabilities, the runtime's seccomp profile, and RunAsUser (non-root) when set.
func (c Config) containerSecurity(readOnlyRoot bool) *corev1.SecurityContext {
	noEscalation := false
	sc := &corev1.SecurityContext{
		ReadOnlyRootFilesystem:   &readOnlyRoot,
		AllowPrivilegeEscalation: &noEscalation,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if c.RunAsUser > 0 {
		nonRoot, uid := true, c.RunAsUser
		sc.RunAsNonRoot, sc.RunAsUser = &nonRoot, &uid
	}
	return sc
}
