package main

import (
	"context"
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
	"time"

	"github.com/openfaas/faas-provider/auth"
	"github.com/openfaas/faas-provider/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/connlimit"
	"github.com/faas-gpu/faas-gpu/contract"
	gpuauth "github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/provider/handlers"
	"github.com/faas-gpu/faas-gpu/provider/local"
)

// providerShutdown bounds the provider's shutdown: the HTTP server drains, then the backend stops its functions.
const providerShutdown = 5 * time.Second

// providerConfig holds the flags of `faas-gpu provider`. Every flag also reads its FAAS_GPU_* variable (parseFlags).
type providerConfig struct {
	port            int
	host            string
	allowedHosts    string
	basicAuth       bool
	secretMountPath string
	backend         string
	stateDir        string
	buildDir        string
	templatesDir    string
	functionsDir    string
	gpuserverSocket string
	gpuserverKey    string
	remotingSocket  string
	shimDir         string
	python          string
	proxyTimeout    time.Duration
	readyTimeout    time.Duration
	logLevel        string
	envs            envFlags
	sandbox         sandboxFlags
	conns           connFlags
	autoscale       autoscaleFlags
	// envErr is a bad value in one of faas-netes' variables (basic_auth).
	envErr error
}

func (c *providerConfig) register(fs *flag.FlagSet) {
	port, backend := 8081, "local"
	// The stock openfaas chart runs its provider as ./faas-netes with env port=8081: answer as faas-netes does.
	if filepath.Base(os.Args[0]) == "faas-netes" {
		backend = "kubernetes"
		if p, err := strconv.Atoi(os.Getenv("port")); err == nil {
			port = p
		}
	}
	// faas-netes reads basic_auth and secret_mount_path (the stock chart sets true and /var/secrets, where it
	// mounts the basic-auth secret); they are the defaults of -basic-auth and -secret-mount-path.
	basicAuth := true
	if v := os.Getenv("basic_auth"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			c.envErr = fmt.Errorf("invalid value %q for basic_auth (flag -basic-auth): not a boolean", v)
		}
		basicAuth = b
	}
	fs.IntVar(&c.port, "port", port, "TCP port of the faas-provider API")
	fs.StringVar(&c.host, "host", "",
		"address the faas-provider API listens on (default: 127.0.0.1 with -backend local, every interface with a cluster backend)")
	fs.StringVar(&c.allowedHosts, "allowed-hosts", "",
		"comma-separated names the API answers to in the Host header (default: loopback names when -host is a "+
			"loopback address, any otherwise; * for any): a guard against DNS rebinding")
	fs.BoolVar(&c.basicAuth, "basic-auth", basicAuth,
		"require HTTP basic auth on /system/* (faas-netes env basic_auth); the credentials are files in -secret-mount-path")
	fs.StringVar(&c.secretMountPath, "secret-mount-path", os.Getenv("secret_mount_path"),
		"folder of basic-auth-user and basic-auth-password (faas-netes env secret_mount_path; default: "+
			"<state-dir>/secrets, created at first start, with -backend local; /var/secrets, the mounted basic-auth "+
			"secret, with a cluster backend)")
	fs.StringVar(&c.backend, "backend", backend, "where functions run: local, kubernetes or knative")
	fs.StringVar(&c.stateDir, "state-dir", "./.faas-gpu/provider",
		"local backend: functions/ (records, secrets, logs) and secrets/ (the provider's basic-auth credentials)")
	fs.StringVar(&c.buildDir, "build-dir", "./build", "local backend: build contexts <build-dir>/<function>/ (make functions)")
	fs.StringVar(&c.templatesDir, "templates-dir", "./template",
		"local backend: fallback template folder (<templates-dir>/gpu-python/) when a function has no build context")
	fs.StringVar(&c.functionsDir, "functions-dir", "./functions",
		"local backend: fallback handler folders (<functions-dir>/<function>/)")
	fs.StringVar(&c.gpuserverSocket, "gpuserver-socket", "",
		"Unix socket of the node's gpuserver; GPU functions are registered there (empty: no gpuserver)")
	fs.StringVar(&c.gpuserverKey, "gpuserver-key-file", "",
		"the gpuservers' key file (their -key-file): the local backend's GPU functions get their remoting token "+
			"(FAAS_GPU_TOKEN) from it, a cluster backend's GPU pods a ticket to register themselves; required with "+
			"-gpuserver-socket")
	fs.StringVar(&c.remotingSocket, "remoting-socket", "",
		"local backend: the gpuserver's remoting socket for the shim (default: remoting.sock beside -gpuserver-socket)")
	fs.StringVar(&c.shimDir, "shim-dir", "",
		"local backend: folder of the shim's libcuda.so.1 for GPU functions (default: shim/build beside bin/, else ./shim/build)")
	fs.StringVar(&c.python, "python", "python3",
		"local backend: the interpreter that runs functions (index.py; a python or python3 in a function's fprocess means it)")
	fs.DurationVar(&c.proxyTimeout, "proxy-timeout", 5*time.Minute, "longest synchronous invocation through /function/")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", handlers.DefaultReadyTimeout,
		"how long an invocation waits for a function that is starting (the first call after a deploy)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	c.envs.register(fs)
	c.sandbox.register(fs)
	c.conns.register(fs)
	c.autoscale.register(fs)
}

