// Package local runs functions as processes on this machine: faas-gpu's backend for `faas-gpu up`.
//
// A function's image name resolves to a build context laid out as `faas-cli build --shrinkwrap` lays it out
// (template files at the top, the handler in function/); see Config and source.go. Each replica is the template's
// entrypoint (python3 index.py) on a free port of 127.0.0.1, supervised: restarted with exponential backoff when it
// exits, stopped with SIGTERM then SIGKILL on delete, scale to 0 or Close. Children get a parent-death signal and a
// process group of their own, so no function process outlives the process that runs the backend, even when that
// process is killed with SIGKILL.
//
// State (under Config.StateDir):
//
//	functions/<name>.json   one record per function (deployment, desired replicas, creation time), written atomically
//	secrets/<name>          secret values, mode 0600
//	logs/<name>.log         each function's output as NDJSON log messages (rotated at 8 MiB; reloaded by New)
//	run/<name>/secrets/     copies of the function's secrets (mode 0400, the function's own when it has its own user);
//	                        OPENFAAS_SECRETS_DIR points here, and a sandbox shows this folder and no other
//	run/<name>/root/        empty; a sandboxed replica's root file system is mounted on it in its own mount namespace
//	run/<name>/apps/<id>/   the function's code when it is assembled from a template folder plus a handler folder: a
//	                        folder per replica, so that one replica's assembly never clears another's
//	envs/                   Python environments of functions with pip requirements, unless Config.EnvDir names
//	                        another folder (see package venv: one per distinct requirements, shared, kept)
//
// run/ is rebuilt from scratch by New: a restarted backend starts every recorded function again.
package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/provider/local/venv"
)

// Config configures a local Backend. StateDir and BuildDir are required; the rest have defaults.
type Config struct {
	// StateDir holds function records, secrets and logs; it is created when missing.
	StateDir string
	// BuildDir holds build contexts: <BuildDir>/<name>/ as `faas-cli build --shrinkwrap` writes them.
	BuildDir string
	// TemplatesDir and FunctionsDir are the fallback when BuildDir has no context for a function: the function runs
	// from <TemplatesDir>/<Template>/ with <FunctionsDir>/<name>/ as its function/ folder. Both empty: no fallback.
	TemplatesDir string
	FunctionsDir string
	// Template is the template used by the fallback; default "gpu-python".
	Template string
	// Env is extra environment for every function (e.g. FAAS_GPU_SOCKET); a function's envVars override it.
	Env map[string]string
	// GPUEnv, when set, adds environment to the replicas of GPU functions only, per function (called with its
	// name on the gpuserver, gpuspec.FunctionName): the remoting token (FAAS_GPU_TOKEN), the shim's socket and
	// library path. It overrides Env and envVars.
	GPUEnv func(function string) map[string]string
	// Python is the interpreter that runs index.py; default "python3". Functions with pip requirements (a
	// requirements.txt of the template or of the handler) run in a virtual environment made from it.
	Python string
	// EnvDir holds those environments, one per distinct requirements and interpreter, shared by the functions
	// that have the same requirements and kept across restarts; default <StateDir>/envs.
	EnvDir string
	// EnvMaxAge: New removes environments no function has started on for longer than this; 0 keeps them.
	EnvMaxAge time.Duration
	// Logger receives the backend's own events; nil discards them.
	Logger *slog.Logger

	// StopTimeout is how long a replica has to exit after SIGTERM before SIGKILL; default 2s.
	StopTimeout time.Duration
	// DrainTimeout bounds how long a replica that an update or a scale-down replaces may take to end the requests
	// it was given before it gets SIGTERM; default 60s.
	DrainTimeout time.Duration
	// BackoffMin and BackoffMax bound the delay before a crashed replica is restarted; defaults 100ms and 10s.
	BackoffMin, BackoffMax time.Duration
	// MaxReplicas is the largest replica count Scale accepts; default 10.
	MaxReplicas uint64
	// LogLines is how many lines of output are kept in memory per function; default 1000.
	LogLines int
	// Autoscale, when set, runs the autoscaler (autoscale.go, package autoscale) over the functions whose
	// com.openfaas.scale.* labels ask for it; nil: replica counts change only by Scale and scale from zero.
	Autoscale *autoscale.Config
	// Sandbox, when it isolates (sandbox.New found the kernel willing), runs every replica in namespaces of its own
	// under its function's identity (see package sandbox and isolation.go); nil or not isolating: replicas are plain
	// child processes of this one. Either way a replica's environment holds only the machine's PATH, LANG, LC_* and
	// TZ of this process, never the rest of it.
	Sandbox *sandbox.Sandbox
}

// ErrClosed is returned by every method after Close.
var ErrClosed = errors.New("local backend closed")

