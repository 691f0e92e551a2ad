// Package venv keeps the Python virtual environments of functions that have pip requirements: one environment per
// distinct set of requirements and Python interpreter, installed once with pip, shared by every function with the
// same requirements, and reused across restarts.
//
// Layout of Config.Dir (created 0700; refused when another user owns it or others may write to it):
//
//	py3.11-<key>/                 a virtual environment (python -m venv), <key> from the interpreter and requirements
//	py3.11-<key>/.faas-gpu-env    written last: the environment is complete (JSON: requirements, interpreter, time)
//	py3.11-<key>/.faas-gpu-used   its modification time is the last time a function started on it
//	py3.11-<key>.lock             flock: shared while a process uses the environment, exclusive while Prune removes it
//	py3.11-<key>.install.lock     flock: exclusive while one process installs it; others wait, then reuse it
//	py3.11-<key>.build/           while it installs: the install's work folder (installer.go)
//
// An environment without its .faas-gpu-env file, or with a build folder beside it, is the remains of an install that
// was interrupted: the next install of the same key starts it afresh, and Prune removes it. Lock files are never
// removed (unlinking a lock file that another process has open would let two processes hold "the" lock at once);
// they are empty.
//
// Where Config.Sandbox isolates, the install runs sandboxed (installer.go): it sees pip's settings (PIP_INDEX_URL,
// PIP_FIND_LINKS, PIP_CONFIG_FILE, the proxies, ...) and the system's pip.conf, never a file or folder the
// requirements name (Parse and Ensure refuse local locations), writes only the environment and a temporary folder
// beside it, and starts without a cache (a shared one would be a channel between tenants); an offline machine installs from a wheel folder named by
// PIP_FIND_LINKS with PIP_NO_INDEX=1. Otherwise pip runs as this process with its environment, configuration and
// cache.
package venv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
)

// Sentinel errors, wrapped with %w.
var (
	// ErrInstall: creating the environment or installing its requirements failed; the message has pip's reason.
	ErrInstall = errors.New("installing requirements failed")
	// ErrClosed: the manager is closed.
	ErrClosed = errors.New("environment manager closed")
)

// Files inside an environment and beside it.
const (
	markerFile    = ".faas-gpu-env"
	usedFile      = ".faas-gpu-used"
	useLockSuffix = ".lock"
	installSuffix = ".install.lock"
)

// Config configures a Manager. Dir is required.
type Config struct {
	// Dir holds the environments.
	Dir string
	// Python is the interpreter environments are created from (python -m venv); default "python3".
	Python string
	// MaxAge: Prune removes environments no function has started on for longer than this; 0 keeps them.
	MaxAge time.Duration
	// InstallTimeout bounds one install (creating the environment and pip install); default 30 minutes.
	InstallTimeout time.Duration
	// Start starts the python and pip processes; default (*exec.Cmd).Start, with a process group of its own when
	// cmd.SysProcAttr is nil. The local backend starts them from its spawner thread with a parent-death signal.
	Start func(cmd *exec.Cmd) error
	// Sandbox, when it isolates, runs every install in a sandbox of its own (installer.go); nil or not isolating:
	// pip runs as this process.
	Sandbox *sandbox.Sandbox
}

// Manager creates and hands out environments. It is safe for concurrent use, and several processes (each with its
// own Manager) may share one Dir.
type Manager struct {
	cfg    Config
	python func(ctx context.Context) (interp, error)

	installs, failures, reuses atomic.Int64

	mu     sync.Mutex
	held   map[string]*os.File // shared use locks, one per environment handed out, until Close
	closed bool
}

// Env is a ready environment.
type Env struct {
	// Name is the environment's folder name, e.g. py3.11-0123456789abcdef.
	Name string
	// Dir is its absolute path (VIRTUAL_ENV).
	Dir string
	// Python is its interpreter, Dir/bin/python3.
	Python string
	// Installed is true when this call installed it (false: it existed, or another caller installed it meanwhile).
	Installed bool
}

