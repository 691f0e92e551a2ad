package executor

import "sync"

// Orphanable is a binding held on a data plane as a BindingTable keeps it: Binding in an executor process, Held in
// the gpuserver.
type Orphanable interface {
	// Orphaned reports whether the function was reset under it (Binding.Orphaned).
	Orphaned() bool
}

// BindingTable is the one bookkeeping of the bindings a side of the data plane holds (the gpuserver's tracked pool
// of every binding it made, a tenant executor of the bindings the gpuserver held there): each by ID, and a
// request's also by function, which is what the remoting sessions ask for every call (CurrentGPU). It is safe for
// concurrent use; it never calls out while it holds its lock, so its callers may hold theirs.
type BindingTable[H Orphanable] struct {
	mu       sync.Mutex
	all      map[string]*BoundEntry[H]
	requests map[string]map[string]*BoundEntry[H] // function -> ID -> a request's binding, not expired
}

// BoundEntry is a binding of a BindingTable.
type BoundEntry[H Orphanable] struct {
	Function string
	GPU      int
	// Request is set for a request's binding (CurrentGPU reports it), not for an implicit one.
	Request bool
	// Held is the binding on the data plane (a nil interface where there is none: no data plane).
	Held H
	// Expired is set once Expire ended it: it is still held until Take, and no longer reported.
	Expired bool
}

// NewBindingTable returns an empty table.
func NewBindingTable[H Orphanable]() *BindingTable[H] {
	return &BindingTable[H]{all: map[string]*BoundEntry[H]{}, requests: map[string]map[string]*BoundEntry[H]{}}
}

// Add records binding id of function on gpu.
func (t *BindingTable[H]) Add(id, function string, gpu int, request bool, h H) {
	e := &BoundEntry[H]{Function: function, GPU: gpu, Request: request, Held: h}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all[id] = e
	if request {
		t.reportLocked(id, e)
	}
}

func (t *BindingTable[H]) reportLocked(id string, e *BoundEntry[H]) {
	m := t.requests[e.Function]
	if m == nil {
		m = map[string]*BoundEntry[H]{}
		t.requests[e.Function] = m
	}
	m[id] = e
}

func (t *BindingTable[H]) unreportLocked(id string, e *BoundEntry[H]) {
	if m := t.requests[e.Function]; m != nil {
		delete(m, id)
		if len(m) == 0 {
			delete(t.requests, e.Function)
		}
	}
}

// Take removes binding id and returns it (false when unknown: released already, or never held).
func (t *BindingTable[H]) Take(id string) (BoundEntry[H], bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.all[id]
	if e == nil {
		return BoundEntry[H]{}, false
	}
	delete(t.all, id)
	t.unreportLocked(id, e)
	return *e, true
}

// Expire marks binding id expired (its request held it too long): CurrentGPU no longer reports it (its function's
// calls bind afresh), and it stays held until Take. It returns the binding as it was (Expired set when it had
// expired already; false when unknown).
func (t *BindingTable[H]) Expire(id string) (BoundEntry[H], bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.all[id]
	if e == nil {
		return BoundEntry[H]{}, false
	}
	was := *e
	e.Expired = true
	t.unreportLocked(id, e)
	return was, true
}

// Requests counts function's requests' bindings reported (held, not expired).
func (t *BindingTable[H]) Requests(function string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.requests[function])
}

// CurrentGPU is the GPU of one of function's requests' bindings (remoting.Binder); a binding the function was reset
// under (Orphaned: every process of the function ended while it was held) is never reported, so that calls of a
// new process do not run under the binding a dead one left behind. (A binding broken by a fault is still its live
// request's: its calls go on under it, and its release says it broke.)
func (t *BindingTable[H]) CurrentGPU(function string) (int, bool) {
	t.mu.Lock()
	es := make([]BoundEntry[H], 0, len(t.requests[function]))
	for _, e := range t.requests[function] {
		es = append(es, *e)
	}
	t.mu.Unlock()
	for _, e := range es { // Orphaned takes the data plane's lock: asked outside t.mu
		if any(e.Held) == nil || !e.Held.Orphaned() {
			return e.GPU, true
		}
	}
	return 0, false
}