// Backend runs functions as local processes. It implements provider.Backend, provider.SecretStore and
// provider.LogSource.
type Backend struct {
	cfg      Config
	log      *slog.Logger
	spawner  *spawner
	envs     *venv.Manager // Python environments of functions with pip requirements
	health   *http.Client  // readiness checks
	absState string        // StateDir made absolute, for paths handed to functions
	pythons  pythons       // Config.Python resolved for sandboxes

	// base is the lifetime of every replica; Close cancels it.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // supervisors

	mu         sync.Mutex
	fns        map[string]*function               // by key (namespaces.go)
	namespaces map[string]types.FunctionNamespace // besides provider.DefaultNamespace (namespaces.go)
	closed     bool

	secretsMu sync.Mutex // serialises secret writes
}

var (
	_ provider.Backend     = (*Backend)(nil)
	_ provider.SecretStore = (*Backend)(nil)
	_ provider.LogSource   = (*Backend)(nil)
	_ provider.Router      = (*Backend)(nil)
)

// New prepares the state directory, reads the function records and starts every recorded function again with its
// recorded replica count. ctx bounds only this start-up; replicas live until Delete, Scale or Close.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("%w: local backend: StateDir is required", provider.ErrInvalid)
	}
	if cfg.BuildDir == "" {
		return nil, fmt.Errorf("%w: local backend: BuildDir is required", provider.ErrInvalid)
	}
	if cfg.Template == "" {
		cfg.Template = "gpu-python"
	}
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 2 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 60 * time.Second
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 100 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(10*time.Second, cfg.BackoffMin)
	}
	if cfg.MaxReplicas == 0 {
		cfg.MaxReplicas = 10
	}
	if cfg.LogLines <= 0 {
		cfg.LogLines = 1000
	}
	if cfg.EnvDir == "" {
		cfg.EnvDir = filepath.Join(cfg.StateDir, "envs")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, d := range []string{"functions", "secrets", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("local backend: state dir: %w", err)
		}
	}
	// A clean slate: nothing from a previous run's run/ folder survives.
	if err := os.RemoveAll(filepath.Join(cfg.StateDir, "run")); err != nil {
		return nil, fmt.Errorf("local backend: clearing %s: %w", filepath.Join(cfg.StateDir, "run"), err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "run"), 0o700); err != nil {
		return nil, fmt.Errorf("local backend: state dir: %w", err)
	}
	absState, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("local backend: state dir: %w", err)
	}
	recs, err := loadRecords(filepath.Join(cfg.StateDir, "functions"), cfg.MaxReplicas, log, time.Now())
	if err != nil {
		return nil, err
	}
	nss, err := loadNamespaces(filepath.Join(cfg.StateDir, "namespaces.json"))
	if err != nil {
		return nil, err
	}
	for _, rec := range recs { // a function's namespace exists while it has functions
		if ns := rec.Deployment.Namespace; ns != "" && ns != provider.DefaultNamespace && nss[ns].Name == "" {
			nss[ns] = labelled(types.FunctionNamespace{Name: ns})
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.Background())
	b := &Backend{cfg: cfg, log: log, spawner: newSpawner(), base: base, cancel: cancel, fns: map[string]*function{},
		absState: absState, namespaces: nss,
		health: &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}}
	b.envs, err = openEnvs(ctx, cfg, func(cmd *exec.Cmd) error {
		if cmd.SysProcAttr == nil { // a sandboxed install's init has its own, with a parent-death signal
			cmd.SysProcAttr = childAttrs() // pip dies with this process
		}
		return b.spawner.start(b.base, cmd)
	}, log)
	if err != nil {
		cancel()
		b.spawner.stop()
		return nil, err
	}
	var startErr error
	b.mu.Lock()
	for _, rec := range recs {
		fn, err := b.newFunction(rec)
		if err != nil {
			startErr = err
			break
		}
		b.fns[fn.key] = fn
		b.scaleLocked(fn, rec.Replicas, false)
		log.Info("function restored", "function", rec.Deployment.Service, "namespace", fn.ns,
			"replicas", rec.Replicas)
	}
	b.mu.Unlock()
	if startErr != nil {
		return nil, errors.Join(startErr, b.Close(ctx))
	}
	if cfg.Autoscale != nil {
		b.wg.Add(1)
		go b.runAutoscaler(cfg.Autoscale.WithDefaults())
	}
	return b, nil
}

// Close stops every replica (SIGTERM, then SIGKILL after StopTimeout or when ctx ends) and waits for them.
// It returns ctx's error if replicas had to be killed because ctx ended first.
func (b *Backend) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	var reps []*replica
	for _, fn := range b.fns {
		reps = append(reps, fn.replicas...)
		reps = append(reps, fn.retiring...)
		fn.replicas, fn.retiring = nil, nil
		fn.notifyLocked()
	}
	b.mu.Unlock()
	b.cancel()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("local backend: stopping functions: %w", ctx.Err())
		for _, r := range reps {
			r.kill()
		}
		<-done
	}
	b.mu.Lock()
	for _, fn := range b.fns {
		fn.logs.close()
	}
	b.mu.Unlock()
	b.spawner.stop()
	return errors.Join(err, b.envs.Close())
}
