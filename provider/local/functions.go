package local

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
	"github.com/faas-gpu/faas-gpu/provider/gpuspec"
	"github.com/faas-gpu/faas-gpu/provider/names"
	"github.com/faas-gpu/faas-gpu/provider/validate"
)

// LabelScaleMin is the OpenFaaS label whose value is a function's replica count at deploy (default 1), and its
// fewest while it is autoscaled (package autoscale).
const LabelScaleMin = autoscale.LabelMin

// function is one deployed function and its replicas. Fields are guarded by Backend.mu.
type function struct {
	name string // the service's name
	ns   string // its namespace
	key  string // name, or name.namespace outside the default namespace (namespaces.go)
	rec  record
	// replicas run the current definition (rec). retiring run a previous one: they keep serving after an update
	// until every replica of the current definition is ready, then stop once their requests have ended.
	replicas []*replica
	retiring []*replica
	prep     *envPrep // the Python environment of this definition; nil until a replica starts, reset by Update
	logs     *logbook
	started  int    // replicas ever started, for instance names
	rr       uint64 // round-robin counter of Route and Resolve
	// changed is closed (and replaced) whenever a replica becomes ready or fails to start, or the function goes
	// away: it wakes the requests waiting in Route.
	changed chan struct{}
	// startFailures counts replicas that exited before they were ready; lastFailure is how the last one ended.
	startFailures uint64
	lastFailure   error
	// rollout is the rolling update in progress (rollout.go).
	rollout rollout
	// scaling is the function's com.openfaas.scale.* policy (package autoscale); load counts its requests in
	// flight for the autoscaler (autoscale.go).
	scaling autoscale.Policy
	load    loadGauge
}

// allReplicas returns the replicas of the current definition and the retiring ones; appending to the result never
// writes into fn.replicas.
func (fn *function) allReplicas() []*replica {
	return append(fn.replicas[:len(fn.replicas):len(fn.replicas)], fn.retiring...)
}

// newFunction prepares a function's run folder and log; the caller holds b.mu.
func (b *Backend) newFunction(rec record) (*function, error) {
	ns := rec.Deployment.Namespace
	if ns == "" {
		ns = provider.DefaultNamespace
	}
	key := recKey(rec)
	if err := b.syncSecrets(key, ns, rec.Deployment.Secrets); err != nil {
		return nil, err
	}
	fn := &function{name: rec.Deployment.Service, ns: ns, key: key, rec: rec, changed: make(chan struct{}),
		logs: newLogbook(b.cfg.LogLines, filepath.Join(b.cfg.StateDir, "logs", key+".log"))}
	fn.scaling = b.scalingOf(rec.Deployment)
	return fn, nil
}

// scalingOf is a deployment's scaling policy. Deploy and Update refuse a bad one (check); a record restored with
// one that is bad now (written by an older version) keeps its replica count, unscaled, with a warning.
func (b *Backend) scalingOf(fd types.FunctionDeployment) autoscale.Policy {
	p, err := parseScaling(fd, b.cfg.MaxReplicas)
	if err != nil {
		b.log.Warn("function's scaling labels are invalid: not autoscaled", "function", fd.Service, "err", err)
		return autoscale.Policy{Min: 1, Max: b.cfg.MaxReplicas}
	}
	return p
}

// parseScaling reads a deployment's com.openfaas.scale.* labels and annotations.
func parseScaling(fd types.FunctionDeployment, maxReplicas uint64) (autoscale.Policy, error) {
	var labels, annotations map[string]string
	if fd.Labels != nil {
		labels = *fd.Labels
	}
	if fd.Annotations != nil {
		annotations = *fd.Annotations
	}
	return autoscale.Parse(labels, annotations, maxReplicas)
}

// scaleLocked starts replicas of the current definition, or stops the newest ones, until the function has n; it
// returns the replicas being stopped (draining their requests when drain is set), whose done channels the caller
// may wait on after releasing b.mu.
func (b *Backend) scaleLocked(fn *function, n uint64, drain bool) []*replica {
	for uint64(len(fn.replicas)) < n {
		fn.started++
		ctx, cancel := context.WithCancel(b.base)
		r := &replica{id: fmt.Sprintf("%s-%d", fn.key, fn.started), cancel: cancel, done: make(chan struct{})}
		fn.replicas = append(fn.replicas, r)
		b.wg.Add(1)
		go b.supervise(ctx, fn, r, fn.rec)
	}
	var stopped []*replica
	for uint64(len(fn.replicas)) > n {
		r := fn.replicas[len(fn.replicas)-1]
		fn.replicas = fn.replicas[:len(fn.replicas)-1]
		r.stop(drain)
		stopped = append(stopped, r)
	}
	return stopped
}

