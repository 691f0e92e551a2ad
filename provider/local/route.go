package local

import (
	"context"
	"fmt"
	"net/url"
	"sync"

	"github.com/faas-gpu/faas-gpu/provider"
)

// routeFailures is how many replicas may exit before they are ready while a request waits in Route before it is
// answered with the reason: one failure may be bad luck (the free port was taken), a second is the function.
const routeFailures = 2

// Route returns the base URL of a ready replica, round-robin over the ready replicas of the current definition
// (those of the previous one while an update rolls), and a func to call when the request has ended. While none is
// ready it waits for one, until ctx ends; a function at zero replicas is scaled up and waited for (scale from zero,
// scalezero.go); one whose replicas keep exiting before they are ready fails with how the last one ended, and one
// whose pip requirements failed to install fails at once with pip's reason. Every error wraps provider.ErrNotFound, provider.ErrNotReady, provider.ErrFailed or
// ErrClosed.
//
// From the moment the function is found until done is called (or Route fails), the request counts in the
// function's load, the requests in flight the autoscaler scales by (autoscale.go): waiting for a replica included.
func (b *Backend) Route(ctx context.Context, namespace, name string) (u *url.URL, done func(), err error) {
	ns, err := b.lookupArgs(namespace, name)
	if err != nil {
		return nil, nil, err
	}
	var counted *function // the function whose load this request is in
	defer func() {
		switch {
		case counted == nil:
		case err != nil:
			counted.load.leave()
		default:
			end := done
			var once sync.Once
			done = func() { once.Do(func() { end(); counted.load.leave() }) }
		}
	}()
	var failuresBefore uint64
	for first := true; ; first = false {
		b.mu.Lock()
		fn, err := b.functionLocked(ns, name)
		if err != nil {
			b.mu.Unlock()
			return nil, nil, err
		}
		if counted == nil {
			counted = fn
			fn.load.enter()
		}
		if r, u := fn.pickLocked(); r != nil {
			r.begin()
			b.mu.Unlock()
			var once sync.Once
			return u, func() { once.Do(r.end) }, nil
		}
		if first {
			failuresBefore = fn.startFailures
		}
		envState, envFailed := fn.envState()
		if envFailed == nil && fn.rec.Replicas == 0 { // scale from zero (scalezero.go)
			if err := b.scaleFromZeroLocked(fn); err != nil {
				b.mu.Unlock()
				return nil, nil, err
			}
		}
		desired, failures, last, changed := fn.rec.Replicas, fn.startFailures, fn.lastFailure, fn.changed
		b.mu.Unlock()
		switch {
		case envFailed != nil: // its environment failed to install: waiting cannot help
			return nil, nil, envFailed
		case failures >= failuresBefore+routeFailures:
			return nil, nil, fmt.Errorf("%w: function %q: its replicas exit before they are ready (last: %v); "+
				"see its logs", provider.ErrNotReady, name, last)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if envState != "" {
				return nil, nil, fmt.Errorf("%w: function %q is %s: %w", provider.ErrNotReady, name, envState,
					ctx.Err())
			}
			return nil, nil, fmt.Errorf("%w: function %q has no ready replica yet (%d starting): %w",
				provider.ErrNotReady, name, desired, ctx.Err())
		}
	}
}

// pickLocked returns a ready replica and its URL, round-robin over the current definition's ready replicas, else
// over the retiring ones; nil when none is ready.
func (fn *function) pickLocked() (*replica, *url.URL) {
	for _, reps := range [][]*replica{fn.replicas, fn.retiring} {
		var ready []*replica
		var urls []*url.URL
		for _, r := range reps {
			if u := r.readyURL(); u != nil {
				ready, urls = append(ready, r), append(urls, u)
			}
		}
		if len(ready) > 0 {
			fn.rr++
			i := fn.rr % uint64(len(ready))
			u := *urls[i]
			return ready[i], &u
		}
	}
	return nil, nil
}

// notifyLocked wakes the requests waiting in Route for fn.
func (fn *function) notifyLocked() {
	close(fn.changed)
	fn.changed = make(chan struct{})
}

// replicaReady is called by a replica's supervisor once the replica answers: waiting requests wake, and when every
// replica of the current definition is ready the previous definition's replicas retire.
func (b *Backend) replicaReady(fn *function) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retireLocked(fn)
	fn.notifyLocked()
}

// startFailed is called by a replica's supervisor when its process exited before it was ready.
func (b *Backend) startFailed(fn *function, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fn.startFailures++
	fn.lastFailure = err
	b.rolloutFailedLocked(fn, err)
	fn.notifyLocked()
}

// retireLocked stops the replicas of previous definitions, draining their requests, once every replica of the
// current definition is ready.
func (b *Backend) retireLocked(fn *function) {
	if len(fn.retiring) == 0 {
		return
	}
	for _, r := range fn.replicas {
		if r.readyURL() == nil {
			return
		}
	}
	for _, r := range fn.retiring {
		r.stop(true)
		fn.event(r.id, "replaced by the updated definition; stopping once its requests have ended")
	}
	fn.retiring = nil
	fn.endRolloutLocked()
}
