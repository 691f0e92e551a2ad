package charts

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// ingressPorts lists "port<-peers" of a NetworkPolicy's ingress rules, peers as "any" or their component labels
// and namespace selectors.
func ingressPorts(np *networkingv1.NetworkPolicy) map[int32][]string {
	out := map[int32][]string{}
	for _, r := range np.Spec.Ingress {
		var peers []string
		for _, f := range r.From {
			switch {
			case f.PodSelector != nil:
				peers = append(peers, "pods:"+f.PodSelector.MatchLabels["app.kubernetes.io/component"])
			case f.NamespaceSelector != nil:
				peers = append(peers, "namespaces")
			}
		}
		if len(r.From) == 0 {
			peers = []string{"any"}
		}
		for _, p := range r.Ports {
			out[p.Port.IntVal] = append(out[p.Port.IntVal], peers...)
		}
	}
	return out
}

// TestNetworkPolicies: by default the gpuserver's TCP port admits the queue worker and the provider only, NATS's client port the
// queue worker only and nothing reaches port 8222, the front door and the provider's API admit every peer on their
// port and nothing else; metricsFrom opens the metrics ports (and NATS monitoring, when served) to its peers.
func TestNetworkPolicies(t *testing.T) {
	objs := decodeAll(t, render(t, "provider.enabled=true"))
	for name, want := range map[string]map[int32][]string{
		"faas-gpu-gpuserver":    {8090: {"pods:queue-worker", "pods:provider"}},
		"faas-gpu-nats":         {4222: {"pods:queue-worker"}},
		"faas-gpu-queue-worker": {8081: {"any"}},
		"faas-gpu-provider":     {8080: {"any"}},
	} {
		np := find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", name)
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("%s: policy types %v", name, np.Spec.PolicyTypes)
		}
		component := strings.TrimPrefix(name, "faas-gpu-")
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"] != component {
			t.Errorf("%s selects %v", name, np.Spec.PodSelector.MatchLabels)
		}
		got := ingressPorts(np)
		if len(got) != len(want) {
			t.Errorf("%s admits %v, want %v", name, got, want)
		}
		for port, peers := range want {
			if !slices.Equal(got[port], peers) {
				t.Errorf("%s port %d admits %v, want %v", name, port, got[port], peers)
			}
		}
	}
	objs = decodeAll(t, render(t, "nats.monitoring=true",
		"networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring"))
	nats := ingressPorts(find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "faas-gpu-nats"))
	gs := ingressPorts(find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "faas-gpu-gpuserver"))
	if !slices.Equal(nats[8222], []string{"namespaces"}) || !slices.Equal(gs[8090], []string{"pods:queue-worker", "namespaces"}) {
		t.Errorf("with metricsFrom: NATS %v, gpuserver %v", nats, gs)
	}
	for _, o := range decodeAll(t, render(t, "networkPolicy.enabled=false")) {
		if o.Kind == "NetworkPolicy" {
			t.Errorf("networkPolicy.enabled=false still renders %s", o.Name)
		}
	}
}