// waitStopped waits until every replica has stopped, or ctx ends (the replicas still stop).
func waitStopped(ctx context.Context, reps []*replica) error {
	for _, r := range reps {
		select {
		case <-r.done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for replicas to stop: %w", ctx.Err())
		}
	}
	return nil
}

// check validates a deployment and fills its namespace.
func (b *Backend) check(fd *types.FunctionDeployment) error {
	if err := validate.Deployment(*fd); err != nil {
		return err
	}
	ns, err := b.namespace(fd.Namespace)
	if err != nil {
		return err
	}
	fd.Namespace = ns
	if fd.Image == "" {
		return fmt.Errorf("%w: image is required", provider.ErrInvalid)
	}
	var annotations map[string]string
	if fd.Annotations != nil {
		annotations = *fd.Annotations
	}
	if _, _, err := gpuspec.Parse(annotations, fd.Service); err != nil {
		return err
	}
	if _, err := parseScaling(*fd, b.cfg.MaxReplicas); err != nil {
		return err
	}
	for _, s := range fd.Secrets {
		if err := names.Secret("secrets", s); err != nil {
			return err
		}
		if _, err := os.Stat(b.secretPath(ns, s)); err != nil {
			return fmt.Errorf("%w: secrets: secret %q does not exist in namespace %s (create it first)",
				provider.ErrInvalid, s, ns)
		}
	}
	v := recordView{name: fd.Service, key: fnKey(ns, fd.Service), image: fd.Image, envProcess: fd.EnvProcess}
	dir, err := b.source(v, "")
	if err != nil {
		return err
	}
	if err := b.checkContext(v, dir); err != nil {
		return err
	}
	_, err = b.requirementsOf(v, dir, false)
	return err
}

// initialReplicas reads LabelScaleMin (default 1), from the labels or else the annotations.
func (b *Backend) initialReplicas(fd types.FunctionDeployment) (uint64, error) {
	p, err := parseScaling(fd, b.cfg.MaxReplicas)
	if err != nil {
		return 0, err
	}
	return p.Min, nil
}

// Deploy records a function and starts its replicas (one, or LabelScaleMin). It returns once the replicas are
// starting; Status and Resolve tell when they are ready.
func (b *Backend) Deploy(ctx context.Context, fd types.FunctionDeployment) error {
	if err := b.check(&fd); err != nil {
		return err
	}
	n, err := b.initialReplicas(fd)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	key := fnKey(fd.Namespace, fd.Service)
	if _, ok := b.fns[key]; ok {
		return fmt.Errorf("%w: function %q in namespace %s", provider.ErrExists, fd.Service, fd.Namespace)
	}
	if _, err := names.Namespace(fd.Namespace, b.namespaceListLocked()); err != nil { // deleted meanwhile
		return err
	}
	rec := record{Deployment: fd, Replicas: n, CreatedAt: time.Now().UTC()}
	if err := b.saveRecord(rec); err != nil {
		return err
	}
	fn, err := b.newFunction(rec)
	if err != nil {
		return errors.Join(err, b.removeRecord(key))
	}
	b.fns[key] = fn
	b.scaleLocked(fn, n, false)
	b.log.Info("function deployed", "function", fd.Service, "namespace", fd.Namespace, "image", fd.Image,
		"replicas", n)
	return nil
}