// Stats counts what a Manager did.
type Stats struct {
	// Installs counts pip installs this Manager ran (successful or not).
	Installs int64
	// Failures counts the installs that failed.
	Failures int64
	// Reuses counts Ensure calls answered with an environment that existed (or that another caller installed).
	Reuses int64
}

// Open prepares Dir and returns a Manager.
func Open(cfg Config) (*Manager, error) {
	if cfg.Dir == "" {
		return nil, errors.New("venv: Dir is required")
	}
	if cfg.Python == "" {
		cfg.Python = "python3"
	}
	if cfg.InstallTimeout <= 0 {
		cfg.InstallTimeout = 30 * time.Minute
	}
	if cfg.Start == nil {
		cfg.Start = func(cmd *exec.Cmd) error {
			if cmd.SysProcAttr == nil {
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			}
			return cmd.Start()
		}
	}
	if cfg.MaxAge < 0 {
		return nil, fmt.Errorf("venv: MaxAge %s must not be negative", cfg.MaxAge)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("venv: environment dir: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("venv: environment dir: %w", err)
	}
	if err := checkOwned(dir); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, held: map[string]*os.File{}}
	m.python = onceOK(func(ctx context.Context) (interp, error) { return probePython(ctx, cfg) })
	return m, nil
}

// checkOwned refuses an environment dir that another user owns or that others may write to: whoever can write
// there can put code into every function's interpreter.
func checkOwned(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("venv: environment dir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("venv: environment dir %s is not a folder", dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return fmt.Errorf("venv: environment dir %s belongs to uid %d, not to this user (uid %d)", dir, sys.Uid,
			os.Getuid())
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("venv: environment dir %s is writable by others (mode %v): chmod go-w it", dir,
			st.Mode().Perm())
	}
	return nil
}

// Dir is the folder holding the environments.
func (m *Manager) Dir() string { return m.cfg.Dir }

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	return Stats{Installs: m.installs.Load(), Failures: m.failures.Load(), Reuses: m.reuses.Load()}
}

// Name returns the folder name of the environment of req: the interpreter's version and a hash of the
// interpreter and the normalised requirements.
func (m *Manager) Name(ctx context.Context, req Requirements) (string, error) {
	py, err := m.python(ctx)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte("faas-gpu venv 1\n" + py.identity + "\n" + req.Text()))
	return "py" + py.version + "-" + hex.EncodeToString(sum[:8]), nil
}

