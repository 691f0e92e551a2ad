package local

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/logs"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/local/venv"
)

// StatusAnnotation is added to a function's status (never to its deployment) while its pip requirements install
// and when the install failed, with what happened; `faas-cli describe` shows it.
const StatusAnnotation = "faas-gpu/status"

// envPrep is the preparation of a function's Python environment for one definition of the function: the first
// replica to start installs it (or finds it installed), the others wait for that result. A failure stays until the
// function is updated, so a broken requirements file is one clear error, not a crash loop of pip runs.
type envPrep struct {
	done    chan struct{}
	started time.Time
	files   string    // the requirements files, for messages
	env     *venv.Env // set when done without error
	err     error     // set when done: the install failed (wraps provider.ErrFailed)
	// progress is the latest line of pip's that says how the install advances (progress.go).
	progress installProgress
}

// envFailed marks a replica start that must not be retried: the function's environment failed to install.
type envFailed struct{ err error }

func (e *envFailed) Error() string { return e.err.Error() }
func (e *envFailed) Unwrap() error { return e.err }

// openEnvs opens the environment manager and removes what it no longer needs (interrupted installs, environments
// unused for EnvMaxAge).
func openEnvs(ctx context.Context, cfg Config, start func(*exec.Cmd) error, log interface {
	Info(string, ...any)
}) (*venv.Manager, error) {
	// Installs run sandboxed where functions do: the code an install runs (an sdist's setup.py, a build backend)
	// is the function author's choice, as the function's own code is.
	m, err := venv.Open(venv.Config{Dir: cfg.EnvDir, Python: cfg.Python, MaxAge: cfg.EnvMaxAge, Start: start,
		Sandbox: cfg.Sandbox})
	if err != nil {
		return nil, fmt.Errorf("local backend: %w", err)
	}
	removed, err := m.Prune(ctx)
	if len(removed) > 0 {
		log.Info("removed unused Python environments", "dir", m.Dir(), "removed", strings.Join(removed, ","))
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("local backend: %w", err), m.Close())
	}
	return m, nil
}

// requirementsOf reads a function's pip requirements: those of its build context, or of the template and handler
// folders it is assembled from (deploy checks them before anything is assembled: assembled false). Each file is
// read inside its folder only (venv.ReadAs): a link out of it is refused, naming the file.
func (b *Backend) requirementsOf(fn recordView, dir string, assembled bool) (venv.Requirements, error) {
	var req venv.Requirements
	var err error
	if dir != b.assembledApp(fn) || assembled {
		req, err = venv.Read(dir)
	} else { // the fallback, not assembled yet: each file read inside its own folder
		tpl := filepath.Join(b.cfg.TemplatesDir, b.cfg.Template)
		handler := filepath.Join(b.cfg.FunctionsDir, fn.name)
		var t, h venv.Requirements
		if t, err = venv.ReadAs(tpl, "requirements.txt", "requirements.txt"); err == nil {
			h, err = venv.ReadAs(handler, "requirements.txt", "function/requirements.txt")
		}
		req = venv.Join(t, h)
	}
	if err != nil {
		return venv.Requirements{}, fmt.Errorf("%w: function %q: %w", provider.ErrInvalid, fn.name, err)
	}
	return req, nil
}

