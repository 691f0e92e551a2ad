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
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/handlers"
	"github.com/faas-gpu/faas-gpu/provider/local"
)

// providerShutdown bounds the provider's shutdown: the HTTP server drains, then the backend stops its functions.
const providerShutdown = 5 * time.Second

// providerConfig holds the flags of `faas-gpu provider`. Every flag also reads its FAAS_GPU_* variable (parseFlags).
type providerConfig struct {
	port            int
	backend         string
	stateDir        string
	buildDir        string
	templatesDir    string
	functionsDir    string
	gpuserverSocket string
	python          string
	proxyTimeout    time.Duration
	logLevel        string
	envs            envFlags
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
	fs.IntVar(&c.port, "port", port, "TCP port of the faas-provider API, on every interface")
	fs.StringVar(&c.backend, "backend", backend, "where functions run: local, kubernetes or knative")
	fs.StringVar(&c.stateDir, "state-dir", "./.faas-gpu/provider", "local backend: function records, secrets and logs")
	fs.StringVar(&c.buildDir, "build-dir", "./build", "local backend: build contexts <build-dir>/<function>/ (make functions)")
	fs.StringVar(&c.templatesDir, "templates-dir", "./templates",
		"local backend: fallback template folder (<templates-dir>/gpu-python/) when a function has no build context")
	fs.StringVar(&c.functionsDir, "functions-dir", "./functions",
		"local backend: fallback handler folders (<functions-dir>/<function>/)")
	fs.StringVar(&c.gpuserverSocket, "gpuserver-socket", "",
		"Unix socket of the node's gpuserver; GPU functions are registered there (empty: no gpuserver)")
	fs.StringVar(&c.python, "python", "python3", "local backend: the interpreter that runs index.py")
	fs.DurationVar(&c.proxyTimeout, "proxy-timeout", 5*time.Minute, "longest synchronous invocation through /function/")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	c.envs.register(fs)
}

func (c *providerConfig) validate() error {
	if err := c.envs.validate(); err != nil {
		return err
	}
	switch {
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
	}
	return nil
}

// providerBackends is what the provider serves: functions, secrets, logs, and how to stop them.
type providerBackends struct {
	functions provider.Backend
	secrets   provider.SecretStore
	logs      provider.LogSource
	close     func(context.Context) error
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
	var gpu provider.GPURegistry
	env := map[string]string{}
	if cfg.gpuserverSocket != "" {
		gpu = client.New(cfg.gpuserverSocket)
		env["FAAS_GPU_SOCKET"] = cfg.gpuserverSocket
	}
	var be providerBackends
	switch cfg.backend {
	case "local":
		envDir, err := cfg.envs.resolvedDir(cfg.stateDir)
		if err != nil {
			return err
		}
		b, err := local.New(ctx, local.Config{StateDir: cfg.stateDir, BuildDir: cfg.buildDir,
			TemplatesDir: cfg.templatesDir, FunctionsDir: cfg.functionsDir, Env: env, Python: cfg.python,
			EnvDir: envDir, EnvMaxAge: cfg.envs.maxAge, Logger: log.With("component", "local")})
		if err != nil {
			return fmt.Errorf("local backend: %w", err)
		}
		be = providerBackends{functions: b, secrets: b, logs: b, close: b.Close}
	default:
		cb, err := newClusterBackend(ctx, cfg.backend, cluster)
		if err != nil {
			return err
		}
		be = providerBackends{functions: cb.Functions, secrets: cb.Secrets, logs: cb.Logs,
			close: cb.Close}
	}
	if gpu != nil {
		if err := handlers.SyncGPU(ctx, be.functions, gpu); err != nil {
			// The gpuserver may start after the provider; functions deployed from now on register themselves.
			log.Warn("registering GPU functions with the gpuserver failed", "err", err)
		}
	}
	h := handlers.New(handlers.Config{Backend: be.functions, Secrets: be.secrets, Logs: be.logs, GPU: gpu,
		Info: types.ProviderInfo{Name: "faas-gpu", Orchestration: cfg.backend,
			Version: &types.VersionInfo{Release: version, SHA: commit}},
		ProxyTimeout: cfg.proxyTimeout, Logger: log.With("component", "provider")})
	return serveProvider(ctx, cfg.port, h, be.close, stdout, log)
}

// serveProvider serves h on 0.0.0.0:port until ctx ends, then shuts down under providerShutdown: the HTTP server
// drains and closeBackend stops the functions.
func serveProvider(ctx context.Context, port int, h http.Handler, closeBackend func(context.Context) error,
	stdout io.Writer, log *slog.Logger) error {
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)))
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), providerShutdown)
		defer cancel()
		return errors.Join(fmt.Errorf("provider: listen on port %d: %w", port, err), closeBackend(cctx))
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	fmt.Fprintf(stdout, "provider: faas-provider API on http://%s\n", l.Addr())
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
