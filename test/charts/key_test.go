package charts

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestGPUServersAndProviderShareTheKey: every gpuserver and the provider mount the same key Secret (the provider
// issues registration tickets the gpuservers accept), and the provider gives GPU pods the sockets' group.
func TestGPUServersAndProviderShareTheKey(t *testing.T) {
	objs := decodeAll(t, render(t, "provider.enabled=true"))
	ds := find[*appsv1.DaemonSet](t, objs, "DaemonSet", "faas-gpu-gpuserver")
	prov := find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-provider")
	secretOf := func(spec corev1.PodSpec) string {
		for _, v := range spec.Volumes {
			if v.Secret != nil && (v.Name == "key" || v.Name == "gpuserver-key") {
				return v.Secret.SecretName
			}
		}
		return ""
	}
	if a, b := secretOf(ds.Spec.Template.Spec), secretOf(prov.Spec.Template.Spec); a == "" || a != b {
		t.Errorf("gpuserver key Secret %q, provider's %q: want one shared Secret", a, b)
	}
	find[*corev1.Secret](t, objs, "Secret", "faas-gpu-gpuserver-key")
	env := map[string]string{}
	for _, e := range prov.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["FAAS_GPU_GPUSERVER_KEY_FILE"] == "" || env["FAAS_GPU_SOCKET_GROUP"] != "2042" {
		t.Errorf("provider env %v: want the key file and socket group 2042", env)
	}
	own := decodeAll(t, render(t, "provider.enabled=true,gpuserver.keySecret=my-key"))
	for _, o := range own {
		if o.Kind == "Secret" && o.Name == "faas-gpu-gpuserver-key" {
			t.Error("a key Secret generated although gpuserver.keySecret is set")
		}
	}
	if s := secretOf(find[*appsv1.Deployment](t, own, "Deployment", "faas-gpu-provider").Spec.Template.Spec); s != "my-key" {
		t.Errorf("provider key Secret %q, want my-key", s)
	}
}