// Update replaces a function's definition, keeping its replica count, as a rolling update: replicas of the new
// definition start at once, the ready replicas of the old one keep serving until every new one is ready, then stop
// once their requests have ended (replicas of the old definition that were not ready stop at once). It returns
// once the new replicas are starting.
func (b *Backend) Update(ctx context.Context, fd types.FunctionDeployment) error {
	// An unknown function is 404 before anything else, so that faas-cli falls back to POST.
	b.mu.Lock()
	_, known := b.fns[fnKey(fd.Namespace, fd.Service)]
	b.mu.Unlock()
	if !known && fd.Service != "" {
		return fmt.Errorf("%w: function %q", provider.ErrNotFound, fd.Service)
	}
	if err := b.check(&fd); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fn, err := b.functionLocked(fd.Namespace, fd.Service)
	if err != nil {
		return err
	}
	prev := fn.rec
	rec := fn.rec
	rec.Deployment = fd
	if err := b.saveRecord(rec); err != nil {
		return err
	}
	fn.rec = rec
	fn.scaling = b.scalingOf(fd)
	if err := b.syncSecrets(fn.key, fn.ns, fd.Secrets); err != nil {
		return err
	}
	for _, r := range fn.replicas {
		if r.readyURL() != nil {
			fn.retiring = append(fn.retiring, r)
		} else {
			r.stop(false)
		}
	}
	fn.replicas = nil
	fn.startRolloutLocked(prev)
	fn.startFailures, fn.lastFailure = 0, nil
	fn.prep = nil // the new definition prepares its environment afresh (a failed install is tried again)
	b.scaleLocked(fn, rec.Replicas, false)
	b.retireLocked(fn)
	b.log.Info("function updated", "function", fd.Service, "image", fd.Image, "replicas", rec.Replicas,
		"serving_until_ready", len(fn.retiring))
	return nil
}

// Delete removes a function's record, stops its replicas (waiting for them) and removes its log and run folder.
func (b *Backend) Delete(ctx context.Context, namespace, name string) error {
	fn, err := b.take(namespace, name)
	if err != nil {
		return err
	}
	werr := waitStopped(ctx, fn.replicas)
	fn.logs.close()
	logPath := filepath.Join(b.cfg.StateDir, "logs", fn.key+".log")
	for _, p := range []string{logPath, logPath + ".1"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			werr = errors.Join(werr, fmt.Errorf("local backend: removing log of %q: %w", name, err))
		}
	}
	if err := os.RemoveAll(filepath.Join(b.cfg.StateDir, "run", fn.key)); err != nil {
		werr = errors.Join(werr, fmt.Errorf("local backend: removing run folder of %q: %w", name, err))
	}
	if werr == nil && b.cfg.Sandbox != nil {
		b.cfg.Sandbox.Release(fn.key) // its replicas have stopped: its ids may go to another function
	}
	b.log.Info("function deleted", "function", name)
	return werr
}

// take removes a function from the backend and its record from disk, and cancels its replicas; fn.replicas keeps
// the stopping replicas.
func (b *Backend) take(namespace, name string) (*function, error) {
	ns, err := b.lookupArgs(namespace, name)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fn, err := b.functionLocked(ns, name)
	if err != nil {
		return nil, err
	}
	if err := b.removeRecord(fn.key); err != nil {
		return nil, err
	}
	delete(b.fns, fn.key)
	reps := fn.allReplicas()
	for _, r := range reps {
		r.stop(false)
	}
	fn.replicas, fn.retiring = reps, nil
	fn.notifyLocked()
	return fn, nil
}

// functionLocked returns a known function; b.mu must be held. It fails with ErrClosed after Close and wraps
// provider.ErrNotFound for an unknown name.
func (b *Backend) functionLocked(ns, name string) (*function, error) {
	if b.closed {
		return nil, ErrClosed
	}
	fn, ok := b.fns[fnKey(ns, name)]
	if !ok {
		return nil, fmt.Errorf("%w: function %q in namespace %s", provider.ErrNotFound, name, ns)
	}
	return fn, nil
}

func (b *Backend) lookupArgs(namespace, name string) (string, error) {
	if err := names.Function("function name", name); err != nil {
		return "", err
	}
	return b.namespace(namespace)
}

