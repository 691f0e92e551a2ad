package server

import (
	"context"
	"sync"
	"time"
)

// holdLimit is the maximum binding hold (Config.MaxBindingHold): a request's binding held longer than max is ended
// (trackedPool.expire), the work it queued given grace to finish. It keeps a timer per request's binding, counts
// the expiries and lets a function's new requests wait until its expiries running are done.
type holdLimit struct {
	max, grace time.Duration

	mu       sync.Mutex
	timers   map[string]*time.Timer // binding ID -> its hold's end
	expiries int64                  // bindings ended because they were held too long
	stopped  bool                   // the server shuts down: no more expiries
	running  sync.WaitGroup         // expiries running
	// byFunction holds, per function, a channel for each expiry running, closed when it is done: the function's
	// new requests are bound once its expired bindings' work is fenced and stopped, not under the teardown
	byFunction map[string][]chan struct{}
}

func newHoldLimit(max, grace time.Duration) *holdLimit {
	return &holdLimit{max: max, grace: grace, timers: map[string]*time.Timer{},
		byFunction: map[string][]chan struct{}{}}
}

// start arms the end of binding id's hold (a request's of function): expire(id, function) runs after max. Nothing
// is armed without a maximum hold, or once stopping.
func (h *holdLimit) start(id, function string, expire func(id, function string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max <= 0 || h.stopped {
		return
	}
	h.timers[id] = time.AfterFunc(h.max, func() { expire(id, function) })
}

// cancel disarms binding id's hold (it is released).
func (h *holdLimit) cancel(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if tm, ok := h.timers[id]; ok {
		tm.Stop()
		delete(h.timers, id)
	}
}

// begin starts the expiry of binding id of function, whose hold ended; done ends it. False when the server is
// stopping: nothing is expired then.
func (h *holdLimit) begin(id, function string) (done func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.timers, id)
	if h.stopped {
		return nil, false
	}
	h.running.Add(1)
	ch := make(chan struct{})
	h.byFunction[function] = append(h.byFunction[function], ch)
	return func() {
		h.finished(function, ch)
		h.running.Done()
	}, true
}

// expired counts one binding ended.
func (h *holdLimit) expired() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expiries++
}

// finished marks one expiry of function done (see wait).
func (h *holdLimit) finished(function string, done chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	waits := h.byFunction[function]
	for i, c := range waits {
		if c == done {
			waits = append(waits[:i], waits[i+1:]...)
			break
		}
	}
	if len(waits) == 0 {
		delete(h.byFunction, function)
	} else {
		h.byFunction[function] = waits
	}
	close(done)
}

// wait waits until the expiries of function's bindings running now are done (the expired request's work fenced,
// what it queued stopped), so that a new request of the function is not bound under their teardown.
func (h *holdLimit) wait(ctx context.Context, function string) error {
	h.mu.Lock()
	waits := append([]chan struct{}(nil), h.byFunction[function]...)
	h.mu.Unlock()
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// stop ends the timers and waits for the expiries running (the server shuts down).
func (h *holdLimit) stop() {
	h.mu.Lock()
	h.stopped = true
	for id, tm := range h.timers {
		tm.Stop()
		delete(h.timers, id)
	}
	h.mu.Unlock()
	h.running.Wait()
}

// count is the number of bindings ended because they were held too long.
func (h *holdLimit) count() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.expiries
}
