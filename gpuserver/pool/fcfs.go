package pool

import (
	"container/list"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// GPU describes one device of the node to a pool.
type GPU struct {
	Name        string
	MemoryBytes uint64
}

// FCFS is the simplest pool: requests are bound in arrival order to any idle GPU, preferring one where the
// function is resident, and evicting least-recently-used functions when memory is short. One binding runs on a GPU
// at a time. It makes no latency promises; the controller package's pool does.
type FCFS struct {
	now func() time.Time

	mu        sync.Mutex
	gpus      []*fcfsGPU
	functions map[string]*fcfsFunction
	waiting   *list.List // of *fcfsWaiter, oldest first
	bindings  map[string]*fcfsBinding
	nextID    uint64
	closed    bool
}

type fcfsGPU struct {
	GPU
	index    int
	busy     bool
	failed   bool
	used     uint64
	resident map[string]time.Time // function -> last use
}

type fcfsFunction struct {
	spec    FunctionSpec
	queued  int
	running int
	served  int64
	onTime  int64
}

type fcfsWaiter struct {
	function string
	arrived  time.Time
	bound    chan Binding
}

type fcfsBinding struct {
	Binding
	start time.Time
}

// NewFCFS returns a first-come-first-served pool over gpus. now is the clock (time.Now when nil).
func NewFCFS(gpus []GPU, now func() time.Time) (*FCFS, error) {
	if len(gpus) == 0 {
		return nil, fmt.Errorf("%w: a pool needs at least one GPU", ErrInvalidSpec)
	}
	if now == nil {
		now = time.Now
	}
	p := &FCFS{
		now:       now,
		functions: map[string]*fcfsFunction{},
		waiting:   list.New(),
		bindings:  map[string]*fcfsBinding{},
	}
	for i, g := range gpus {
		if g.MemoryBytes == 0 {
			return nil, fmt.Errorf("%w: GPU %d has no memory", ErrInvalidSpec, i)
		}
		p.gpus = append(p.gpus, &fcfsGPU{GPU: g, index: i, resident: map[string]time.Time{}})
	}
	return p, nil
}

// Register adds or replaces a function. A function whose quota exceeds every GPU is refused with ErrTooLarge.
func (p *FCFS) Register(_ context.Context, spec FunctionSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fitsSomewhere(spec.MemoryBytes) {
		return fmt.Errorf("%w: %s needs %d bytes, the largest GPU has %d", ErrTooLarge, spec.Name,
			spec.MemoryBytes, p.largestGPU())
	}
	if f, ok := p.functions[spec.Name]; ok {
		if f.spec.MemoryBytes != spec.MemoryBytes {
			p.evictEverywhere(spec.Name) // the resident copy was sized for the old quota
		}
		f.spec = spec
		return nil
	}
	p.functions[spec.Name] = &fcfsFunction{spec: spec}
	return nil
}

// Deregister removes a function and its resident copies. Requests still waiting for it fail.
func (p *FCFS) Deregister(_ context.Context, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.functions[name]; !ok {
		return fmt.Errorf("%w: %s", ErrUnknownFunction, name)
	}
	p.evictEverywhere(name)
	delete(p.functions, name)
	for e := p.waiting.Front(); e != nil; {
		next := e.Next()
		if w := e.Value.(*fcfsWaiter); w.function == name {
			p.waiting.Remove(e)
			close(w.bound) // a closed channel without a binding means "deregistered"
		}
		e = next
	}
	return nil
}

// Acquire queues the request and waits for a binding.
func (p *FCFS) Acquire(ctx context.Context, function string) (Binding, error) {
	p.mu.Lock()
	f, ok := p.functions[function]
	if !ok {
		p.mu.Unlock()
		return Binding{}, fmt.Errorf("%w: %s", ErrUnknownFunction, function)
	}
	w := &fcfsWaiter{function: function, arrived: p.now(), bound: make(chan Binding, 1)}
	elem := p.waiting.PushBack(w)
	f.queued++
	p.dispatchLocked()
	p.mu.Unlock()

	select {
	case b, ok := <-w.bound:
		if !ok {
			return Binding{}, fmt.Errorf("%w: %s was removed while waiting", ErrUnknownFunction, function)
		}
		return b, nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		select {
		case b, ok := <-w.bound: // bound in the meantime: give the GPU back
			if ok {
				p.releaseLocked(b.ID, true) // it served nothing
			}
		default:
			p.waiting.Remove(elem)
			if f, ok := p.functions[function]; ok {
				f.queued--
			}
		}
		return Binding{}, fmt.Errorf("acquire %s: %w", function, ctx.Err())
	}
}

// Release ends a binding and hands the GPU to the next waiting request; one released with WithUnserved counts in
// no served or on-time figure.
func (p *FCFS) Release(ctx context.Context, bindingID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.bindings[bindingID]
	if !ok || !p.releaseLocked(bindingID, IsUnserved(ctx)) {
		return fmt.Errorf("%w: %s", ErrUnknownBinding, bindingID)
	}
	if p.gpus[b.GPU].failed {
		return fmt.Errorf("binding %s broke: %w: gpu %d", bindingID, ErrGPUUnhealthy, b.GPU)
	}
	return nil
}

// SetHealthy takes a GPU out of placement (its resident copies are gone) or returns it to service, empty.
// Bindings held on a GPU that fails stay until released; their Release reports ErrGPUUnhealthy.
func (p *FCFS) SetHealthy(gpu int, healthy bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gpu < 0 || gpu >= len(p.gpus) {
		return fmt.Errorf("%w: gpu %d of %d", ErrInvalidSpec, gpu, len(p.gpus))
	}
	g := p.gpus[gpu]
	if g.failed == !healthy {
		return nil
	}
	g.failed = !healthy
	g.resident, g.used = map[string]time.Time{}, 0
	p.dispatchLocked()
	return nil
}

// Status returns a snapshot.
func (p *FCFS) Status(_ context.Context) Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{Policy: "fcfs", Queued: p.waiting.Len()}
	resident := map[string][]int{}
	for _, g := range p.gpus {
		gs := GPUStatus{Index: g.index, Name: g.Name, MemoryBytes: g.MemoryBytes, UsedBytes: g.used, Busy: g.busy,
			Healthy: !g.failed, Resident: []string{}}
		for fn := range g.resident {
			gs.Resident = append(gs.Resident, fn)
			resident[fn] = append(resident[fn], g.index)
		}
		sort.Strings(gs.Resident)
		st.GPUs = append(st.GPUs, gs)
	}
	for name, f := range p.functions {
		st.Functions = append(st.Functions, FunctionStatus{FunctionSpec: f.spec, Queued: f.queued,
			Running: f.running, Resident: resident[name], Served: f.served, OnTime: f.onTime})
	}
	sort.Slice(st.Functions, func(i, j int) bool { return st.Functions[i].Name < st.Functions[j].Name })
	return st
}

