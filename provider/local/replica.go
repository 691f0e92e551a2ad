package local

import (
	"context"
	"errors"

	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openfaas/faas-provider/logs"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

// HealthPath is the path a replica answers once it is ready (of-watchdog's health endpoint, which index.py serves).
// Any answer below 500 counts as ready, so an entrypoint without the endpoint is ready once it serves HTTP.
const HealthPath = "/_/health"

// stableRun is how long a replica must run before a crash resets its restart backoff.
const stableRun = 30 * time.Second

// replica is one supervised process of a function; the process is restarted under the same replica until the
// replica is stopped.
type replica struct {
	id     string
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	url      *url.URL      // set while ready
	pgid     int           // process group of the running process, 0 when none
	inflight int           // requests Route gave this replica that have not ended
	drain    bool          // stop: SIGTERM only once the requests in flight have ended
	idle     chan struct{} // closed when inflight drops to 0 while draining
}

func (r *replica) setReady(u *url.URL) {
	r.mu.Lock()
	r.url = u
	r.mu.Unlock()
}

func (r *replica) readyURL() *url.URL {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.url
}

func (r *replica) setProcess(pgid int) {
	r.mu.Lock()
	r.pgid = pgid
	r.mu.Unlock()
}

// pid is the process id of the running process (its process group id), 0 when none.
func (r *replica) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pgid
}

// kill sends SIGKILL to the replica's process group, if a process runs.
func (r *replica) kill() {
	if pg := r.pid(); pg > 0 {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
	}
}

// stop ends the replica. The caller has taken it out of its function's lists (under Backend.mu), so Route gives
// it no request any more; with drain, its process is stopped only once the requests it was given have ended (an
// update or a scale-down), else at once (delete, close).
func (r *replica) stop(drain bool) {
	r.mu.Lock()
	r.drain = drain
	r.mu.Unlock()
	r.cancel()
}

// begin counts a request Route gave the replica; end is called when it has ended.
func (r *replica) begin() {
	r.mu.Lock()
	r.inflight++
	r.mu.Unlock()
}

func (r *replica) end() {
	r.mu.Lock()
	r.inflight--
	if r.inflight == 0 && r.idle != nil {
		close(r.idle)
		r.idle = nil
	}
	r.mu.Unlock()
}

// drained returns a channel that is closed once the replica has no request in flight; nil when stop did not ask
// to drain or nothing is in flight.
func (r *replica) drained() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.drain || r.inflight == 0 {
		return nil
	}
	if r.idle == nil {
		r.idle = make(chan struct{})
	}
	return r.idle
}

// supervise runs a replica's process until ctx ends, restarting it with exponential backoff whenever it exits.
func (b *Backend) supervise(ctx context.Context, fn *function, r *replica, rec record) {
	defer b.wg.Done()
	defer close(r.done)
	backoff := b.cfg.BackoffMin
	for {
		started := time.Now()
		err := b.runOnce(ctx, fn, r, rec)
		if ctx.Err() != nil {
			fn.event(r.id, "stopped")
			return
		}
		var failed *envFailed
		if errors.As(err, &failed) { // restarting cannot help: wait for an update (which stops this replica)
			fn.event(r.id, "%v; not restarting until the function is updated", err) // err says "cannot start: "
			b.log.Error("function replica cannot start", "function", fn.name, "instance", r.id, "err", err)
			<-ctx.Done()
			fn.event(r.id, "stopped")
			return
		}
		if time.Since(started) > stableRun {
			backoff = b.cfg.BackoffMin
		}
		fn.event(r.id, "%v; restarting in %s", err, backoff)
		b.log.Warn("function replica ended; restarting", "function", fn.name, "instance", r.id, "err", err,
			"backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			fn.event(r.id, "stopped")
			return
		case <-t.C:
		}
		backoff = min(2*backoff, b.cfg.BackoffMax)
	}
}

// runOnce starts the function's process, marks the replica ready once it answers HealthPath and returns when the
// process exits (its exit error) or ctx ends (after draining and stopping the process).
func (b *Backend) runOnce(ctx context.Context, fn *function, r *replica, rec record) error {
	dir, err := b.source(view(rec), r.id)
	if err == nil {
		dir, err = b.readableContext(fn.name, r.id, dir) // readable.go
	}
	if errors.Is(err, shrinkwrap.ErrUnsafeEntry) { // a link out of the context: refused until the function is updated
		return b.cannotStart(fn, r, "its build context was refused", err)
	}
	if err != nil {
		return err
	}
	env, err := b.functionEnv(ctx, fn, r, rec, dir)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	argv := b.interpreter(b.command(rec), env)
	vars := envVars(b.env(rec, r.id, port), env)
	var cmd *exec.Cmd
	release := func() {}
	if b.isolated() {
		if cmd, release, err = b.sandboxCommand(ctx, rec, r.id, argv, vars, dir, env); err != nil {
			return err
		}
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Env = vars
		cmd.SysProcAttr = childAttrs()
	}
	var last lastLine // why a process that exits before it is ready ended, in its own words (rollout.go)
	emit := func(text string) {
		last.set(text)
		fn.logs.append(logs.Message{Name: fn.name, Namespace: fn.ns, Instance: r.id,
			Timestamp: time.Now().UTC(), Text: text})
	}
	stdout, stderr := &lineWriter{emit: emit}, &lineWriter{emit: emit}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	err = b.spawner.start(ctx, cmd)
	release()
	if err != nil {
		return fmt.Errorf("starting %s: %w", strings.Join(argv, " "), err)
	}
	pid := cmd.Process.Pid
	r.setProcess(pid)
	defer r.setProcess(0)
	fn.event(r.id, "started %s (pid %d, port %d) in %s", strings.Join(argv, " "), pid, port, dir)
	b.log.Info("function replica started", "function", fn.name, "instance", r.id, "pid", pid, "port", port)
	var exitErr error
	exited := make(chan struct{}) // closed once the process has exited; exitErr is then its Wait error
	go func() {
		exitErr = cmd.Wait()
		stdout.flush()
		stderr.flush()
		close(exited)
	}()
	// Whatever the process left behind in its group goes with it.
	defer func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }()

	u := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ready := false; !ready; {
		select {
		case <-exited:
			err := fmt.Errorf("exited before it was ready: %s%s", exitText(exitErr), last.suffix())
			b.startFailed(fn, err)
			return err
		case <-ctx.Done():
			b.stopProcess(pid, exited)
			return ctx.Err()
		case <-tick.C:
			ready = b.healthy(ctx, u)
		}
	}
	r.setReady(u)
	fn.event(r.id, "ready on %s", u.Host)
	b.replicaReady(fn)
	defer r.setReady(nil)
	select {
	case <-exited:
		r.setReady(nil)
		return fmt.Errorf("exited: %s", exitText(exitErr))
	case <-ctx.Done():
		r.setReady(nil)
		b.drain(fn, r, exited)
		b.stopProcess(pid, exited)
		return ctx.Err()
	}
}