// Ensure returns the environment of req, installing it first if no process has. progress receives what happens,
// line by line: the manager's own lines (prefixed "faas-gpu:") and pip's output. The environment stays in use (Prune
// leaves it alone) until Close. The error wraps ErrInvalidRequirements when a line is one Parse refuses, and
// ErrInstall when pip (or python -m venv) failed, with pip's reason (for the platform's logs: pip's errors may quote
// the requirements).
func (m *Manager) Ensure(ctx context.Context, req Requirements, progress io.Writer) (*Env, error) {
	if req.Empty() {
		return nil, errors.New("venv: no requirements to install")
	}
	if err := req.Check(); err != nil { // never shown the install: --find-links /the/state/dir, say
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	name, err := m.Name(ctx, req)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(m.cfg.Dir, name)
	env := &Env{Name: name, Dir: dir, Python: filepath.Join(dir, "bin", "python3")}

	use, err := lock(ctx, dir+useLockSuffix, syscall.LOCK_SH, nil)
	if err != nil {
		return nil, fmt.Errorf("venv: %s: %w", name, err)
	}
	if complete(dir) {
		return m.handOut(env, use, progress)
	}
	inst, err := lock(ctx, dir+installSuffix, syscall.LOCK_EX, func() {
		fmt.Fprintf(progress, "faas-gpu: waiting for another install of the same requirements into %s\n", name)
	})
	if err != nil {
		use.Close()
		return nil, fmt.Errorf("venv: %s: %w", name, err)
	}
	defer inst.Close()
	if complete(dir) { // installed while we waited
		return m.handOut(env, use, progress)
	}
	m.installs.Add(1)
	started := time.Now()
	fmt.Fprintf(progress, "faas-gpu: installing %d requirements (%s) into a new environment %s at %s\n",
		len(req.Lines), strings.Join(req.Files, " + "), name, dir)
	if err := m.install(ctx, env, req, progress, inst); err != nil {
		m.failures.Add(1)
		// Nobody else can be using an incomplete environment: we hold its install lock. The build folder goes last
		// (while it is there, nothing takes the environment for complete).
		rmErr := removeAll(dir)
		if rmErr == nil {
			rmErr = removeAll(dir + buildSuffix)
		}
		use.Close()
		fmt.Fprintf(progress, "faas-gpu: %v\n", err)
		return nil, errors.Join(err, rmErr)
	}
	env.Installed = true
	fmt.Fprintf(progress, "faas-gpu: environment %s installed in %s\n", name, time.Since(started).Round(time.Second))
	return m.handOut(env, use, nil)
}

// handOut marks a complete environment used and keeps its shared lock until Close.
func (m *Manager) handOut(env *Env, use *os.File, progress io.Writer) (*Env, error) {
	if err := touch(filepath.Join(env.Dir, usedFile)); err != nil {
		use.Close()
		return nil, fmt.Errorf("venv: %s: marking it used: %w", env.Name, err)
	}
	if !env.Installed {
		m.reuses.Add(1)
	}
	if progress != nil {
		fmt.Fprintf(progress, "faas-gpu: using the installed environment %s (nothing to download)\n", env.Name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		use.Close()
		return nil, ErrClosed
	}
	if _, ok := m.held[env.Name]; ok {
		use.Close() // one shared lock per environment is enough
	} else {
		m.held[env.Name] = use
	}
	return env, nil
}

// marker is the content of an environment's markerFile.
type marker struct {
	Requirements []string  `json:"requirements"`
	Files        []string  `json:"files"`
	Python       string    `json:"python"`
	Created      time.Time `json:"created"`
}

// install creates env afresh and pip-installs req into it; the install lock must be held. Sandboxed (Config.Sandbox),
// python -m venv and pip run in a sandbox of their own (installer.go), and the environment is sealed once they have
// ended; otherwise they run as this process and get the lock (so that it is held until they exit even if this
// process dies).
func (m *Manager) install(ctx context.Context, env *Env, req Requirements, progress io.Writer, lockf *os.File) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.InstallTimeout)
	defer cancel()
	build := env.Dir + buildSuffix
	for _, d := range []string{env.Dir, build} { // an interrupted install's remains
		if err := removeAll(d); err != nil {
			return fmt.Errorf("%w: %s: removing an incomplete environment: %w", ErrInstall, env.Name, err)
		}
	}
	py, err := m.python(ctx)
	if err != nil {
		return err
	}
	var in *installer
	if m.sandboxed() {
		if in, err = newInstaller(m.cfg.Sandbox, env, req, py, os.Environ()); err != nil {
			return fmt.Errorf("%w: %s: preparing the install: %w", ErrInstall, env.Name, err)
		}
		defer in.close()
		fmt.Fprintf(progress, "faas-gpu: installing in a sandbox as uid %d: it writes only %s and %s\n", in.id.UID,
			env.Dir, filepath.Join(build, "tmp"))
	} else if err := unsandboxedBuild(build, req); err != nil {
		return fmt.Errorf("%w: %s: preparing the install: %w", ErrInstall, env.Name, err)
	}
	command := func(argv ...string) (*exec.Cmd, func(), error) {
		if in != nil {
			return in.command(argv)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(childEnv(), pipProgressEnv...)
		cmd.ExtraFiles = []*os.File{lockf}
		return cmd, func() {}, nil
	}
	python := py.path
	if in != nil {
		python = py.exe // the real interpreter: a pyenv shim needs the shell and pyenv's whole tree
	}
	if err := m.run(ctx, progress, command, python, "-m", "venv", env.Dir); err != nil {
		return fmt.Errorf("%w: %s: %s -m venv: %w", ErrInstall, env.Name, python, err)
	}
	if err := m.run(ctx, progress, command, env.Python, "-m", "pip", "install", "--disable-pip-version-check",
		"--no-input", "--progress-bar", "on", "-r", filepath.Join(build, "requirements.txt")); err != nil {
		return fmt.Errorf("%w: %s: pip install: %w", ErrInstall, env.Name, err)
	}
	if in != nil {
		if err := seal(env.Dir, in.chowns()); err != nil {
			return fmt.Errorf("%w: %s: sealing the environment: %w", ErrInstall, env.Name, err)
		}
	}
	data, err := json.MarshalIndent(marker{Requirements: req.Lines, Files: req.Files, Python: py.identity,
		Created: time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFresh(filepath.Join(env.Dir, usedFile), nil); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInstall, env.Name, err)
	}
	tmp := filepath.Join(env.Dir, markerFile+".tmp")
	if err := writeFresh(tmp, data); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInstall, env.Name, err)
	}
	if err := removeAll(filepath.Join(env.Dir, markerFile)); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInstall, env.Name, err)
	}
	if err := os.Rename(tmp, filepath.Join(env.Dir, markerFile)); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInstall, env.Name, err)
	}
	if err := removeAll(build); err != nil { // last: the environment is complete from here on
		return fmt.Errorf("%w: %s: removing the install's work folder: %w", ErrInstall, env.Name, err)
	}
	return nil
}