func (c *providerConfig) validate() error {
	if err := c.envs.validate(); err != nil {
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
	case c.envErr != nil:
		return usageError{c.envErr}
	case c.port < 1 || c.port > 65535:
		return usageError{fmt.Errorf("-port %d: want a TCP port from 1 to 65535", c.port)}
	case c.backend != "local" && c.backend != "kubernetes" && c.backend != "knative":
		return usageError{fmt.Errorf("-backend %q: want local, kubernetes or knative", c.backend)}
	case c.backend == "local" && c.stateDir == "":
		return usageError{errors.New("-state-dir is required with -backend local")}
	case c.backend == "local" && c.buildDir == "":
		return usageError{errors.New("-build-dir is required with -backend local")}
	case c.proxyTimeout < 0:
		return usageError{fmt.Errorf("-proxy-timeout %s: must not be negative", c.proxyTimeout)}
	case c.readyTimeout <= 0:
		return usageError{fmt.Errorf("-ready-timeout %s: must be positive", c.readyTimeout)}
	case c.gpuserverSocket != "" && c.gpuserverKey == "":
		return usageError{errors.New("-gpuserver-socket needs -gpuserver-key-file: registering with the gpuserver " +
			"takes its administrator credential, and GPU functions get their token, from the gpuserver's key")}
	case c.host != "" && net.ParseIP(strings.Trim(c.host, "[]")) == nil && c.host != "localhost":
		return usageError{fmt.Errorf("-host %q: want an IP address or localhost", c.host)}
	}
	return nil
}

// absolute makes the local backend's folders and the gpuserver's sockets absolute, as of the working directory at
// start-up: functions run elsewhere (a sandbox shows them their build context by absolute path only) and get the
// sockets' paths in their environment.
func (c *providerConfig) absolute() {
	for _, p := range []*string{&c.stateDir, &c.buildDir, &c.templatesDir, &c.functionsDir, &c.secretMountPath,
		&c.gpuserverSocket, &c.remotingSocket} {
		if *p != "" {
			*p = absPath(*p)
		}
	}
}

// remotingSocketPath is -remoting-socket, else remoting.sock beside -gpuserver-socket.
func (c *providerConfig) remotingSocketPath() string {
	if c.remotingSocket != "" {
		return c.remotingSocket
	}
	return filepath.Join(filepath.Dir(c.gpuserverSocket), "remoting.sock")
}

// listenHost is the address to listen on: -host, else 127.0.0.1 for the local backend (it runs processes on this
// machine) and every interface for a cluster backend (the gateway reaches it over the pod network).
func (c *providerConfig) listenHost() string {
	switch {
	case c.host != "":
		return c.host
	case c.backend == "local":
		return "127.0.0.1"
	}
	return ""
}

// credentials returns the basic-auth credentials of /system/*, nil with -basic-auth=false. With the local backend
// they are created at first start (<state-dir>/secrets by default); a cluster backend reads the mounted secret.
func (c *providerConfig) credentials(log *slog.Logger) (*auth.BasicAuthCredentials, string, error) {
	if !c.basicAuth {
		log.Warn("basic auth is off: anyone who reaches the provider can deploy functions (-basic-auth=false)")
		return nil, "", nil
	}
	dir := c.secretMountPath
	if c.backend != "local" {
		if dir == "" {
			dir = "/var/secrets"
		}
		creds, err := basicauth.Read(dir)
		if err != nil {
			return nil, dir, fmt.Errorf("%w (mount the basic-auth secret there, set -secret-mount-path, or "+
				"-basic-auth=false)", err)
		}
		return creds, dir, nil
	}
	if dir == "" {
		dir = filepath.Join(c.stateDir, "secrets")
	}
	creds, err := ensureBasicAuth(dir, log)
	return creds, dir, err
}

// providerBackends is what the provider serves: functions, secrets, logs, and how to stop them.
type providerBackends struct {
	functions provider.Backend
	secrets   provider.SecretStore
	logs      provider.LogSource
	close     func(context.Context) error
	metrics   prometheus.Collector // nil: none beyond the handlers' own
}

