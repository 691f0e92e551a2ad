package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/openfaas/faas-provider/auth"
	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/faas-gpu/faas-gpu/connlimit"
	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/provider/handlers"
	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// upConfig holds the flags of `faas-gpu up`.
type upConfig struct {
	stateDir     string
	buildDir     string
	templatesDir string
	functionsDir string
	host         string
	port         int
	natsPort     int
	gpus         string
	gpuMemory    string
	maxInflight  int
	shimDir      string
	python       string
	readyTimeout time.Duration
	allowedHosts string
	policy       string
	overload     string
	admission    string
	logLevel     string
	envs         envFlags
	queue        upQueueConfig
	simKernels   string
	simTime      float64
	tenants      tenantFlags
	sharing      sharingFlag
	hold         holdFlag
	sandbox      sandboxFlags
	conns        connFlags
	autoscale    autoscaleFlags
}

func (c *upConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.stateDir, "state-dir", "./.faas-gpu", "state: function records, secrets, logs, JetStream store, sockets")
	fs.StringVar(&c.buildDir, "build-dir", "./build", "build contexts of functions, <dir>/<name>/ as faas-cli build --shrinkwrap writes them")
	fs.StringVar(&c.templatesDir, "templates-dir", "./template", "fallback when the build dir has no context: the folder of templates, <dir>/gpu-python/ (faas-cli's ./template)")
	fs.StringVar(&c.functionsDir, "functions-dir", "./functions", "fallback when the build dir has no context: one handler folder per function")
	fs.StringVar(&c.host, "host", "127.0.0.1", "address every server listens on (the gateway surface, NATS)")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", "",
		"comma-separated names the gateway answers to in the Host header (default: localhost and loopback addresses "+
			"when -host is a loopback address, any otherwise; * for any): a guard against DNS rebinding")
	fs.IntVar(&c.port, "port", 8080, "port of the gateway surface (faas-provider routes and /async-function)")
	fs.IntVar(&c.natsPort, "nats-port", -1, "port of the embedded NATS server; -1 picks a free one")
	fs.StringVar(&c.gpus, "gpus", autoNode, "auto (discover; simulated "+fallbackNode+" when none), a node preset (v100x4, a100x8, h100x8, h200x1) or a node file")
	fs.StringVar(&c.gpuMemory, "gpu-memory", "", "override every GPU's memory, e.g. 4Gi")
	fs.IntVar(&c.maxInflight, "max-inflight", 0, "asynchronous calls run at once; 0 sizes it to the GPU pool")
	fs.StringVar(&c.shimDir, "shim-dir", "", "folder holding the shim's libcuda.so.1 (default: shim/build beside bin/, else ./shim/build)")
	fs.StringVar(&c.python, "python", "python3", "the interpreter that runs functions (index.py; a python or python3 in a function's fprocess means it)")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", handlers.DefaultReadyTimeout,
		"how long an invocation waits for a function that is starting (the first call after a deploy)")
	fs.StringVar(&c.policy, "policy", "faas-gpu", policyUsage)
	fs.StringVar(&c.overload, "overload", controller.OverloadAuto, overloadUsage)
	fs.StringVar(&c.admission, "admission", string(controller.DefaultAdmission), admissionUsage)
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	c.envs.register(fs)
	c.queue.register(fs)
	fs.StringVar(&c.simKernels, "sim-kernels", "reference", simKernelsUsage)
	fs.Float64Var(&c.simTime, "sim-time-scale", 0, simTimeScaleUsage)
	c.tenants.register(fs)
	c.sharing.register(fs)
	c.hold.register(fs)
	c.sandbox.register(fs)
	c.conns.register(fs)
	c.autoscale.register(fs)
}