// sandboxed reports whether installs run in a sandbox.
func (m *Manager) sandboxed() bool { return m.cfg.Sandbox != nil && m.cfg.Sandbox.Enabled() }

// unsandboxedBuild makes the work folder of an install that runs as this process: the requirements file only.
func unsandboxedBuild(build string, req Requirements) error {
	if err := os.Mkdir(build, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(build, "requirements.txt"), []byte(req.Text()), 0o600)
}

// run runs one command (made by command, whose release is called once it started), copying its output to progress
// as plain lines (progressFilter: pip's download bar becomes a line now and then with bytes, percent, speed and time
// left); a failure's error carries pip's ERROR lines (or the last lines of output).
func (m *Manager) run(ctx context.Context, progress io.Writer,
	command func(argv ...string) (*exec.Cmd, func(), error), argv ...string) error {
	cmd, release, err := command(argv...)
	if err != nil {
		return err
	}
	tail := &tailWriter{}
	out := newProgressFilter(io.MultiWriter(progress, tail), progressInterval, time.Now)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	err = m.cfg.Start(cmd)
	release()
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			// pip and whatever it started (a sandbox's init is its group's leader: its namespace ends with it)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	err = cmd.Wait()
	close(done)
	out.Flush()
	if ctx.Err() != nil {
		return fmt.Errorf("stopped: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("%v: %s", err, tail.summary())
	}
	return nil
}

// childEnv is this process's environment without what would point python at another installation.
func childEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE", "PIP_USER", "PIP_TARGET",
			"PIP_PREFIX", "PIP_REQUIRE_VIRTUALENV":
			continue
		}
		out = append(out, kv)
	}
	return out
}

// tailWriter keeps the last lines of a command's output, and the first of pip's lines that say it could not reach
// the package index.
type tailWriter struct {
	mu      sync.Mutex
	lines   []string
	part    string
	network string
}

// networkFailures are what pip prints (in its retry warnings) when it cannot reach the package index; its error
// then reads only "Could not find a version that satisfies the requirement".
var networkFailures = []string{"NewConnectionError", "Failed to establish a new connection",
	"Temporary failure in name resolution", "Name or service not known", "Network is unreachable",
	"ConnectTimeoutError", "ProxyError", "No route to host"}

const tailLines = 40

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	parts := strings.Split(w.part+string(p), "\n")
	w.part = parts[len(parts)-1]
	for _, l := range parts[:len(parts)-1] {
		if l = strings.TrimSpace(l); l != "" {
			w.lines = append(w.lines, l)
			for _, n := range networkFailures {
				if w.network == "" && strings.Contains(l, n) {
					w.network = l
				}
			}
		}
	}
	if len(w.lines) > tailLines {
		w.lines = w.lines[len(w.lines)-tailLines:]
	}
	return len(p), nil
}