func runProvider(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg providerConfig
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	cfg.register(fs)
	cluster := registerClusterFlags(fs)
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
	cfg.absolute()
	creds, credsDir, err := cfg.credentials(log)
	if err != nil {
		return err
	}
	// The gpuservers' key, read once: the admin token of -gpuserver-socket, the local functions' remoting tokens,
	// the cluster backends' registration tickets. The local backend needs it only with -gpuserver-socket.
	var key gpuauth.Key
	if cfg.gpuserverSocket != "" || cfg.backend != "local" && cfg.gpuserverKey != "" {
		if key, err = gpuauth.ReadKey(cfg.gpuserverKey); err != nil {
			return usageError{fmt.Errorf("-gpuserver-key-file: %w", err)}
		}
	}
	var gpu provider.GPURegistry
	env := map[string]string{}
	var gpuEnv func(string) map[string]string
	if cfg.gpuserverSocket != "" {
		gpu = client.New(cfg.gpuserverSocket, client.WithToken(key.AdminToken())) // the administrator's credential
		env[contract.EnvSocket] = cfg.gpuserverSocket
	}
	var be providerBackends
	switch cfg.backend {
	case "local":
		if cfg.gpuserverSocket != "" {
			gpuEnv = localGPUEnv(cfg, key, log)
		}
		envDir, err := cfg.envs.resolvedDir(cfg.stateDir)
		if err != nil {
			return err
		}
		sb, err := cfg.sandbox.open(ctx, log)
		if err != nil {
			return err
		}
		if cfg.gpuserverSocket != "" {
			warnUnreachableSockets(sb, log, cfg.gpuserverSocket, cfg.remotingSocketPath())
		}
		scaling := autoscale.NewMetrics()
		b, err := local.New(ctx, local.Config{StateDir: filepath.Join(cfg.stateDir, "functions"), BuildDir: cfg.buildDir,
			Autoscale:    cfg.autoscale.config(scaling),
			TemplatesDir: cfg.templatesDir, FunctionsDir: cfg.functionsDir, Env: env, GPUEnv: gpuEnv,
			Python: cfg.python, EnvDir: envDir, EnvMaxAge: cfg.envs.maxAge, Logger: log.With("component", "local"),
			Sandbox: sb})
		if err != nil {
			return fmt.Errorf("local backend: %w", err)
		}
		be = providerBackends{functions: b, secrets: b, logs: b, close: b.Close, metrics: scaling}
	default:
		if key != nil {
			cluster.registrationKey = key
		} else {
			log.Warn("no -gpuserver-key-file: GPU function pods get no registration ticket and cannot register " +
				"with their node's gpuserver (mount the gpuservers' key Secret and name it)")
		}
		cb, err := newClusterBackend(ctx, cfg.backend, cluster)
		if err != nil {
			return err
		}
		be = providerBackends{functions: cb.Functions, secrets: cb.Secrets, logs: cb.Logs,
			close: cb.Close, metrics: cb.Metrics}
	}
	if gpu != nil {
		if err := handlers.SyncGPU(ctx, be.functions, gpu); err != nil {
			// The gpuserver may start after the provider; functions deployed from now on register themselves.
			log.Warn("registering GPU functions with the gpuserver failed", "err", err)
		}
	}
	invocationsFile := "" // a cluster backend's provider keeps no state of its own (the gateway counts)
	if cfg.backend == "local" {
		invocationsFile = filepath.Join(cfg.stateDir, "invocations.json")
	}
	reg := prometheus.NewRegistry()
	if be.metrics != nil {
		reg.MustRegister(be.metrics) // a fresh registry: only a name clash with the handlers' own could fail
	}
	h := handlers.New(handlers.Config{Backend: be.functions, Secrets: be.secrets, Logs: be.logs, GPU: gpu,
		Metrics: reg,
		Info: types.ProviderInfo{Name: "faas-gpu", Orchestration: cfg.backend,
			Version: &types.VersionInfo{Release: version, SHA: commit}},
		Auth: creds, ProxyTimeout: cfg.proxyTimeout, ReadyTimeout: cfg.readyTimeout, InvocationsFile: invocationsFile,
		Logger: log.With("component", "provider")})
	allowed := hostAllowList(cfg.allowedHosts, cfg.listenHost())
	h = handlers.AllowHosts(allowed, h)
	addr := net.JoinHostPort(cfg.listenHost(), strconv.Itoa(cfg.port))
	return serveProvider(ctx, addr, cfg.conns.limits(0.5), h, be.close, func(url string) {
		fmt.Fprintf(stdout, "provider: faas-provider API on %s\n", url)
		if creds != nil {
			fmt.Fprintf(stdout, "provider: /system/* needs basic auth (user %s, password in %s):\n  %s\n", creds.User,
				filepath.Join(credsDir, basicauth.PasswordFile), basicauth.LoginCommand(credsDir, creds.User, url))
		}
	}, log)
}

// serveProvider serves h on addr until ctx ends, then shuts down under providerShutdown: the HTTP server drains
// and closeBackend stops the functions. ready is called with the server's URL once it listens.
func serveProvider(ctx context.Context, addr string, limits connlimit.Limits, h http.Handler,
	closeBackend func(context.Context) error, ready func(url string), log *slog.Logger) error {
	l, err := boundedListen("tcp", addr, "provider", limits, log)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), providerShutdown)
		defer cancel()
		return errors.Join(fmt.Errorf("provider: listen on %s: %w", addr, err), closeBackend(cctx))
	}
	srv := newHTTPServer(h)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	ready("http://" + l.Addr().String())
	log.Info("provider serving", "addr", l.Addr().String())
	select {
	case <-ctx.Done():
		err = nil
	case err = <-serveErr:
		err = fmt.Errorf("provider: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), providerShutdown)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("provider: shutdown: %w", serr), srv.Close())
	}
	if cerr := closeBackend(sctx); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}
