// Package harness brings up a single-node Kubernetes on this machine for the live cluster test and takes it down
// again: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd with a bridge CNI, kubelet,
// kube-proxy and CoreDNS, each a process (CoreDNS a pod) started from binaries built from pinned modules
// (build-bins.sh) and Debian's packages. Every change it makes to the host (an address on lo, iptables chains,
// sysctls, mounts, links, cgroups, directories) is recorded in a journal before it is made and undone by Down,
// also after a failure, an interrupt, or a run that was killed (the next run or `cluster down` reads the journal).
package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The cluster's fixed addresses. They come from ranges reserved for documentation and benchmarking (RFC 5737,
// RFC 2544), so nothing on the host or beyond it uses them.
const (
	NodeName    = "faas-gpu-node"
	NodeIP      = "198.51.100.1"
	PodCIDR     = "198.18.0.0/24"
	ServiceCIDR = "198.19.0.0/16"
	APIServerIP = "198.19.0.1"
	DNSIP       = "198.19.0.10"
	APIPort     = 6443
	etcdPort    = 32379
	etcdPeer    = 32380
	cniBridge   = "cni0"
	cgroupRoot  = "/faas-gpu-cluster"
	// GPUNodeLabel marks the node as a GPU node for the chart's gpuserver DaemonSet and the GPU functions.
	GPUNodeLabel = "faas-gpu.dev/gpu-node=true"
)

// Config says where the cluster's files are.
type Config struct {
	// RunDir holds this run's state (certificates, etcd, logs, kubelet, containerd state); wiped at start.
	RunDir string
	// ContainerdRoot holds containerd's content and snapshots; kept between runs so that images are reused.
	ContainerdRoot string
	// K8sBin is the directory of kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and
	// kubectl.
	K8sBin string
	// Etcd is the etcd binary.
	Etcd string
	// CNIBin is the directory of the CNI plugins (bridge, host-local, loopback, portmap).
	CNIBin string
	// HostDirs are host directories the cluster's pods use through hostPath (removed at the end when the run
	// created them).
	HostDirs []string
	// Log receives progress lines.
	Log io.Writer
}

// Cluster is a running cluster.
type Cluster struct {
	cfg     Config
	state   *hostState
	pki     *pki
	started time.Time
	// Kubeconfig is the admin kubeconfig.
	Kubeconfig string
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.cfg.Log, "[cluster %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.cfg.RunDir}, parts...)...)
}

func journalPath(runDir string) string { return filepath.Join(runDir, "journal.json") }

func (c *Cluster) saveJournal() error {
	b, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	tmp := journalPath(c.cfg.RunDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, journalPath(c.cfg.RunDir))
}

// Up starts the cluster and waits until the node is Ready and CoreDNS serves. On error the caller must still call
// Down.
func Up(ctx context.Context, cfg Config) (*Cluster, error) {
	c := &Cluster{cfg: cfg, started: time.Now()}
	if err := Down(cfg.RunDir, cfg.Log); err != nil {
		return nil, fmt.Errorf("cleaning up an earlier run: %w", err)
	}
	if err := os.RemoveAll(cfg.RunDir); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "etcd", "kubelet", "pod-logs", "containerd/state", "cni/net.d", "cni/ipam"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.ContainerdRoot, 0o711); err != nil {
		return nil, err
	}
	prefixes := []string{cfg.RunDir, cfg.ContainerdRoot}
	prefixes = append(prefixes, cfg.HostDirs...)
	st, err := snapshot(cfg.RunDir, cgroupRoot, prefixes)
	if err != nil {
		return nil, fmt.Errorf("snapshot of the host: %w", err)
	}
	c.state = st
	for _, d := range append([]string{"/run/netns"}, cfg.HostDirs...) {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			c.state.Created = append(c.state.Created, d)
		}
	}
	if err := c.saveJournal(); err != nil {
		return c, err
	}
	c.logf("run directory %s; host state saved in %s", cfg.RunDir, journalPath(cfg.RunDir))

	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"host network", c.hostNetwork},
		{"certificates", c.certificates},
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"controllers", c.startControllers},
		{"containerd", c.startContainerd},
		{"kubelet", c.startKubelet},
		{"kube-proxy", c.startKubeProxy},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.fn(ctx); err != nil {
			return c, fmt.Errorf("%s: %w", s.name, err)
		}
		c.logf("%s up (%.1fs)", s.name, time.Since(t).Seconds())
	}
	return c, nil
}

