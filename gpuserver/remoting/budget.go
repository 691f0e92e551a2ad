package remoting

import "sync"

// DefaultMaxGraphBytesPerFunction bounds the memory the recorded graphs of one function's sessions take in the
// process that runs them (captures under way, graphs and executable graphs, at graphNodeOverhead plus the copied
// arguments per node) when Config.MaxGraphBytesPerFunction is 0. The llm function's decode graph (1,203 kernels)
// takes about 300 KB.
const DefaultMaxGraphBytesPerFunction = 256 << 20

// graphNodeOverhead is what a recorded node costs beyond its copied arguments (its entry, its closure and what the
// closure holds), counted once per graph or executable graph that holds it.
const graphNodeOverhead = 128

// functionBudgets bounds what the sessions of one function hold together. Every session of a function runs in one
// process (the gpuserver's, or its tenant's executor), so a function that opens several sessions (a process per
// request, say, up to MaxSessionsPerFunction) gets no more than one session would: GPU memory (its segments,
// physical allocations and module data) within its quota (pool.FunctionSpec.MemoryBytes), and the process's host
// memory its graphs take within Config.MaxGraphBytesPerFunction. It is safe for concurrent use.
type functionBudgets struct {
	maxGraph uint64

	mu  sync.Mutex
	fns map[string]*functionBudget
	// notSimulated names the functions whose sessions launched a kernel the simulated node cannot compute, so
	// that the log says so once per function, not once per launch or process.
	notSimulated map[string]bool
}

type functionBudget struct {
	device uint64 // GPU bytes charged against the function's quota
	graph  uint64 // host bytes of its graphs
}

func newFunctionBudgets(maxGraph uint64) *functionBudgets {
	return &functionBudgets{maxGraph: maxGraph, fns: map[string]*functionBudget{}, notSimulated: map[string]bool{}}
}

// firstNotSimulated reports whether function's launch of a kernel the simulated node cannot compute is its first.
func (b *functionBudgets) firstNotSimulated(function string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.notSimulated[function] {
		return false
	}
	b.notSimulated[function] = true
	return true
}

func (b *functionBudgets) fnLocked(function string) *functionBudget {
	f := b.fns[function]
	if f == nil {
		f = &functionBudget{}
		b.fns[function] = f
	}
	return f
}

func (b *functionBudgets) dropLocked(function string) {
	if f := b.fns[function]; f != nil && f.device == 0 && f.graph == 0 {
		delete(b.fns, function)
	}
}

// chargeDevice charges n bytes of GPU memory to function when they fit its quota, and reports whether they did.
func (b *functionBudgets) chargeDevice(function string, n, quota uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.fnLocked(function)
	if f.device+n > quota || f.device+n < f.device {
		b.dropLocked(function)
		return false
	}
	f.device += n
	return true
}

// unchargeDevice gives back n bytes charged to function.
func (b *functionBudgets) unchargeDevice(function string, n uint64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.fnLocked(function)
	f.device -= min(n, f.device)
	b.dropLocked(function)
}

// deviceBytes is what function's sessions hold of its quota together.
func (b *functionBudgets) deviceBytes(function string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f := b.fns[function]; f != nil {
		return f.device
	}
	return 0
}

// chargeGraph charges n bytes of graphs to function when they fit its bound, and reports whether they did.
func (b *functionBudgets) chargeGraph(function string, n uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.fnLocked(function)
	if f.graph+n > b.maxGraph || f.graph+n < f.graph {
		b.dropLocked(function)
		return false
	}
	f.graph += n
	return true
}

// unchargeGraph gives back n bytes of graphs charged to function.
func (b *functionBudgets) unchargeGraph(function string, n uint64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.fnLocked(function)
	f.graph -= min(n, f.graph)
	b.dropLocked(function)
}

// nodesCost is what nodes cost the process's memory as one graph.
func nodesCost(nodes []graphNode) uint64 {
	var c uint64
	for _, n := range nodes {
		c += graphNodeOverhead + uint64(n.bytes)
	}
	return c
}