func (c *upConfig) validate() error {
	if err := checkPolicy(c.policy); err != nil {
		return err
	}
	if _, err := parseOverload(c.overload); err != nil {
		return err
	}
	if _, err := parseAdmission(c.admission); err != nil {
		return err
	}
	if err := c.envs.validate(); err != nil {
		return err
	}
	if err := c.queue.validate(); err != nil {
		return err
	}
	if err := c.tenants.validate(); err != nil {
		return err
	}
	if err := c.hold.validate(); err != nil {
		return err
	}
	if err := c.sandbox.validate(); err != nil {
		return err
	}
	if err := c.conns.validate(); err != nil {
		return err
	}
	if err := c.autoscale.validate(); err != nil {
		return err
	}
	switch {
	case c.port < 1 || c.port > 65535:
		return usageError{fmt.Errorf("-port %d: must be in 1..65535", c.port)}
	case c.natsPort != -1 && (c.natsPort < 1 || c.natsPort > 65535):
		return usageError{fmt.Errorf("-nats-port %d: must be -1 (free) or in 1..65535", c.natsPort)}
	case !(c.simTime >= 0 && c.simTime <= 1000):
		return usageError{fmt.Errorf("-sim-time-scale %v: must be in [0, 1000]", c.simTime)}
	case c.maxInflight < 0:
		return usageError{fmt.Errorf("-max-inflight %d: must be >= 0", c.maxInflight)}
	case c.readyTimeout <= 0:
		return usageError{fmt.Errorf("-ready-timeout %s: must be positive", c.readyTimeout)}
	case c.python == "":
		return usageError{errors.New("-python: must not be empty")}
	case c.stateDir == "":
		return usageError{errors.New("-state-dir: must not be empty")}
	}
	_, err := parseSimKernels(c.simKernels)
	return err
}

// up is one running `faas-gpu up`: the parts in the order they start; stop undoes them in reverse.
type up struct {
	log     *slog.Logger
	sandbox *sandbox.Sandbox // how functions are isolated
	stops   []func(ctx context.Context) error
	runErrs chan error
}

func (u *up) onStop(f func(ctx context.Context) error) { u.stops = append(u.stops, f) }

// stop runs the stop functions in reverse order of start, under one deadline.
func (u *up) stop(ctx context.Context) error {
	var errs []error
	for i := len(u.stops) - 1; i >= 0; i-- {
		if err := u.stops[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg upConfig
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	cfg.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg.logLevel)
	if err != nil {
		return err
	}
	gpus, err := resolveGPUs(log, cfg.gpus, cfg.gpuMemory, discoverGPUs) // bad flags fail before the state dir
	if err != nil {
		return err
	}
	simKernels, _ := parseSimKernels(cfg.simKernels) // validated above
	if err := checkSimKernels(simKernels, gpus); err != nil {
		return err
	}
	node := gpus.Node
	closeDevice := func() {
		if gpus.Device != nil { // not handed to the gpuserver, which owns it otherwise
			_ = gpus.Device.Close(context.WithoutCancel(ctx))
		}
	}
	stateDir, err := filepath.Abs(cfg.stateDir)
	if err != nil {
		closeDevice()
		return usageError{fmt.Errorf("-state-dir: %w", err)}
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		closeDevice()
		return fmt.Errorf("state dir: %w", err)
	}
	unlock, err := lockStateDir(stateDir)
	if err != nil {
		closeDevice()
		return err
	}
	defer unlock()
	sb, err := cfg.sandbox.open(ctx, log)
	if err != nil {
		closeDevice()
		return err
	}
	if err := writeSandboxReport(stateDir, sb.Report()); err != nil {
		closeDevice()
		return err
	}
	// Sandboxed functions with ids of their own reach the sockets through the group they share (mode 0660).
	socketGroup := ""
	if gid, ok := sb.SocketGroup(); ok {
		socketGroup = strconv.FormatUint(uint64(gid), 10)
	}

	tenants, err := cfg.tenants.config(cfg.logLevel)
	if err != nil {
		closeDevice()
		return err
	}
	overload, _ := controller.ParseOverload(cfg.overload)    // validated above
	admission, _ := controller.ParseAdmission(cfg.admission) // validated above
	u := &up{log: log, runErrs: make(chan error, 4), sandbox: sb}
	err = u.start(ctx, cfg, stateDir, node.Name, stdout, func(ctx context.Context) (*server.Server, error) {
		return server.Start(ctx, server.Config{Socket: filepath.Join(stateDir, "gpuserver.sock"), Node: node,
			Policy: cfg.policy, Overload: overload, Admission: admission,
			RemotingSocket: filepath.Join(stateDir, "remoting.sock"),
			SocketGroup:    socketGroup,
			KeyFile:        filepath.Join(stateDir, "gpuserver.key"),
			RepositoryDir:  repositoryDir(stateDir, gpus.Device != nil), // kept across restarts of up
			Device:         gpus.Device, DeviceReserveBytes: gpus.Reserve, SimKernels: simKernels,
			SimTimeScale: cfg.simTime, ComputeSharing: cfg.sharing.on,
			MeteringFile:   filepath.Join(stateDir, "metering.json"), // the bill, kept across restarts of up
			MaxBindingHold: cfg.hold.max, Logger: log.With("component", "gpuserver"), Tenants: tenants,
			SimProcessWide: true}) // a simulated GPU shares within one process what an H100 does
	})
	if err == nil {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout, "faas-gpu: stopping")
		case err = <-u.runErrs:
			log.Error("a component failed; stopping", "err", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), upStopTimeout)
	defer cancel()
	if serr := u.stop(sctx); serr != nil {
		log.Error("stop", "err", serr)
		if err == nil {
			err = serr
		}
	}
	return err
}