// summary is pip's ERROR lines, else the last three lines.
func (w *tailWriter) summary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	lines := w.lines
	if w.part != "" {
		lines = append(lines, strings.TrimSpace(w.part))
	}
	var errs []string
	for _, l := range lines {
		if strings.HasPrefix(l, "ERROR:") || strings.HasPrefix(l, "Error:") {
			errs = append(errs, l)
		}
	}
	if len(errs) == 0 {
		errs = lines[max(0, len(lines)-3):]
	}
	if len(errs) == 0 {
		return "(no output)"
	}
	if w.network != "" {
		return "pip could not reach the package index (no network to PyPI? or set PIP_INDEX_URL, PIP_FIND_LINKS " +
			"or HTTPS_PROXY): " + strings.Join(errs, " | ") + " | first network error: " + w.network
	}
	return strings.Join(errs, " | ")
}

// complete reports whether dir is a complete environment: its marker is there and no install's work folder beside
// it. The marker is looked at first: an install's own code may write a marker while the work folder is there, never
// after it has gone.
func complete(dir string) bool {
	st, err := os.Lstat(filepath.Join(dir, markerFile))
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	_, err = os.Lstat(dir + buildSuffix)
	return errors.Is(err, fs.ErrNotExist)
}

// lock opens (creating) path and takes a flock on it, polling so that ctx can end the wait; waiting is called once
// if the lock is busy.
func lock(ctx context.Context, path string, how int, waiting func()) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for first := true; ; first = false {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if first && waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// Close releases the environments handed out (Prune may remove them once unused for MaxAge). Environments stay
// usable by the processes running on them.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	var errs []error
	for name, f := range m.held {
		errs = append(errs, f.Close())
		delete(m.held, name)
	}
	return errors.Join(errs...)
}

// interp is the base interpreter environments are created from.
type interp struct {
	path     string   // as configured (looked up on PATH)
	version  string   // major.minor, e.g. 3.11
	identity string   // implementation, full version, machine and the real path of the base executable
	exe      string   // the real executable (not a pyenv shim)
	prefixes []string // the folders of its installation, which a sandboxed install must see
}

const probeScript = `import os, platform, sys
base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
print("%d.%d" % sys.version_info[:2])
print(sys.implementation.name, platform.python_version(), platform.machine(), base)
print(os.path.realpath(sys.executable))
for p in sorted({sys.base_prefix, os.path.realpath(sys.base_prefix), sys.prefix, os.path.realpath(sys.prefix)}):
    print(p)`

func probePython(ctx context.Context, cfg Config) (interp, error) {
	path, err := exec.LookPath(cfg.Python)
	if err != nil {
		return interp{}, fmt.Errorf("%w: python interpreter %q: %w", ErrInstall, cfg.Python, err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-c", probeScript)
	cmd.Env = childEnv()
	out, err := cmd.Output()
	if err != nil {
		return interp{}, fmt.Errorf("%w: python interpreter %s: %w", ErrInstall, path, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 4 {
		return interp{}, fmt.Errorf("%w: python interpreter %s answered %q", ErrInstall, path, out)
	}
	return interp{path: path, version: strings.TrimSpace(lines[0]), identity: strings.TrimSpace(lines[1]),
		exe: strings.TrimSpace(lines[2]), prefixes: lines[3:]}, nil
}

// onceOK calls f until it succeeds once, then returns that result; a failure (a cancelled context) is retried.
func onceOK[T any](f func(ctx context.Context) (T, error)) func(ctx context.Context) (T, error) {
	var mu sync.Mutex
	var done bool
	var val T
	return func(ctx context.Context) (T, error) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return val, nil
		}
		v, err := f(ctx)
		if err != nil {
			return v, err
		}
		val, done = v, true
		return val, nil
	}
}
