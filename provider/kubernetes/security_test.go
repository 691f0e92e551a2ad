package kubernetes

import (
	"testing"

	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
)

// TestFunctionPodsRunNonRootWithReadOnlySockets: every container of a function pod (the function's and the shim's
// init container) runs as the non-root user (DefaultRunAsUser), without capabilities, privilege escalation or an
// unconfined seccomp profile, and a GPU function mounts the gpuserver's socket directory read-only; RunAsUser 0
// keeps the image's user.
func TestFunctionPodsRunNonRootWithReadOnlySockets(t *testing.T) {
	cfg := DefaultConfig()
	for _, fn := range []types.FunctionDeployment{gpuFunction(), {Service: "echo", Image: "echo:1"}} {
		f, err := cfg.Build(fn, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range append(f.PodSpec.InitContainers, f.PodSpec.Containers...) {
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Fatalf("%s/%s: no security context", fn.Service, c.Name)
			case sc.RunAsUser == nil || *sc.RunAsUser != DefaultRunAsUser || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
				t.Errorf("%s/%s: runs as %v (non-root %v), want %d", fn.Service, c.Name, sc.RunAsUser, sc.RunAsNonRoot, DefaultRunAsUser)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s/%s: privilege escalation allowed", fn.Service, c.Name)
			case sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) != 0:
				t.Errorf("%s/%s: capabilities %+v, want all dropped", fn.Service, c.Name, sc.Capabilities)
			case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Errorf("%s/%s: seccomp %+v", fn.Service, c.Name, sc.SeccompProfile)
			}
		}
		for _, m := range f.PodSpec.Containers[0].VolumeMounts {
			if m.Name == SocketVolume && !m.ReadOnly {
				t.Errorf("%s: the socket directory is mounted writable", fn.Service)
			}
		}
	}
	cfg.RunAsUser = 0
	f, err := cfg.Build(gpuFunction(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if sc := f.PodSpec.Containers[0].SecurityContext; sc.RunAsUser != nil || sc.RunAsNonRoot != nil {
		t.Errorf("RunAsUser 0: %+v, want the image's user", sc)
	}
	cfg.RunAsUser = -1
	if err := cfg.Validate(); err == nil {
		t.Error("RunAsUser -1 is valid")
	}
}
