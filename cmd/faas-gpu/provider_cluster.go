package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	k8sclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	servingclient "knative.dev/serving/pkg/client/clientset/versioned"

	gpuauth "github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/router"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/knative"
	"github.com/faas-gpu/faas-gpu/provider/kubernetes"
)

// clusterConfig holds the flags of the kubernetes and knative backends. Every flag also reads its FAAS_GPU_*
// variable (parseFlags); the function namespace, pull policy and probe flags also take their defaults from the
// variables the stock openfaas chart sets for faas-netes (function_namespace, image_pull_policy, http_probe), so the
// image runs unchanged in the stock chart's gateway pod.
type clusterConfig struct {
	kubeconfig     string
	namespace      string
	pullPolicy     string
	httpProbe      bool
	nodeLabel      string
	toleration     string
	shimImage      string
	shimPath       string
	socketDir      string
	controlSocket  string
	remotingSocket string
	kubeQPS        float64
	kubeBurst      int
	gpuservers     string
	socketGroup    int64
	runAsUser      int64
	// registrationKey is the gpuservers' key (-gpuserver-key-file) from which GPU pods get registration tickets.
	registrationKey gpuauth.Key
	// envErr is a bad value in one of faas-netes' variables, reported by newClusterBackend.
	envErr error
}

// clusterBackends is what a cluster engine provides to the provider command.
type clusterBackends struct {
	Functions provider.Backend
	Secrets   provider.SecretStore
	Logs      provider.LogSource
	// Close stops what the backend runs in the background (the kubernetes backend's EndpointSlice informers) and
	// waits for it until its ctx ends; those also stop when the ctx given to newClusterBackend ends.
	Close func(context.Context) error
	// Metrics, when not nil, is what the backend adds to the provider's /metrics.
	Metrics prometheus.Collector
}

// routesCollector exports the kubernetes backend's replica picks (kubernetes.Backend.Routes) as
// faas_gpu_provider_routes_total{reason}: resident, least_queued and shedding where the nodes' gpuserver reports
// decided, round_robin where none was fresh.
type routesCollector struct {
	routes func() kubernetes.RouteCounts
	desc   *prometheus.Desc
}

func newRoutesCollector(routes func() kubernetes.RouteCounts) *routesCollector {
	return &routesCollector{routes: routes, desc: prometheus.NewDesc("faas_gpu_provider_routes_total",
		"Requests the provider sent to a function replica, by what chose the replica: the nodes' gpuserver "+
			"reports (resident, least_queued, shedding) or round robin (no fresh report).", []string{"reason"}, nil)}
}

func (c *routesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *routesCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.routes()
	for _, v := range []struct {
		reason router.Reason
		n      uint64
	}{{router.PickResident, r.Resident}, {router.PickLeastQueued, r.LeastQueued}, {router.PickShedding, r.Shedding},
		{router.PickRoundRobin, r.RoundRobin}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v.n), string(v.reason))
	}
}