// List returns every function of a namespace, sorted by name.
func (b *Backend) List(ctx context.Context, namespace string) ([]types.FunctionStatus, error) {
	ns, err := b.namespace(namespace)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	out := make([]types.FunctionStatus, 0, len(b.fns))
	for _, fn := range b.fns {
		if fn.ns == ns {
			out = append(out, fn.status())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Status returns one function with its desired (Replicas) and ready (AvailableReplicas) replica counts.
func (b *Backend) Status(ctx context.Context, namespace, name string) (types.FunctionStatus, error) {
	ns, err := b.lookupArgs(namespace, name)
	if err != nil {
		return types.FunctionStatus{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fn, err := b.functionLocked(ns, name)
	if err != nil {
		return types.FunctionStatus{}, err
	}
	return fn.status(), nil
}

// status reports the function; AvailableReplicas counts the ready replicas of the current definition and, during a
// rolling update, those of the previous one that still serve.
func (fn *function) status() types.FunctionStatus {
	d := fn.rec.Deployment
	ready := uint64(0)
	for _, r := range fn.allReplicas() {
		if r.readyURL() != nil {
			ready++
		}
	}
	state, _ := fn.envState()
	switch {
	case state == "":
		state = fn.replicaStateLocked() // rollout.go
	case fn.rollout.previousImage != "":
		state += fmt.Sprintf("; the previous definition (image %s) keeps serving", fn.rollout.previousImage)
	}
	return types.FunctionStatus{
		Name: d.Service, Image: d.Image, Namespace: fn.ns, EnvProcess: d.EnvProcess,
		EnvVars: d.EnvVars, Constraints: d.Constraints, Secrets: d.Secrets, Labels: d.Labels,
		Annotations: withStatus(d.Annotations, state), Limits: d.Limits, Requests: d.Requests,
		ReadOnlyRootFilesystem: d.ReadOnlyRootFilesystem,
		Replicas:               fn.rec.Replicas, AvailableReplicas: ready, CreatedAt: fn.rec.CreatedAt,
	}
}

// Scale sets a function's replica count (0 to MaxReplicas) and records it; it returns once removed replicas have
// ended their requests and stopped (added ones are starting). An autoscaled function keeps the count until its
// autoscaler decides otherwise (package autoscale: a count set from outside counts as wanted for a window).
func (b *Backend) Scale(ctx context.Context, namespace, name string, replicas uint64) error {
	ns, err := b.lookupArgs(namespace, name)
	if err != nil {
		return err
	}
	if replicas > b.cfg.MaxReplicas {
		return fmt.Errorf("%w: replicas: %d is more than the local backend's maximum of %d", provider.ErrInvalid,
			replicas, b.cfg.MaxReplicas)
	}
	b.mu.Lock()
	fn, err := b.functionLocked(ns, name)
	if err != nil {
		b.mu.Unlock()
		return err
	}
	stopped, err := b.setReplicasLocked(fn, replicas)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	b.log.Info("function scaled", "function", name, "replicas", replicas)
	return waitStopped(ctx, stopped)
}

// setReplicasLocked records a function's replica count and starts or stops replicas to match (the stopped ones
// drain their requests first); it returns the stopped replicas. Scale (PUT /system/scale-function) and the
// autoscaler both set counts here; b.mu is held.
func (b *Backend) setReplicasLocked(fn *function, replicas uint64) ([]*replica, error) {
	rec := fn.rec
	rec.Replicas = replicas
	if err := b.saveRecord(rec); err != nil {
		return nil, err
	}
	fn.rec = rec
	stopped := b.scaleLocked(fn, replicas, true)
	b.retireLocked(fn)
	fn.notifyLocked()
	return stopped, nil
}

// Resolve returns the base URL of a ready replica, round-robin over the ready ones, without waiting (Route waits,
// and tracks the request). It fails with provider.ErrNotReady while none is ready (starting, restarting, or scaled
// to 0).
func (b *Backend) Resolve(ctx context.Context, namespace, name string) (*url.URL, error) {
	ns, err := b.lookupArgs(namespace, name)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fn, err := b.functionLocked(ns, name)
	if err != nil {
		return nil, err
	}
	r, u := fn.pickLocked()
	if r == nil {
		state, failed := fn.envState()
		if failed != nil {
			return nil, failed
		}
		if state != "" {
			return nil, fmt.Errorf("%w: function %q is %s", provider.ErrNotReady, name, state)
		}
		return nil, fmt.Errorf("%w: function %q has no ready replica (%d desired)", provider.ErrNotReady, name,
			fn.rec.Replicas)
	}
	return u, nil
}

// pids returns the process ids of a function's running replicas (for tests; name is its key).
func (b *Backend) pids(name string) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	if fn, ok := b.fns[name]; ok {
		for _, r := range fn.allReplicas() {
			if p := r.pid(); p > 0 {
				out = append(out, p)
			}
		}
	}
	return out
}