func (p *FCFS) releaseLocked(id string, unserved bool) bool {
	b, ok := p.bindings[id]
	if !ok {
		return false
	}
	delete(p.bindings, id)
	g := p.gpus[b.GPU]
	g.busy = false
	if _, ok := g.resident[b.Function]; ok {
		g.resident[b.Function] = p.now()
	}
	if f, ok := p.functions[b.Function]; ok {
		f.running--
		if !unserved {
			f.served++
			if f.spec.SLO == 0 || p.now().Sub(b.start)+b.Queued <= f.spec.SLO {
				f.onTime++
			}
		}
	}
	p.dispatchLocked()
	return true
}

// dispatchLocked binds waiting requests, oldest first, while idle GPUs can take them. A request that fits on no
// idle GPU right now waits without blocking the ones behind it.
func (p *FCFS) dispatchLocked() {
	for e := p.waiting.Front(); e != nil; {
		next := e.Next()
		w := e.Value.(*fcfsWaiter)
		f := p.functions[w.function]
		g, swap := p.placeLocked(w.function, f.spec.MemoryBytes)
		if g == nil {
			if !p.anyIdle() {
				return
			}
			e = next
			continue
		}
		p.waiting.Remove(e)
		f.queued--
		f.running++
		g.busy = true
		g.resident[w.function] = p.now()
		p.nextID++
		b := Binding{ID: fmt.Sprintf("b-%d", p.nextID), Function: w.function, GPU: g.index, GPUName: g.Name,
			Swap: swap, Queued: p.now().Sub(w.arrived)}
		p.bindings[b.ID] = &fcfsBinding{Binding: b, start: p.now()}
		w.bound <- b
		e = next
	}
}

// placeLocked picks an idle GPU for a function: one where it is resident, else one where it fits after evicting
// least-recently-used residents. It returns the GPU and the kind of swap ("none" or "pcie").
func (p *FCFS) placeLocked(function string, need uint64) (*fcfsGPU, string) {
	for _, g := range p.gpus {
		if _, ok := g.resident[function]; ok && !g.busy && !g.failed {
			return g, "none"
		}
	}
	var best *fcfsGPU
	for _, g := range p.gpus {
		if g.busy || g.failed || g.MemoryBytes < need {
			continue
		}
		if best == nil || g.MemoryBytes-g.used > best.MemoryBytes-best.used {
			best = g
		}
	}
	if best == nil {
		return nil, ""
	}
	for best.MemoryBytes-best.used < need {
		victim, oldest := "", time.Time{}
		for fn, last := range best.resident {
			if victim == "" || last.Before(oldest) {
				victim, oldest = fn, last
			}
		}
		if victim == "" { // accounting says full but nothing is resident: never loop forever
			return nil, ""
		}
		p.evictLocked(best, victim)
	}
	best.used += need
	return best, "pcie"
}

func (p *FCFS) evictLocked(g *fcfsGPU, function string) {
	delete(g.resident, function)
	if f, ok := p.functions[function]; ok {
		g.used -= f.spec.MemoryBytes
	}
}

func (p *FCFS) evictEverywhere(function string) {
	for _, g := range p.gpus {
		if _, ok := g.resident[function]; ok {
			p.evictLocked(g, function)
		}
	}
}

func (p *FCFS) anyIdle() bool {
	for _, g := range p.gpus {
		if !g.busy && !g.failed {
			return true
		}
	}
	return false
}

func (p *FCFS) fitsSomewhere(need uint64) bool { return p.largestGPU() >= need }

func (p *FCFS) largestGPU() uint64 {
	var m uint64
	for _, g := range p.gpus {
		m = max(m, g.MemoryBytes)
	}
	return m
}
