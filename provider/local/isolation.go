package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/provider/local/sandbox"
	"github.com/faas-gpu/faas-gpu/provider/local/venv"
)

// What a replica's process is given when Config.Sandbox isolates functions: the sandbox package does the work;
// this file decides what the function sees.

// socketVars are the variables that name the platform's Unix sockets a function connects to. Only their values in
// Config.Env and Config.GPUEnv count (a deployment's envVars could name any socket of the machine).
var socketVars = []string{contract.EnvSocket, contract.EnvRemotingSocket}

// machineVars are the variables of this process a function's environment starts from: they describe the machine
// (where programs are, the language, the time zone), never the platform. The rest of the platform's environment
// (its flags' FAAS_GPU_* variables, credentials an operator exported, ...) stays out.
func machineVar(k string) bool {
	switch k {
	case "PATH", "LANG", "LANGUAGE", "TZ":
		return true
	}
	return strings.HasPrefix(k, "LC_")
}

// isolated reports whether replicas run sandboxed.
func (b *Backend) isolated() bool { return b.cfg.Sandbox != nil && b.cfg.Sandbox.Enabled() }

// Isolation reports what the backend's sandbox isolates; nil Sandbox: nothing.
func (b *Backend) Isolation() sandbox.Report {
	if b.cfg.Sandbox == nil {
		return sandbox.Report{Mode: sandbox.ModeOff, Reason: "no sandbox configured"}
	}
	return b.cfg.Sandbox.Report()
}

// baseEnv is the start of a replica's environment: machineVar variables of this process, and a home and temporary
// folder (this process's own when not isolated; the sandbox's private /tmp otherwise).
func (b *Backend) baseEnv() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && machineVar(k) {
			m[k] = v
		}
	}
	if b.isolated() {
		m["HOME"], m["TMPDIR"] = "/tmp", "/tmp"
		return m
	}
	for _, k := range []string{"HOME", "TMPDIR", "USER", "LOGNAME"} {
		if v, ok := os.LookupEnv(k); ok {
			m[k] = v
		}
	}
	return m
}

// platformEnv is what the platform itself gives rec's replicas (Config.Env, and Config.GPUEnv for a GPU function),
// without the deployment's envVars.
func (b *Backend) platformEnv(rec record) map[string]string {
	m := map[string]string{}
	for k, v := range b.cfg.Env {
		m[k] = v
	}
	for k, v := range b.gpuEnv(rec) {
		m[k] = v
	}
	return m
}

// pythonInstall is Config.Python resolved for sandboxes: the executable to run and the folders of its installation.
// The executable is the real one (not a pyenv shim, which needs the shell and pyenv's whole tree), except for the
// interpreter of a virtual environment (e.g. --python .venv/bin/python3): that is the environment's own bin/python,
// a link to the base interpreter, which Python resolves to the environment only when started by that name (started
// as the base interpreter it would not see the environment's packages). The folders are the base installation's and
// the environment's, shown read-only.
type pythonInstall struct {
	exe      string
	prefixes []string
}

const pythonInstallScript = `import os, sys
exe = os.path.realpath(sys.executable)
if sys.prefix != sys.base_prefix:
    exe = os.path.abspath(sys.executable)
    if os.path.dirname(exe) != os.path.join(sys.prefix, "bin"):
        exe = os.path.join(sys.prefix, "bin", "python3")
print(exe)
for p in {sys.base_prefix, os.path.realpath(sys.base_prefix), sys.prefix, os.path.realpath(sys.prefix)}:
    print(p)`

// pythons resolves Config.Python once (a failure, e.g. a cancelled start, is tried again by the next replica).
type pythons struct {
	mu   sync.Mutex
	done *pythonInstall
}