// functionEnv returns the Python environment a replica of fn runs in, installing it on first use; nil when the
// function has no pip requirements. An install failure is returned as *envFailed (wrapping provider.ErrFailed).
func (b *Backend) functionEnv(ctx context.Context, fn *function, r *replica, rec record, dir string) (*venv.Env, error) {
	req, err := b.requirementsOf(view(rec), dir, true)
	if err != nil {
		return nil, b.cannotStart(fn, r, "its requirements were refused", err)
	}
	if req.Empty() {
		return nil, nil
	}
	for {
		b.mu.Lock()
		p, owner := fn.prep, false
		if p == nil {
			p = &envPrep{done: make(chan struct{}), started: time.Now(), files: strings.Join(req.Files, " + ")}
			fn.prep, owner = p, true
		}
		b.mu.Unlock()
		if owner {
			return b.install(ctx, fn, r, p, req)
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if p.err != nil {
			return nil, &envFailed{p.err}
		}
		if p.env != nil {
			return p.env, nil
		}
		// The installing replica was stopped before it finished: try again, perhaps as the installer.
	}
}

// install runs the environment manager for p, which this replica owns, and publishes the result.
func (b *Backend) install(ctx context.Context, fn *function, r *replica, p *envPrep, req venv.Requirements) (*venv.Env, error) {
	emit := func(text string) {
		if !strings.HasPrefix(text, "faas-gpu: ") {
			if progressLine(text) { // progress.go: also in up's output and the function's status
				p.progress.set(strings.TrimSpace(text))
				b.log.Info("installing the function's requirements", "function", fn.name,
					"progress", strings.TrimSpace(text))
			}
			text = "pip: " + text
		}
		fn.logs.append(logs.Message{Name: fn.name, Namespace: fn.ns, Instance: r.id,
			Timestamp: time.Now().UTC(), Text: text})
	}
	progress := &lineWriter{emit: emit}
	b.log.Info("preparing the function's Python environment", "function", fn.name, "requirements", p.files)
	env, err := b.envs.Ensure(ctx, req, progress)
	progress.flush()
	if err != nil && ctx.Err() != nil { // stopped, not failed: the next replica to start tries again
		b.mu.Lock()
		if fn.prep == p {
			fn.prep = nil
		}
		b.mu.Unlock()
		close(p.done)
		return nil, ctx.Err()
	}
	if err != nil {
		// Callers (an anonymous POST /function/<name> included) are told that it failed, never how: pip's errors
		// quote the requirements. The detail is in the function's logs (Ensure wrote it there) and up's.
		p.err = publicFailure(fn.name, "installing its requirements ("+p.files+") failed")
		b.log.Error("installing the function's requirements failed", "function", fn.name, "err", err)
		close(p.done)
		b.mu.Lock()
		fn.notifyLocked() // requests waiting in Route get the reason now
		b.mu.Unlock()
		return nil, &envFailed{p.err}
	}
	p.env = env
	close(p.done)
	return env, nil
}

// publicFailure is what any caller is told about a function that cannot start until it is updated: what failed,
// in the platform's words, and where the detail is; nothing the function's files or pip said.
func publicFailure(name, what string) error {
	return fmt.Errorf("%w: function %q: %s; see the function's logs (faas-cli logs %s)", provider.ErrFailed, name,
		what, name)
}

// cannotStart records that fn cannot start until it is updated (its build context or requirements were refused):
// the detail goes to the function's logs and up's, callers get publicFailure (through envState, so a request
// waiting in Route is answered at once). It returns the replica's error (*envFailed: not retried).
func (b *Backend) cannotStart(fn *function, r *replica, what string, detail error) error {
	fn.event(r.id, "%s: %v", what, detail)
	b.log.Error("function cannot start: "+what, "function", fn.name, "instance", r.id, "err", detail)
	public := publicFailure(fn.name, what)
	b.mu.Lock()
	defer b.mu.Unlock()
	if fn.prep == nil {
		p := &envPrep{done: make(chan struct{}), started: time.Now(), err: public}
		close(p.done)
		fn.prep = p
		fn.notifyLocked()
	}
	return &envFailed{public}
}

// envState describes a function's environment for Status and Resolve: "" when there is nothing to say.
func (fn *function) envState() (text string, failed error) {
	p := fn.prep
	if p == nil {
		return "", nil
	}
	select {
	case <-p.done:
		if p.err != nil {
			return "failed: " + p.err.Error() + " (update or redeploy it to try again)", p.err
		}
		return "", nil
	default:
		text := fmt.Sprintf("installing %s since %s", p.files, p.started.UTC().Format(time.RFC3339))
		if last := p.progress.get(); last != "" {
			text += ": " + last
		}
		return text + " (see the function's logs)", nil
	}
}

// withStatus returns annotations plus StatusAnnotation when text is set; the deployment's map is not changed.
func withStatus(annotations *map[string]string, text string) *map[string]string {
	if text == "" {
		return annotations
	}
	out := map[string]string{}
	if annotations != nil {
		maps.Copy(out, *annotations)
	}
	out[StatusAnnotation] = text
	return &out
}

// interpreter is the argv a replica runs (command's) with the function's environment's python in place of
// Config.Python (or a bare python name) when it has an environment.
func (b *Backend) interpreter(argv []string, env *venv.Env) []string {
	if env == nil {
		return argv
	}
	if argv[0] == b.cfg.Python || pythonName.MatchString(argv[0]) {
		argv = append([]string{env.Python}, argv[1:]...)
	}
	return argv
}

// envVars puts a function's environment first on PATH and names it in VIRTUAL_ENV, as activating it would.
func envVars(vars []string, env *venv.Env) []string {
	if env == nil {
		return vars
	}
	out := make([]string, 0, len(vars)+2)
	path := ""
	for _, kv := range vars {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH":
			path = v
			continue
		case "VIRTUAL_ENV", "PYTHONHOME":
			continue
		}
		out = append(out, kv)
	}
	bin := filepath.Join(env.Dir, "bin")
	if path != "" {
		bin += string(os.PathListSeparator) + path
	}
	return append(out, "PATH="+bin, "VIRTUAL_ENV="+env.Dir)
}