// Ready waits for the node to be Ready, labels it as a GPU node and starts CoreDNS.
func (c *Cluster) Ready(ctx context.Context, coreDNSImage string) error {
	t := time.Now()
	if err := c.kubectlWait(ctx, "--for=condition=Ready", "node/"+NodeName, "--timeout=300s"); err != nil {
		return fmt.Errorf("node %s Ready: %w", NodeName, err)
	}
	if _, err := c.Kubectl(ctx, nil, "label", "node", NodeName, GPUNodeLabel, "--overwrite"); err != nil {
		return err
	}
	c.logf("node %s Ready (%.1fs), labelled %s", NodeName, time.Since(t).Seconds(), GPUNodeLabel)
	t = time.Now()
	if _, err := c.Kubectl(ctx, strings.NewReader(coreDNSManifest(coreDNSImage)), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("CoreDNS: %w", err)
	}
	if _, err := c.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "status", "deployment/coredns",
		"--timeout=300s"); err != nil {
		return fmt.Errorf("CoreDNS rollout: %w", err)
	}
	c.logf("CoreDNS serving on %s (%.1fs); cluster ready %.1fs after start", DNSIP, time.Since(t).Seconds(),
		time.Since(c.started).Seconds())
	return nil
}

// Kubectl runs kubectl with the admin kubeconfig and returns its standard output.
func (c *Cluster) Kubectl(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.K8sBin, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdin = stdin
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// kubectlWait retries kubectl wait until it succeeds: it fails at once while the object does not exist yet.
func (c *Cluster) kubectlWait(ctx context.Context, args ...string) error {
	var err error
	for {
		if _, err = c.Kubectl(ctx, nil, append([]string{"wait"}, args...)...); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

func (c *Cluster) hostNetwork(context.Context) error {
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", "lo").Output()
	if err != nil {
		return fmt.Errorf("ip addr show dev lo: %w", err)
	}
	if !strings.Contains(string(out), " "+NodeIP+"/") {
		c.state.Address = NodeIP + "/32"
		if err := c.saveJournal(); err != nil {
			return err
		}
		if out, err := exec.Command("ip", "addr", "add", NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
			return fmt.Errorf("ip addr add %s/32 dev lo: %v: %s", NodeIP, err, out)
		}
	}
	// Forwarding between the pod bridge and the host, and bridged pod traffic through iptables (kube-proxy's DNAT
	// of Service addresses between two pods on the bridge).
	for key, v := range map[string]string{"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"} {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, v, err)
		}
	}
	return nil
}

func (c *Cluster) certificates(context.Context) error {
	p, err := newPKI(c.path("pki"))
	if err != nil {
		return err
	}
	c.pki = p
	hosts := []string{"127.0.0.1", NodeIP, APIServerIP, "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	issues := []struct {
		name, cn string
		orgs     []string
		server   bool
		hosts    []string
	}{
		{"apiserver", "kube-apiserver", nil, true, hosts},
		{"admin", "faas-gpu-admin", []string{"system:masters"}, false, nil},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil},
		{"controller-manager", "system:kube-controller-manager", nil, false, nil},
		{"scheduler", "system:kube-scheduler", nil, false, nil},
		{"kubelet", "system:node:" + NodeName, []string{"system:nodes"}, false, nil},
		{"kubelet-serving", NodeName, nil, true, []string{NodeIP, NodeName, "127.0.0.1"}},
		{"kube-proxy", "system:kube-proxy", nil, false, nil},
	}
	for _, i := range issues {
		if err := p.issue(i.name, i.cn, i.orgs, i.server, i.hosts...); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s:%d", NodeIP, APIPort)
	for _, n := range []string{"admin", "controller-manager", "scheduler", "kubelet", "kube-proxy"} {
		if err := p.kubeconfig(c.path(n+".kubeconfig"), n, server); err != nil {
			return err
		}
	}
	c.Kubeconfig = c.path("admin.kubeconfig")
	return nil
}

// start runs a cluster process in its own process group with its output in logs/<name>.log.
func (c *Cluster) start(name, bin string, args ...string) error {
	logf, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.state.PIDs[name] = cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reap it; Down signals the process group
	return c.saveJournal()
}

// waitHTTP polls url until it answers 200, the process dies, or ctx ends.
func (c *Cluster) waitHTTP(ctx context.Context, name, url string, client *http.Client) error {
	deadline, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last error
	for {
		if !alive(c.state.PIDs[name]) {
			return fmt.Errorf("%s exited; see %s:\n%s", name, c.path("logs", name+".log"), tail(c.path("logs", name+".log"), 15))
		}
		req, _ := http.NewRequestWithContext(deadline, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-deadline.Done():
			return fmt.Errorf("%s not healthy: %v; see %s", name, last, c.path("logs", name+".log"))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	// etcd's data lives on a tmpfs (the run is thrown away), which makes its fsyncs free.
	dir := "/dev/shm/faas-gpu-cluster-etcd"
	c.state.Created = append(c.state.Created, dir)
	if err := c.saveJournal(); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if err := c.start("etcd", c.cfg.Etcd, "--name", "faas-gpu", "--data-dir", dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "faas-gpu="+peer, "--listen-metrics-urls", "http://127.0.0.1:32381"); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "etcd", client+"/health", http.DefaultClient)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.pki.path
	if err := c.start("kube-apiserver", filepath.Join(c.cfg.K8sBin, "kube-apiserver"),
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--bind-address", "0.0.0.0", "--advertise-address", NodeIP, "--secure-port", fmt.Sprint(APIPort),
		"--service-cluster-ip-range", ServiceCIDR,
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"),
		"--kubelet-client-certificate", p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--authorization-mode", "Node,RBAC", "--allow-privileged=true",
		"--enable-admission-plugins", "NodeRestriction",
		"--profiling=false", "--v=1"); err != nil {
		return err
	}
	client, err := c.adminHTTPClient()
	if err != nil {
		return err
	}
	return c.waitHTTP(ctx, "kube-apiserver", fmt.Sprintf("https://%s:%d/readyz", NodeIP, APIPort), client)
}

func (c *Cluster) startControllers(ctx context.Context) error {
	p := c.pki.path
	if err := c.start("kube-controller-manager", filepath.Join(c.cfg.K8sBin, "kube-controller-manager"),
		"--kubeconfig", c.path("controller-manager.kubeconfig"),
		"--authentication-kubeconfig", c.path("controller-manager.kubeconfig"),
		"--authorization-kubeconfig", c.path("controller-manager.kubeconfig"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"),
		"--cluster-signing-cert-file", p("ca.crt"), "--cluster-signing-key-file", p("ca.key"),
		"--service-cluster-ip-range", ServiceCIDR,
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	if err := c.start("kube-scheduler", filepath.Join(c.cfg.K8sBin, "kube-scheduler"),
		"--kubeconfig", c.path("scheduler.kubeconfig"),
		"--authentication-kubeconfig", c.path("scheduler.kubeconfig"),
		"--authorization-kubeconfig", c.path("scheduler.kubeconfig"),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: insecureTLS()}}
	if err := c.waitHTTP(ctx, "kube-controller-manager", "https://127.0.0.1:10257/healthz", insecure); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "kube-scheduler", "https://127.0.0.1:10259/healthz", insecure)
}

// ContainerdSocket is containerd's address for this run.
func (c *Cluster) ContainerdSocket() string { return c.path("containerd", "containerd.sock") }

func (c *Cluster) startContainerd(ctx context.Context) error {
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, c.cfg.ContainerdRoot, c.path("containerd", "state"), c.ContainerdSocket(), c.ContainerdSocket()+".ttrpc",
		c.path("containerd", "opt"), PauseImage, c.path("containerd", "runc"), c.cfg.CNIBin, c.path("cni", "net.d"))
	if err := os.WriteFile(c.path("containerd", "config.toml"), []byte(conf), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "faas-gpu",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, cniBridge, c.path("cni", "ipam"), PodCIDR)
	if err := os.WriteFile(c.path("cni", "net.d", "10-faas-gpu.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	if err := c.start("containerd", "containerd", "--config", c.path("containerd", "config.toml")); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if !alive(c.state.PIDs["containerd"]) {
			return fmt.Errorf("containerd exited:\n%s", tail(c.path("logs", "containerd.log"), 15))
		}
		if conn, err := net.Dial("unix", c.ContainerdSocket()); err == nil {
			conn.Close()
			return c.dropOldContainers(ctx)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd socket %s did not appear", c.ContainerdSocket())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
clusterDNS: [%s]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podCIDR: %s
podLogsDir: %s
maxPods: 60
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
protectKernelDefaults: false
`, NodeIP, c.pki.path("kubelet-serving.crt"), c.pki.path("kubelet-serving.key"), c.pki.path("ca.crt"),
		c.ContainerdSocket(), cgroupRoot, DNSIP, PodCIDR, c.path("pod-logs"))
	if err := os.WriteFile(c.path("kubelet.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	// The kubelet's cgroup root must exist in every hierarchy (cgroup v1); Down removes it.
	ctrls, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, ctrl := range ctrls {
		if ctrl.IsDir() {
			if err := os.Mkdir(filepath.Join("/sys/fs/cgroup", ctrl.Name(), cgroupRoot), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("cgroup %s: %w", ctrl.Name(), err)
			}
		}
	}
	if err := c.start("kubelet", filepath.Join(c.cfg.K8sBin, "kubelet"),
		"--config", c.path("kubelet.yaml"), "--kubeconfig", c.path("kubelet.kubeconfig"),
		"--root-dir", c.path("kubelet"), "--node-ip", NodeIP, "--hostname-override", NodeName, "--v=1"); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "kubelet", "http://127.0.0.1:10248/healthz", http.DefaultClient)
}

func (c *Cluster) startKubeProxy(ctx context.Context) error {
	conf := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: iptables
hostnameOverride: %s
clusterCIDR: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
`, c.path("kube-proxy.kubeconfig"), NodeName, PodCIDR, NodeIP)
	if err := os.WriteFile(c.path("kube-proxy.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}
	if err := c.start("kube-proxy", filepath.Join(c.cfg.K8sBin, "kube-proxy"), "--config", c.path("kube-proxy.yaml"),
		"--v=1"); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "kube-proxy", "http://127.0.0.1:10256/healthz", http.DefaultClient)
}

// Down stops the cluster whose journal is in runDir and restores the host; without a journal it does nothing.
func Down(runDir string, log io.Writer) error {
	b, err := os.ReadFile(journalPath(runDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st hostState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("journal %s: %w", journalPath(runDir), err)
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "[cluster %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	logf("stopping the cluster and restoring the host (journal %s)", journalPath(runDir))
	// Processes, the node's first so that nothing restarts containers, then containerd's shims and what they run.
	order := []string{"kube-proxy", "kubelet", "knative-controller", "knative-autoscaler", "kube-scheduler",
		"kube-controller-manager", "kube-apiserver", "etcd"}
	for _, name := range order {
		if pid, ok := st.PIDs[name]; ok {
			stopGroup(name, pid, logf)
		}
	}
	socket := filepath.Join(runDir, "containerd", "containerd.sock")
	for _, pid := range shimsOf(socket) {
		killTree(pid, logf)
	}
	if pid, ok := st.PIDs["containerd"]; ok {
		stopGroup("containerd", pid, logf)
	}
	for name, pid := range st.PIDs { // anything started later than the list above knows
		if alive(pid) {
			stopGroup(name, pid, logf)
		}
	}
	err = st.restore(logf)
	if rmErr := os.Remove(journalPath(runDir)); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
		err = errors.Join(err, rmErr)
	}
	if err == nil {
		logf("host restored")
	}
	return err
}

// dropOldContainers deletes the containers (and their snapshots) an earlier run left in containerd's metadata: Down
// kills their processes, but the content store with the images is kept between runs.
func (c *Cluster) dropOldContainers(ctx context.Context) error {
	out, err := c.Ctr(ctx, "containers", "list", "-q")
	if err != nil {
		return err
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return nil
	}
	if _, err := c.Ctr(ctx, append([]string{"containers", "delete"}, ids...)...); err != nil {
		return err
	}
	c.logf("removed %d containers an earlier run left in containerd", len(ids))
	return nil
}

// Ctr runs containerd's ctr against this cluster's containerd, in the k8s.io namespace the kubelet uses, and returns
// its standard output.
func (c *Cluster) Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.ContainerdSocket(), "-n", "k8s.io"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