// registerClusterFlags adds the cluster backends' flags to the provider command's flag set.
func registerClusterFlags(fs *flag.FlagSet) *clusterConfig {
	d := kubernetes.DefaultConfig()
	c := &clusterConfig{}
	ns := d.DefaultNamespace
	if v := os.Getenv("function_namespace"); v != "" {
		ns = v
	}
	pull := string(d.ImagePullPolicy)
	if v := os.Getenv("image_pull_policy"); v != "" {
		pull = v
	}
	probe := d.HTTPProbe
	if v := os.Getenv("http_probe"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			c.envErr = fmt.Errorf("invalid value %q for http_probe (flag -http-probe): not a boolean", v)
		}
		probe = b
	}
	// faas-netes' set_nonroot_user (the stock chart's functions.setNonRootUser): true runs functions as 12000, false
	// as their images' users; unset, faas-gpu runs them as 12000.
	runAs := int64(d.RunAsUser)
	if v := os.Getenv("set_nonroot_user"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			c.envErr = fmt.Errorf("invalid value %q for set_nonroot_user (flag -function-run-as-user): not a boolean", v)
		}
		if !b {
			runAs = 0
		}
	}
	fs.Int64Var(&c.runAsUser, "function-run-as-user", runAs,
		"user id function containers run as (runAsNonRoot, no capabilities); 0 keeps each image's user (faas-netes "+
			"env set_nonroot_user: true is 12000, false is 0)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "",
		"kubeconfig file of the cluster (cluster backends; default: in-cluster service account, then ~/.kube/config)")
	fs.StringVar(&c.namespace, "function-namespace", ns,
		"namespace of functions when a request names none (cluster backends; faas-netes env function_namespace)")
	fs.StringVar(&c.pullPolicy, "image-pull-policy", pull,
		"pull policy of function images: Always, IfNotPresent or Never (faas-netes env image_pull_policy)")
	fs.BoolVar(&c.httpProbe, "http-probe", probe,
		"add HTTP readiness and liveness probes (GET /_/health) to function pods (faas-netes env http_probe)")
	fs.StringVar(&c.nodeLabel, "node-label", d.GPU.NodeLabelKey+"="+d.GPU.NodeLabelValue,
		"key=value label of GPU nodes; GPU functions get a required node affinity to it")
	fs.StringVar(&c.toleration, "node-toleration", d.GPU.Toleration,
		"taint key (Exists, NoSchedule) GPU function pods tolerate on GPU nodes; empty for none")
	fs.StringVar(&c.shimImage, "shim-image", d.GPU.ShimImage,
		"image the shim init container copies libcuda.so.1 from (the faas-gpu image)")
	fs.StringVar(&c.shimPath, "shim-path", d.GPU.ShimPath, "path of the shim inside -shim-image")
	fs.StringVar(&c.socketDir, "socket-dir", d.GPU.SocketDir,
		"host directory of the gpuserver's sockets, mounted into GPU function pods at the same path")
	fs.StringVar(&c.controlSocket, "control-socket-name", d.GPU.ControlSocket,
		"file name of the gpuserver's API socket in -socket-dir (FAAS_GPU_SOCKET of functions)")
	fs.StringVar(&c.remotingSocket, "remoting-socket-name", d.GPU.RemotingSocket,
		"file name of the gpuserver's remoting socket in -socket-dir (FAAS_GPU_REMOTING_SOCKET of functions)")
	fs.Int64Var(&c.socketGroup, "socket-group", 0,
		"group id of the gpuserver's sockets (its -socket-group): GPU function pods get it as a supplementary group; 0 for none")
	fs.StringVar(&c.gpuservers, "gpuserver-service", "",
		"namespace/name of the gpuservers' headless Service: route each request to the replica whose node holds its "+
			"model on a GPU and has the shortest queue, from the pool each node's gpuserver reports (round robin "+
			"where reports are missing or stale); empty: round robin")
	fs.Float64Var(&c.kubeQPS, "kube-qps", 50, "queries per second to the Kubernetes API")
	fs.IntVar(&c.kubeBurst, "kube-burst", 100, "burst of queries to the Kubernetes API")
	return c
}

