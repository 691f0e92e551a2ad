package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/openfaas/faas-provider/auth"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

// gpuserverConfig holds the flags of `faas-gpu gpuserver`.
type gpuserverConfig struct {
	socket    string
	remoting  string
	keyFile   string
	group     string
	listen    string
	gpus      string
	gpuMemory string
	repoDir   string
	policy    string
	overload  string
	admission string
	logLevel  string
	kernels   string // --sim-kernels
	tenants   tenantFlags
	sharing   sharingFlag
	metering  string
	hold      holdFlag
	uiAddr    string
	uiAuthDir string
}

// holdFlag is the gpuserver's maximum binding hold (server.Config.MaxBindingHold), a flag of `gpuserver` and `up`.
type holdFlag struct{ max time.Duration }

func (h *holdFlag) register(fs *flag.FlagSet) {
	fs.DurationVar(&h.max, "max-binding-hold", server.DefaultMaxBindingHold,
		"the longest a request may hold its GPU (the functions' timeout on the GPU): a binding held longer is "+
			"ended, its request answers 503 and the GPU serves the next request")
}

func (h *holdFlag) validate() error {
	if h.max <= 0 {
		return usageError{fmt.Errorf("-max-binding-hold %s: must be positive", h.max)}
	}
	return nil
}

func (c *gpuserverConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.socket, "socket", "/run/faas-gpu/gpuserver.sock", "Unix socket of the gpuserver API")
	fs.StringVar(&c.remoting, "remoting-socket", "/run/faas-gpu/remoting.sock",
		"Unix socket the shim connects to (empty: no CUDA remoting)")
	fs.StringVar(&c.keyFile, "key-file", "/var/lib/faas-gpu/gpuserver.key",
		"key every gpuserver credential derives from (mode 0600); created when missing, keep it across restarts")
	fs.StringVar(&c.group, "socket-group", "",
		"group (name or id) given the sockets, mode 0660, for function processes of other users; none: owner only "+
			"(default: as root, the group of faas-gpu provider's sandboxed functions, "+strconv.Itoa(sandbox.DefaultFirstID)+
			" (the first of its default -sandbox-ids); otherwise none, as functions then run as this user)")
	fs.StringVar(&c.listen, "listen", "", "optional TCP address of the gpuserver API, e.g. 127.0.0.1:8090")
	fs.StringVar(&c.gpus, "gpus", autoNode, "auto (discover; simulated "+fallbackNode+" when none), a node preset (v100x4, a100x8, h100x8, h200x1) or a node file")
	fs.StringVar(&c.gpuMemory, "gpu-memory", "", "override every GPU's memory, e.g. 4Gi (forces eviction in tests)")
	fs.StringVar(&c.repoDir, "repository-dir", "/dev/shm/faas-gpu",
		"model images of the functions (shared-memory files kept across gpuserver restarts)")
	fs.StringVar(&c.policy, "policy", "faas-gpu", policyUsage)
	fs.StringVar(&c.overload, "overload", controller.OverloadAuto, overloadUsage)
	fs.StringVar(&c.admission, "admission", string(controller.DefaultAdmission), admissionUsage)
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.kernels, "sim-kernels", "reference", simKernelsUsage)
	c.tenants.register(fs)
	c.sharing.register(fs)
	c.hold.register(fs)
	fs.StringVar(&c.uiAddr, "ui-addr", "",
		"TCP address of the live pool page /ui, e.g. :8091 (empty: none); it needs -ui-auth-dir")
	fs.StringVar(&c.uiAuthDir, "ui-auth-dir", "",
		"folder of basic-auth-user and basic-auth-password, the credentials of the pool page (in a cluster the "+
			"basic-auth secret OpenFaaS mounts at /var/secrets)")
	fs.StringVar(&c.metering, "metering-file", "",
		"the functions' bill, kept across restarts (default: metering.json in -repository-dir: on a tmpfs it "+
			"survives restarts of the gpuserver, not of the machine; name a file on disk for that)")
}

func runGPUServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg gpuserverConfig
	fs := flag.NewFlagSet("gpuserver", flag.ContinueOnError)
	cfg.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg.logLevel)
	if err != nil {
		return err
	}
	if err := checkPolicy(cfg.policy); err != nil {
		return err
	}
	if err := cfg.hold.validate(); err != nil {
		return err
	}
	overload, err := parseOverload(cfg.overload)
	if err != nil {
		return err
	}
	admission, err := parseAdmission(cfg.admission)
	if err != nil {
		return err
	}
	if cfg.repoDir == "" {
		return usageError{fmt.Errorf("-repository-dir: must not be empty")}
	}
	if err := cfg.tenants.validate(); err != nil {
		return err
	}
	tenants, err := cfg.tenants.config(cfg.logLevel)
	if err != nil {
		return err
	}
	var uiCreds *auth.BasicAuthCredentials
	if cfg.uiAddr != "" {
		if cfg.uiAuthDir == "" {
			return usageError{errors.New("-ui-addr needs -ui-auth-dir: the pool page is served behind basic auth")}
		}
		if uiCreds, err = basicauth.Read(cfg.uiAuthDir); err != nil {
			return usageError{fmt.Errorf("-ui-auth-dir: %w", err)}
		}
	}
	simKernels, err := parseSimKernels(cfg.kernels)
	if err != nil {
		return err
	}
	gpus, err := resolveGPUs(log, cfg.gpus, cfg.gpuMemory, discoverGPUs)
	if err != nil {
		return err
	}
	if err := checkSimKernels(simKernels, gpus); err != nil {
		return err
	}
	node := gpus.Node
	group := socketGroup(cfg.group, os.Geteuid())
	if cfg.group == "" && group != "" {
		log.Info("the sockets are for the group of sandboxed functions (-socket-group none: owner only)",
			"socket_group", group)
	}
	if cfg.metering == "" {
		cfg.metering = filepath.Join(cfg.repoDir, "metering.json")
	}
	srv, err := server.Start(ctx, server.Config{Socket: cfg.socket, Listen: cfg.listen, Node: node,
		Policy: cfg.policy, Overload: overload, Admission: admission, RemotingSocket: cfg.remoting, KeyFile: cfg.keyFile, RepositoryDir: cfg.repoDir,
		Device: gpus.Device, DeviceReserveBytes: gpus.Reserve, SocketGroup: group, Logger: log,
		SimKernels: simKernels, MeteringFile: cfg.metering, MaxBindingHold: cfg.hold.max, Tenants: tenants,
		SimProcessWide: true, ComputeSharing: cfg.sharing.on}) // a simulated GPU shares within one process what an H100 does
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "gpuserver: %d GPUs (%s), API on unix:%s", len(node.GPUs), node.Name, srv.Socket())
	if srv.RemotingSocket() != "" {
		fmt.Fprintf(stdout, ", remoting on unix:%s", srv.RemotingSocket())
	}
	if srv.Addr() != "" {
		fmt.Fprintf(stdout, " and http://%s", srv.Addr())
	}
	fmt.Fprintln(stdout)
	var stopPage func(context.Context) error
	if cfg.uiAddr != "" {
		if stopPage, err = servePoolPage(ctx, srv, node.Name, cfg.uiAddr, uiCreds, stdout, log); err != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return errors.Join(err, srv.Shutdown(sctx))
		}
	}
	select {
	case <-ctx.Done():
	case err = <-srv.Err():
	}
	if stopPage != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if perr := stopPage(sctx); perr != nil && err == nil {
			err = perr
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil && err == nil {
		err = serr
	}
	return err
}

// socketGroup is the group of the gpuserver's sockets for -socket-group flag run by euid: "" (owner only) for none;
// unset, as root, the group of the standalone provider's sandboxed functions (they run under ids of their own,
// members of the first of -sandbox-ids: without it their shim cannot connect and cuInit answers
// CUDA_ERROR_NO_DEVICE), and as another user none (its functions run as that user).
func socketGroup(flag string, euid int) string {
	switch {
	case flag == "none":
		return ""
	case flag != "":
		return flag
	case euid == 0:
		return strconv.Itoa(sandbox.DefaultFirstID)
	}
	return ""
}

// newLogger returns a text logger at the named level.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Errorf("-log-level %q: want debug, info, warn or error", level)}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
