package harness

import (
	"strings"
	"testing"
)

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", "/plain": "/plain", `/tab\011x`: "/tab\tx"} {
		if got := unescapeMount(in); got != want {
			t.Errorf("%q -> %q; want %q", in, got, want)
		}
	}
}

func TestSkipSysctl(t *testing.T) {
	for key, skip := range map[string]bool{
		"kernel/panic": false, "kernel/ns_last_pid": true, "kernel/random/uuid": true,
		"net/ipv4/conf/all/forwarding": false, "net/ipv4/conf/lo/route_localnet": false,
		"net/ipv4/conf/veth1234/forwarding": true, "net/bridge/bridge-nf-call-iptables": false,
	} {
		if got := skipSysctl(key); got != skip {
			t.Errorf("skipSysctl(%s) = %t; want %t", key, got, skip)
		}
	}
}

// TestIsOurs: only mounts under the run's directories and containerd's network namespaces are the cluster's.
func TestIsOurs(t *testing.T) {
	s := &hostState{Prefixes: []string{"/tmp/run", "/cache/containerd"}}
	for m, ours := range map[string]bool{
		"/tmp/run/kubelet/pods/x": true, "/tmp/run": true, "/tmp/runner": false, "/cache/containerd/x": true,
		"/run/netns/cni-1234": true, "/run/netns": true, "/run/netns/other": false, "/proc": false,
	} {
		if got := s.isOurs(m); got != ours {
			t.Errorf("isOurs(%s) = %t; want %t", m, got, ours)
		}
	}
}

// TestSnapshotReadsTheHost: the snapshot sees this machine's mounts and kernel parameters.
func TestSnapshotReadsTheHost(t *testing.T) {
	m, err := mountPoints()
	if err != nil || len(m) == 0 {
		t.Fatalf("mount points: %v %v", m, err)
	}
	var root bool
	for _, p := range m {
		root = root || p == "/"
	}
	if !root {
		t.Errorf("no / in %v", m)
	}
	sys := snapshotSysctls()
	if v, ok := sys["kernel/panic"]; !ok || strings.TrimSpace(v) == "" {
		t.Errorf("kernel/panic not read (%d parameters)", len(sys))
	}
}