func (p *pythons) get(ctx context.Context, python string) (*pythonInstall, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return p.done, nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", pythonInstallScript)
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "PYTHON") && k != "VIRTUAL_ENV" {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("finding the installation of %s for the sandbox: %w", python, err)
	}
	lines := strings.Fields(string(out))
	if len(lines) < 2 {
		return nil, fmt.Errorf("finding the installation of %s for the sandbox: it printed %q", python, out)
	}
	p.done = &pythonInstall{exe: lines[0], prefixes: lines[1:]}
	return p.done, nil
}

// sandboxCommand returns the command that runs a replica of rec in its sandbox: argv with the environment vars in
// dir (its build context), which it sees read-only with the system's folders, its Python environment and
// interpreter, its secrets, the shim's folders and the platform's sockets; nothing of the state dir, other functions
// or other processes.
func (b *Backend) sandboxCommand(ctx context.Context, rec record, instance string, argv, vars []string, dir string,
	env *venv.Env) (*exec.Cmd, func(), error) {
	name := recKey(rec) // its identity, secrets and root are its key's: two namespaces may hold one name
	shown := append(sandbox.SystemPaths(), dir, b.secretsDir(name))
	if env != nil {
		shown = append(shown, env.Dir)
	}
	argv = append([]string(nil), argv...)
	switch {
	case env != nil && argv[0] == env.Python:
		py, err := b.pythons.get(ctx, b.cfg.Python)
		if err != nil {
			return nil, nil, err
		}
		shown = append(shown, py.prefixes...)
	case argv[0] == b.cfg.Python:
		py, err := b.pythons.get(ctx, b.cfg.Python)
		if err != nil {
			return nil, nil, err
		}
		argv[0] = py.exe
		shown = append(shown, py.prefixes...)
	default:
		exe, err := exec.LookPath(argv[0])
		if err == nil && !filepath.IsAbs(exe) {
			exe, err = filepath.Abs(exe)
		}
		if err == nil && !strings.HasPrefix(argv[0], ".") { // ./start.sh runs from the build context
			argv[0] = exe
			if real, err := filepath.EvalSymlinks(exe); err == nil {
				shown = append(shown, filepath.Dir(filepath.Dir(real))) // e.g. /opt/node of /opt/node/bin/node
			}
		}
	}
	platform := b.platformEnv(rec)
	id := b.cfg.Sandbox.Identity(name)
	var sockets []string
	for _, k := range socketVars {
		p := platform[k]
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil || fi.Mode()&os.ModeSocket == 0 {
			continue
		}
		sockets = append(sockets, p)
		// A function with ids of its own connects through the socket's group (up's sockets have the sandbox's
		// group; a standalone gpuserver's, its -socket-group), never the root group.
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && len(id.Groups) > 0 && st.Gid != 0 && fi.Mode()&0o060 == 0o060 &&
			!slices.Contains(id.Groups, st.Gid) {
			id.Groups = append(id.Groups, st.Gid)
		}
	}
	for _, d := range filepath.SplitList(platform["LD_LIBRARY_PATH"]) { // the shim's folder
		if filepath.IsAbs(d) {
			shown = append(shown, d)
		}
	}
	root := filepath.Join(b.absState, "run", name, "root")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, nil, fmt.Errorf("sandbox root of %q: %w", name, err)
	}
	// The build context was checked (readable.go) as a folder: one swapped for a link since is refused, not shown.
	return b.cfg.Sandbox.Command(sandbox.Spec{Argv: argv, Env: vars, Dir: dir, Root: root, Hostname: instance,
		ReadOnly: shown, Folders: []string{dir}, Sockets: sockets, ID: id})
}

// secretsOwner is who owns a function's copies of its secrets: the function's own user when it has one (the
// platform runs as root and sandboxes functions), else this process (-1: unchanged).
func (b *Backend) secretsOwner(function string) (uid, gid int) {
	if !b.isolated() {
		return -1, -1
	}
	if _, ok := b.cfg.Sandbox.SocketGroup(); !ok {
		return -1, -1
	}
	id := b.cfg.Sandbox.Identity(function)
	return int(id.UID), int(id.GID)
}