// upStopTimeout bounds Ctrl-C: functions get SIGTERM, then SIGKILL (local.Config.StopTimeout), and the parts after
// them stop once their processes are gone. Ten functions of which six import PyTorch took more than 5 s on a busy
// 2-core machine, which ended up with errors and exit status 1 although every process had stopped.
const upStopTimeout = 20 * time.Second

// start brings the parts up in dependency order: gpuserver, NATS JetStream, local backend, gateway surface,
// queue worker.
func (u *up) start(ctx context.Context, cfg upConfig, stateDir, nodeName string, stdout io.Writer,
	startGPUServer func(context.Context) (*server.Server, error)) error {
	gs, err := startGPUServer(ctx)
	if err != nil {
		return err
	}
	u.onStop(gs.Shutdown)
	gpuClient := client.New(gs.Socket(), client.WithToken(gs.AdminToken())) // the provider holds the admin credential
	gpuStatus := gs.Pool().Status(ctx)

	ns, js, err := u.startNATS(ctx, cfg.host, cfg.natsPort, stateDir)
	if err != nil {
		return err
	}

	shimDir := findShimDir(cfg.shimDir)
	if _, err := os.Stat(filepath.Join(shimDir, "libcuda.so.1")); err != nil {
		u.log.Warn("the shim is not built: GPU functions that call CUDA will fail (run make shim or pass -shim-dir)",
			"shim_dir", shimDir)
	}
	// Absolute, so that a deploy's error (read by faas-cli in some other folder) names the folders for sure.
	templatesDir, buildDir, functionsDir := absPath(cfg.templatesDir), absPath(cfg.buildDir), absPath(cfg.functionsDir)
	envDir, err := cfg.envs.resolvedDir(stateDir)
	if err != nil {
		return err
	}
	scaling := autoscale.NewMetrics()
	backend, err := local.New(ctx, local.Config{
		Autoscale:    cfg.autoscale.config(scaling),
		EnvDir:       envDir,
		EnvMaxAge:    cfg.envs.maxAge,
		StateDir:     filepath.Join(stateDir, "functions"),
		BuildDir:     buildDir,
		TemplatesDir: templatesDir,
		FunctionsDir: functionsDir,
		Python:       cfg.python,
		Env:          map[string]string{contract.EnvSocket: gs.Socket()},
		GPUEnv: func(function string) map[string]string {
			return map[string]string{
				contract.EnvRemotingSocket: gs.RemotingSocket(),
				contract.EnvToken:          gs.Token(function),
				"LD_LIBRARY_PATH":          joinPathList(shimDir, os.Getenv("LD_LIBRARY_PATH")),
			}
		},
		Logger:  u.log.With("component", "local"),
		Sandbox: u.sandbox,
	})
	if err != nil {
		return fmt.Errorf("local backend: %w", err)
	}
	u.onStop(backend.Close)
	if err := handlers.SyncGPU(ctx, backend, gpuClient); err != nil {
		return fmt.Errorf("register GPU functions with the gpuserver: %w", err)
	}

	// Basic auth on /system/*, the OpenFaaS way: the credentials are files in <state-dir>/secrets, created at first
	// start (user admin, a random password, mode 0600).
	secretsDir := filepath.Join(stateDir, "secrets")
	creds, err := ensureBasicAuth(secretsDir, u.log)
	if err != nil {
		return err
	}

	gatewayAddr := net.JoinHostPort(cfg.host, strconv.Itoa(cfg.port))
	gatewayURL := "http://" + gatewayAddr
	const proxyTimeout = 5 * time.Minute
	// The gateway's own metrics (provider, invocations, queue worker); /metrics serves them with the gpuserver's,
	// which include the Go runtime and process metrics of this one process.
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(scaling)
	info := types.ProviderInfo{Name: "faas-gpu", Orchestration: "local",
		Version: &types.VersionInfo{Release: version, SHA: commit}}
	providerHandler := handlers.New(handlers.Config{
		Metrics: metrics,
		Backend: backend, Secrets: backend, Logs: backend, GPU: gpuClient,
		Info:            info,
		Auth:            creds,
		ProxyTimeout:    proxyTimeout,
		ReadyTimeout:    cfg.readyTimeout,
		GatewayMetrics:  true,                                        // up is the gateway
		InvocationsFile: filepath.Join(stateDir, "invocations.json"), // faas-cli list's counts survive a restart
		Logger:          u.log.With("component", "provider"),
	})
	fnSource := queueFunctions(backend)
	mux := http.NewServeMux()
	mux.Handle("/async-function/", handlers.LimitBodyTime(handlers.BodyTimeouts{Idle: 30 * time.Second, Total: proxyTimeout},
		checkCallbackHeader(queueFrontDoor(js, fnSource, u.log))))
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{metrics, gs.Metrics()}, promhttp.HandlerOpts{}))
	page, err := poolPage(gs, nodeName, js, u.log)
	if err != nil {
		return err
	}
	u.onStop(func(context.Context) error { page.Close(); return nil })
	mux.Handle("/ui", auth.DecorateWithBasicAuth(page.ServeHTTP, creds)) // behind the /system credentials
	mux.Handle("/ui/", auth.DecorateWithBasicAuth(page.ServeHTTP, creds))
	mux.Handle("/", providerHandler)
	allowed := hostAllowList(cfg.allowedHosts, cfg.host)
	gatewayLimits := cfg.conns.limits(0.5)
	l, err := boundedListen("tcp", gatewayAddr, "gateway", gatewayLimits, u.log)
	if err != nil {
		return fmt.Errorf("gateway: listen on %s: %w (another faas-gpu up? use -port)", gatewayAddr, err)
	}
	gateway := handlers.AllowHosts(allowed, mux)
	u.serve(l, gateway, "gateway")

	maxInflight := cfg.maxInflight
	if maxInflight == 0 {
		maxInflight = 4 * len(gpuStatus.GPUs) // enough to keep every GPU busy while others swap
	}
	// The queue worker invokes functions through a door of its own (a Unix socket only up's user may open), so
	// that a storm on the gateway's port, which local clients and functions share as one peer, never stops the
	// asynchronous calls already accepted.
	workerDoor := filepath.Join(stateDir, workerDoorSocket)
	if err := removeStaleSocket(workerDoor); err != nil {
		return err
	}
	wl, err := boundedListen("unix", workerDoor, "queue worker's door",
		connlimit.Limits{MaxConns: 4*maxInflight + 64, MaxPerPeer: 4*maxInflight + 64}, u.log)
	if err != nil {
		return fmt.Errorf("queue worker's door: %w", err)
	}
	if err := os.Chmod(workerDoor, 0o600); err != nil {
		wl.Close()
		return fmt.Errorf("queue worker's door: %w", err)
	}
	u.serve(wl, gateway, "queue worker's door")
	if err := u.startQueueWorker(ctx, cfg.queue, worker.Config{
		JetStream:              js,
		GatewayURL:             gatewayURL,
		Client:                 unixClient(workerDoor),
		Functions:              fnSource,
		Capacity:               gpuClient,
		MaxInflight:            maxInflight,
		ForbiddenCallbackHosts: []string{ns.Addr()},
	}, metrics); err != nil {
		return err
	}

	hostsText := "any"
	if len(allowed) > 0 {
		hostsText = strings.Join(allowed, ", ")
	}
	fmt.Fprintf(stdout, `faas-gpu up
  gateway      %s  (faas-provider API, /function/{name}, /async-function/{name}; Host: %s;
               at most %d connections, %d per peer)
  auth         /system/* and the pool page %s/ui need basic auth: user %s, password in %s
               %s
  gpuserver    unix:%s  (%d GPUs, node %s, policy %s)
  remoting     unix:%s  (shim %s)
  nats         %s  (JetStream store %s, credentials in %s)
  queue worker stream OF_faas-request, max in flight %d
  state        %s
  functions    from %s (fallback: templates %s, handlers %s)
  python envs  %s  (functions with pip requirements)
  functions    %s
Ready. Ctrl-C stops everything.
`, gatewayURL, hostsText, gatewayLimits.MaxConns, gatewayLimits.MaxPerPeer, gatewayURL, creds.User,
		filepath.Join(secretsDir, basicauth.PasswordFile),
		basicauth.LoginCommand(secretsDir, creds.User, gatewayURL), gs.Socket(), len(gpuStatus.GPUs), nodeName, gpuStatus.Policy, gs.RemotingSocket(),
		filepath.Join(shimDir, "libcuda.so.1"), ns.ClientURL(),
		filepath.Join(stateDir, "jetstream"), filepath.Join(stateDir, natsSecretsDir), maxInflight, stateDir, buildDir, templatesDir, functionsDir,
		envDir, u.sandbox.Report().Summary())
	return nil
}