// TestNATSMonitoringOff: NATS serves no HTTP monitoring by default (no --http_port, no 8222 in the pod or the
// Service), is ready when its client port is, bounds its connections and its authentication time, and runs as a
// non-root user.
func TestNATSMonitoringOff(t *testing.T) {
	raw := render(t)
	objs := decodeAll(t, raw)
	sts := find[*appsv1.StatefulSet](t, objs, "StatefulSet", "faas-gpu-nats")
	c := sts.Spec.Template.Spec.Containers[0]
	if slices.Contains(c.Args, "--http_port") || slices.Contains(c.Args, "-m") {
		t.Errorf("NATS args %v serve monitoring", c.Args)
	}
	for _, p := range c.Ports {
		if p.ContainerPort == 8222 {
			t.Error("NATS container exposes 8222")
		}
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.TCPSocket == nil {
		t.Errorf("NATS readiness %+v, want the client port", c.ReadinessProbe)
	}
	svc := find[*corev1.Service](t, objs, "Service", "faas-gpu-nats")
	for _, p := range svc.Spec.Ports {
		if p.Port == 8222 {
			t.Error("NATS Service exposes 8222")
		}
	}
	cm := find[*corev1.ConfigMap](t, objs, "ConfigMap", "faas-gpu-nats-config")
	if conf := cm.Data["nats.conf"]; !strings.Contains(conf, "max_connections: 1024") || !strings.Contains(conf, "timeout: 2") {
		t.Errorf("nats.conf does not bound connections and authentication time:\n%s", conf)
	}
	ps := sts.Spec.Template.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.FSGroup == nil || *ps.FSGroup != 1000 {
		t.Errorf("NATS pod security %+v", ps)
	}
	sts = find[*appsv1.StatefulSet](t, decodeAll(t, render(t, "nats.monitoring=true")), "StatefulSet", "faas-gpu-nats")
	if !slices.Contains(sts.Spec.Template.Spec.Containers[0].Args, "--http_port") {
		t.Error("nats.monitoring=true serves no monitoring")
	}
}

// TestProviderSecretsPerNamespace: with a ClusterRole, the provider gets no access to Secrets cluster-wide, only a
// Role (and binding) per namespace of provider.secretNamespaces (functionNamespace by default).
func TestProviderSecretsPerNamespace(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want []string
	}{
		{[]string{"provider.enabled=true", "provider.clusterRole=true"}, []string{"openfaas-fn"}},
		{[]string{"provider.enabled=true", "provider.clusterRole=true", "provider.secretNamespaces={team-a,team-b}"},
			[]string{"team-a", "team-b"}},
	} {
		objs := decodeAll(t, render(t, tc.sets...))
		cr := find[*rbacv1.ClusterRole](t, objs, "ClusterRole", "faas-gpu-provider")
		for _, r := range cr.Rules {
			if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "*") {
				t.Errorf("%v: the ClusterRole grants %v", tc.sets, r)
			}
		}
		var got []string
		for _, o := range objs {
			if o.Kind == "Role" && o.Name == "faas-gpu-provider-secrets" {
				role := o.Obj.(*rbacv1.Role)
				if !grants(role.Rules, "", "secrets", "create") || len(role.Rules) != 1 {
					t.Errorf("secrets role in %s: %+v", role.Namespace, role.Rules)
				}
				got = append(got, role.Namespace)
			}
			if o.Kind == "RoleBinding" && o.Name == "faas-gpu-provider-secrets" {
				rb := o.Obj.(*rbacv1.RoleBinding)
				if rb.Subjects[0].Name != "faas-gpu-provider" || rb.RoleRef.Kind != "Role" {
					t.Errorf("secrets binding %+v", rb)
				}
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: secrets roles in %v, want %v", tc.sets, got, tc.want)
		}
	}
	// Without a ClusterRole, the one Role in functionNamespace covers secrets there.
	objs := decodeAll(t, render(t, "provider.enabled=true"))
	role := find[*rbacv1.Role](t, objs, "Role", "faas-gpu-provider")
	if role.Namespace != "openfaas-fn" || !grants(role.Rules, "", "secrets", "get") {
		t.Errorf("provider role %+v", role)
	}
}

// TestControlPlanePodsAreRestricted: the queue worker, the provider and NATS meet the Pod Security Standard
// "restricted" (non-root, no privilege escalation, every capability dropped, RuntimeDefault seccomp); the provider
// tells the backend to run functions as 12000 (docs/kubernetes.md lists each pod's level).
func TestControlPlanePodsAreRestricted(t *testing.T) {
	objs := decodeAll(t, render(t, "provider.enabled=true"))
	pods := map[string]corev1.PodSpec{
		"queue worker": find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-queue-worker").Spec.Template.Spec,
		"provider":     find[*appsv1.Deployment](t, objs, "Deployment", "faas-gpu-provider").Spec.Template.Spec,
		"NATS":         find[*appsv1.StatefulSet](t, objs, "StatefulSet", "faas-gpu-nats").Spec.Template.Spec,
	}
	for name, spec := range pods {
		ps := spec.SecurityContext
		if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod seccomp %+v", name, ps)
		}
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (ps.RunAsNonRoot != nil && *ps.RunAsNonRoot)
			switch {
			case !nonRoot:
				t.Errorf("%s/%s may run as root", name, c.Name)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s/%s allows privilege escalation", name, c.Name)
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
				t.Errorf("%s/%s keeps capabilities %+v", name, c.Name, sc.Capabilities)
			}
		}
	}
	for _, e := range pods["provider"].Containers[0].Env {
		if e.Name == "FAAS_GPU_FUNCTION_RUN_AS_USER" && e.Value != "12000" {
			t.Errorf("function run-as user %q", e.Value)
		}
	}
}