// config turns the flags into the backends' Config; errors are usageErrors naming the flag.
func (c *clusterConfig) config() (kubernetes.Config, error) {
	if c.envErr != nil {
		return kubernetes.Config{}, usageError{c.envErr}
	}
	cfg := kubernetes.DefaultConfig()
	cfg.DefaultNamespace = c.namespace
	cfg.ImagePullPolicy = corev1.PullPolicy(c.pullPolicy)
	cfg.HTTPProbe = c.httpProbe
	cfg.RunAsUser = c.runAsUser
	if c.runAsUser < 0 {
		return cfg, usageError{fmt.Errorf("-function-run-as-user %d: must be >= 0 (0: the image's user)", c.runAsUser)}
	}
	if c.gpuservers != "" {
		if ns, name, ok := strings.Cut(c.gpuservers, "/"); !ok || ns == "" || name == "" {
			return cfg, usageError{fmt.Errorf("-gpuserver-service %q: want namespace/name", c.gpuservers)}
		}
		cfg.GPUServers = c.gpuservers
	}
	key, value, ok := strings.Cut(c.nodeLabel, "=")
	if !ok {
		return cfg, usageError{fmt.Errorf("-node-label %q: want key=value", c.nodeLabel)}
	}
	cfg.GPU = kubernetes.GPUConfig{
		NodeLabelKey: key, NodeLabelValue: value, Toleration: c.toleration,
		ShimImage: c.shimImage, ShimPath: c.shimPath, SocketDir: c.socketDir,
		ControlSocket: c.controlSocket, RemotingSocket: c.remotingSocket,
		RegistrationKey: c.registrationKey, SocketGroup: c.socketGroup,
	}
	if c.socketGroup < 0 {
		return cfg, usageError{fmt.Errorf("-socket-group %d: must be >= 0", c.socketGroup)}
	}
	if c.kubeQPS <= 0 || c.kubeBurst <= 0 {
		return cfg, usageError{fmt.Errorf("-kube-qps and -kube-burst must be > 0")}
	}
	if err := cfg.Validate(); err != nil {
		flags := []struct{ field, flag string }{
			{"DefaultNamespace", "-function-namespace"}, {"ImagePullPolicy", "-image-pull-policy"},
			{"GPU.NodeLabel", "-node-label"}, {"GPU.Toleration", "-node-toleration"},
			{"GPU.ShimImage", "-shim-image"}, {"GPU.ShimPath", "-shim-path"}, {"GPU.SocketDir", "-socket-dir"},
			{"GPU.ControlSocket", "-control-socket-name"}, {"GPU.RemotingSocket", "-remoting-socket-name"},
		}
		for _, f := range flags {
			if strings.Contains(err.Error(), f.field) {
				return cfg, usageError{fmt.Errorf("%s: %w", f.flag, err)}
			}
		}
		return cfg, usageError{err}
	}
	return cfg, nil
}

// restConfig finds the cluster: -kubeconfig, else the pod's service account, else KUBECONFIG or ~/.kube/config.
func (c *clusterConfig) restConfig() (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if c.kubeconfig != "" {
		if _, statErr := os.Stat(c.kubeconfig); statErr != nil {
			return nil, usageError{fmt.Errorf("-kubeconfig: %w", statErr)}
		}
		rc, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	} else if rc, err = rest.InClusterConfig(); errors.Is(err, rest.ErrNotInCluster) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			err = fmt.Errorf("not in a cluster and no kubeconfig (-kubeconfig, KUBECONFIG or ~/.kube/config): %w", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	rc.QPS = float32(c.kubeQPS)
	rc.Burst = c.kubeBurst
	rc.UserAgent = "faas-gpu/" + version
	return rc, nil
}

// newClusterBackend builds the backend named kind ("kubernetes" or "knative"). The kubernetes backend starts its
// EndpointSlice informers under ctx (they list and watch in the background and stop when ctx ends or on Close);
// until they have synced, invocations are resolved by listing. Nothing else contacts the API server before the
// first request.
func newClusterBackend(ctx context.Context, kind string, cfg *clusterConfig) (clusterBackends, error) {
	if kind != "kubernetes" && kind != "knative" {
		return clusterBackends{}, usageError{fmt.Errorf("-backend %q: want kubernetes or knative", kind)}
	}
	bcfg, err := cfg.config()
	if err != nil {
		return clusterBackends{}, err
	}
	rc, err := cfg.restConfig()
	if err != nil {
		return clusterBackends{}, err
	}
	kube, err := k8sclient.NewForConfig(rc)
	if err != nil {
		return clusterBackends{}, fmt.Errorf("kubernetes client: %w", err)
	}
	if kind == "kubernetes" {
		b, err := kubernetes.New(kube, bcfg)
		if err != nil {
			return clusterBackends{}, usageError{err}
		}
		if err := b.Start(ctx); err != nil {
			return clusterBackends{}, fmt.Errorf("kubernetes backend: %w", err)
		}
		return clusterBackends{Functions: b, Secrets: b, Logs: b, Close: b.Stop,
			Metrics: newRoutesCollector(b.Routes)}, nil
	}
	serving, err := servingclient.NewForConfig(rc)
	if err != nil {
		return clusterBackends{}, fmt.Errorf("knative serving client: %w", err)
	}
	b, err := knative.New(kube, serving, bcfg)
	if err != nil {
		return clusterBackends{}, usageError{err}
	}
	return clusterBackends{Functions: b, Secrets: b, Logs: b, Close: func(context.Context) error { return nil }}, nil
}
