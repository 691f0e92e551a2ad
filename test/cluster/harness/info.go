package harness

// Host directories the chart's pods share through hostPath (the chart's socketDir and gpuserver.repositoryDir):
// the defaults, which the stock-chart swap-in provider also assumes. The harness removes them at the end when it
// created them.
const (
	SocketDir     = "/var/run/faas-gpu"
	RepositoryDir = "/dev/shm/faas-gpu"
)

// Info describes a running test cluster to the live tests (the JSON file FAAS_GPU_TEST_CLUSTER names).
type Info struct {
	// Kubeconfig is the admin kubeconfig; Kubectl the kubectl binary.
	Kubeconfig string `json:"kubeconfig"`
	Kubectl    string `json:"kubectl"`
	// RunDir holds the run's state and logs.
	RunDir string `json:"runDir"`
	// NodeIP is the node's address, reachable from pods and from the host.
	NodeIP string `json:"nodeIP"`
	// Images maps a short name (faas-gpu, fn-echo, nats-server, ...) to the image reference in containerd.
	Images map[string]string `json:"images"`
	// SocketDir and RepositoryDir are the host directories to give the chart (socketDir, gpuserver.repositoryDir).
	SocketDir     string `json:"socketDir"`
	RepositoryDir string `json:"repositoryDir"`
	// Knative is set when Knative Serving's controller runs.
	Knative *KnativeInfo `json:"knative,omitempty"`
}

// KnativeInfo describes the Knative Serving the harness runs.
type KnativeInfo struct {
	// Version is the knative.dev/serving version; Components the processes that run (outside the cluster).
	Version    string   `json:"version"`
	Components []string `json:"components"`
	// NotRunning names what does not run, and why.
	NotRunning map[string]string `json:"notRunning"`
}