// workerDoorSocket, in the state dir, is the queue worker's own way into the gateway.
const workerDoorSocket = "gateway.sock"

// serve runs an HTTP server of the gateway's handler on l until up stops.
func (u *up) serve(l net.Listener, h http.Handler, surface string) {
	hs := newHTTPServer(h)
	go func() {
		if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			u.runErrs <- fmt.Errorf("%s: %w", surface, err)
		}
	}()
	u.onStop(func(ctx context.Context) error {
		if err := hs.Shutdown(ctx); err != nil {
			return hs.Close()
		}
		return nil
	})
}

// unixClient is an HTTP client that reaches every URL's host through the Unix socket path, follows no redirect and
// keeps enough idle connections for the worker's concurrency.
func unixClient(path string) *http.Client {
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute, Proxy: nil,
	}
	return &http.Client{Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// removeStaleSocket removes a socket file a previous run left behind; anything else at path is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	return os.Remove(path)
}

// findShimDir returns the folder of the shim's libcuda.so.1: the flag's value, else shim/build beside the
// binary's bin/ folder (a checkout), else ./shim/build.
func findShimDir(flagValue string) string {
	if flagValue != "" {
		abs, err := filepath.Abs(flagValue)
		if err == nil {
			return abs
		}
		return flagValue
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Join(filepath.Dir(exe), "..", "shim", "build")
		if _, err := os.Stat(filepath.Join(dir, "libcuda.so.1")); err == nil {
			return filepath.Clean(dir)
		}
	}
	abs, err := filepath.Abs(filepath.Join("shim", "build"))
	if err != nil {
		return filepath.Join("shim", "build")
	}
	return abs
}

// absPath is path made absolute, or path itself when that fails.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// joinPathList prepends dir to a colon-separated path list.
func joinPathList(dir, list string) string {
	if list == "" {
		return dir
	}
	return dir + string(os.PathListSeparator) + list
}

// lockStateDir takes an exclusive lock on the state dir so that two `up`s never share it.
func lockStateDir(dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("state dir %s is in use by another faas-gpu up (lock: %w)", dir, err)
	}
	return func() { f.Close() }, nil
}

// repositoryDir is where up keeps the model images across its restarts: under the state dir on a simulated node,
// and on /dev/shm when it drives real GPUs, whose driver page-locks the images (Linux 6.5 and later refuse that for
// files on disk). The /dev/shm name is derived from the state dir, so a restarted up finds its images again.
func repositoryDir(stateDir string, realGPUs bool) string {
	if !realGPUs {
		return filepath.Join(stateDir, "repository")
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join("/dev/shm", "faas-gpu-"+hex.EncodeToString(sum[:6]))
}
