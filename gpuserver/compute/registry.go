package compute

import (
	"context"
	"fmt"
	"sync"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Registry holds a node's arbiters, one per GPU, and which binding holds which gate: what the tenant executor's
// launch path asks (Wrap, the executor's Config.ComputeGate) when it hands a function its stream. A function
// bound exclusively has no gate and its stream passes untouched.
type Registry struct {
	ctx  context.Context
	arbs []*Arbiter

	mu    sync.Mutex
	gates map[key]*Gate
}

type key struct {
	function string
	gpu      int
}

// NewRegistry makes an arbiter per GPU with cfg; ctx bounds the waits of every gate (the node's lifetime). Run
// issues the tokens.
func NewRegistry(ctx context.Context, gpus int, cfg Config) (*Registry, error) {
	r := &Registry{ctx: ctx, gates: map[key]*Gate{}}
	for range gpus {
		a, err := NewArbiter(cfg)
		if err != nil {
			return nil, err
		}
		r.arbs = append(r.arbs, a)
	}
	return r, nil
}

// Arbiter is GPU gpu's arbiter (nil for an unknown GPU).
func (r *Registry) Arbiter(gpu int) *Arbiter {
	if gpu < 0 || gpu >= len(r.arbs) {
		return nil
	}
	return r.arbs[gpu]
}

// Run issues every arbiter's tokens until ctx ends.
func (r *Registry) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(r.arbs))
	for i, a := range r.arbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.Run(ctx)
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// Bind gives function a share on gpu from now until Unbind (a binding of a function that shares: request < 1).
func (r *Registry) Bind(function string, gpu int, request, limit float64) (*Gate, error) {
	a := r.Arbiter(gpu)
	if a == nil {
		return nil, fmt.Errorf("%w: gpu %d", ErrInvalid, gpu)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.gates[key{function, gpu}]; ok {
		return nil, fmt.Errorf("%w: %s is bound on gpu %d already", ErrInvalid, function, gpu)
	}
	g, err := a.Join(function, request, limit)
	if err != nil {
		return nil, err
	}
	r.gates[key{function, gpu}] = g
	return g, nil
}

// Unbind ends function's share on gpu; a no-op when it has none.
func (r *Registry) Unbind(function string, gpu int) {
	r.mu.Lock()
	g, ok := r.gates[key{function, gpu}]
	delete(r.gates, key{function, gpu})
	r.mu.Unlock()
	if ok {
		g.a.Leave(g)
	}
}

// Wrap is the launch path's hook: function's stream st on gpu, gated when the function holds a share there, else
// st itself (an exclusive binding: no gate, no cost). m is the device stream's meter.
func (r *Registry) Wrap(function string, gpu int, st device.Stream, m device.ComputeMeter) (device.Stream, error) {
	r.mu.Lock()
	g, ok := r.gates[key{function, gpu}]
	r.mu.Unlock()
	if !ok {
		return st, nil
	}
	return Gated(r.ctx, st, m, g)
}

// Apply takes an allotment of the gpuserver's for GPU al.GPU (Arbiter.Apply): the gates it names are the ones Wrap
// gives their bindings' streams from then on.
func (r *Registry) Apply(al Allotment) (Report, error) {
	a := r.Arbiter(al.GPU)
	if a == nil {
		return Report{}, fmt.Errorf("%w: gpu %d", ErrInvalid, al.GPU)
	}
	us, err := a.Apply(al)
	if err != nil {
		return Report{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, gr := range al.Grants {
		if g := a.gateLocked(gr.Binding); g != nil {
			r.gates[key{gr.Binding, al.GPU}] = g
		}
	}
	return Report{Usage: us}, nil
}