// drain waits until the requests in flight on a stopped replica have ended, DrainTimeout passes, the process exits
// or the backend closes.
func (b *Backend) drain(fn *function, r *replica, exited <-chan struct{}) {
	idle := r.drained()
	if idle == nil {
		return
	}
	t := time.NewTimer(b.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-idle:
	case <-exited:
	case <-b.base.Done():
	case <-t.C:
		fn.event(r.id, "requests still in flight after %s; stopping anyway", b.cfg.DrainTimeout)
		b.log.Warn("function replica did not drain; stopping it", "function", fn.name, "instance", r.id,
			"drain_timeout", b.cfg.DrainTimeout)
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// stopProcess sends SIGTERM to the process group and SIGKILL after StopTimeout, and waits for the process.
func (b *Backend) stopProcess(pgid int, exited <-chan struct{}) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(b.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-exited:
		return
	case <-t.C:
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-exited
}

// healthy asks a replica's HealthPath once.
func (b *Backend) healthy(ctx context.Context, u *url.URL) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String()+HealthPath, nil)
	if err != nil {
		return false
	}
	resp, err := b.health.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode < 500
}

// env is a replica's environment: the machine's few variables of this process (baseEnv: never the platform's
// settings or credentials), then Config.Env, then the function's envVars, then what the backend decides (PORT,
// OPENFAAS_SECRETS_DIR, HOSTNAME, the GPU settings, fprocess).
func (b *Backend) env(rec record, instance string, port int) []string {
	m := b.baseEnv()
	for k, v := range b.cfg.Env {
		m[k] = v
	}
	for k, v := range rec.Deployment.EnvVars {
		m[k] = v
	}
	name := recKey(rec)
	if rec.Deployment.EnvProcess != "" {
		m["fprocess"] = rec.Deployment.EnvProcess
	}
	for k, v := range b.gpuEnv(rec) {
		m[k] = v
	}
	m["PORT"] = strconv.Itoa(port)
	m["OPENFAAS_SECRETS_DIR"] = b.secretsDir(name)
	m["HOSTNAME"] = instance
	m["PYTHONUNBUFFERED"] = "1"
	m["PYTHONDONTWRITEBYTECODE"] = "1"
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// gpuEnv is the GPU settings of a GPU function's replicas: its whole spec (as the cluster backends pass it: a
// function that registers itself, FAAS_GPU_SELF_REGISTER=1, keeps its SLO) and Config.GPUEnv; nil for a function
// without a GPU.
func (b *Backend) gpuEnv(rec record) map[string]string {
	var annotations map[string]string
	if rec.Deployment.Annotations != nil {
		annotations = *rec.Deployment.Annotations
	}
	gpuName := gpuspec.FunctionName(rec.Deployment.Service, rec.Deployment.Namespace)
	spec, isGPU, err := gpuspec.Parse(annotations, gpuName)
	if err != nil || !isGPU {
		return nil
	}
	m := map[string]string{
		contract.EnvGPU:         "1",
		contract.EnvFunction:    gpuName,
		contract.EnvMemoryBytes: strconv.FormatUint(spec.MemoryBytes, 10),
		contract.EnvSLO:         spec.SLO.String(),
		contract.EnvPercentile:  strconv.FormatFloat(spec.Percentile, 'g', -1, 64),
		contract.EnvIsolation:   spec.Isolation,
	}
	if spec.Scratch != "" {
		m[contract.EnvScratch] = spec.Scratch
	}
	if spec.Model != "" {
		m[contract.EnvModel] = spec.Model
	}
	if b.cfg.GPUEnv != nil {
		for k, v := range b.cfg.GPUEnv(gpuName) {
			m[k] = v
		}
	}
	return m
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago. If another process takes it first, the
// replica fails to bind, exits and is restarted on another port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	return port, nil
}

func view(rec record) recordView {
	return recordView{name: rec.Deployment.Service, key: recKey(rec), image: rec.Deployment.Image,
		envProcess: rec.Deployment.EnvProcess}
}

// secretsDir is the folder of a function's secret files, OPENFAAS_SECRETS_DIR of its replicas.
func (b *Backend) secretsDir(name string) string {
	return filepath.Join(b.absState, "run", name, "secrets")
}
