package simulate

import (
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// The data plane's own evictions (Config.DataPlane), as the gpuserver's executors make them.
//
// The executors hold only the chunks the memory manager reserved at start: memory.DefaultShare (0.9) of what the
// driver reported free, that is of each GPU's total less the gpuserver's own CUDA context, in chunks of 2 MiB
// (gpuserver/server startDataPlane), and the gpuserver gives the controller that capacity as each GPU's memory
// (gpuserver/server planNode), with the chunks' size: a copy takes its quota rounded up to whole chunks, and the
// controller plans it so (controller.Config.ChunkBytes), so the controller's plan fits the chunks. When a swap-in
// still runs out of chunks (memory the controller cannot see) the executor evicts, on its own, the least recently used copy on that GPU that is
// neither bound nor the source of a copy in progress (executor.Config.EvictUnderPressure, takeChunksLocked) and
// reports it (Config.OnEvict), and the controller forgets that copy and counts it by reason
// (controller.Controller.Evicted; faas_gpu_evictions_total{by="pressure"}). With nothing left to evict the swap
// fails (executor.ErrNoMemory) and so does its request. The lending reclaim (executor.EvictIdle) needs another
// tenant's executor: the simulator runs one tenant, so it never happens here.

// Defaults of the data plane's memory.
const (
	// DefaultDataPlaneContextBytes is the gpuserver's own CUDA context on each GPU, taken before the memory
	// manager reserves its share of the free memory (docs/tenants.md's estimate of a context, 512 MiB, until the
	// GPU suite measures it).
	DefaultDataPlaneContextBytes = 512 << 20
	dataPlaneChunk               = 2 << 20
	// NoDataPlaneContext is DataPlaneContextBytes for GPUs without a gpuserver context: up's simulated device
	// reports all of a GPU's memory free. One byte, under a chunk, so the chunks are 0.9 of the whole memory.
	NoDataPlaneContext = 1
)

// ReasonSwapFailed is the reason the simulator reports to the controller for a copy it must forget because its
// swap-in found no chunks and nothing to evict (the request failed).
const ReasonSwapFailed = "swap-failed"

// dataPlane is the executors' view of one node's GPU memory: the copies they hold and the chunks left.
type dataPlane struct {
	ctl   *controller.Controller
	chunk uint64
	size  func(name string) uint64 // a copy's chunks, in bytes
	pool  []uint64                 // chunks reserved per GPU, in bytes
	used  []uint64
	gpus  []map[string]*dpCopy
	fails int64
}

type dpCopy struct {
	bytes    uint64
	lastUsed time.Duration
	users    int // bindings on it (a swap into it included)
	pinned   int // NVLink copies reading from it
}

// newDataPlane models node n's executors: each GPU's pool is share x (its memory - context), whole chunks. Its
// controller (ctl) is set once the controller is made with planNode's node.
func newDataPlane(cfg *Config, size func(name string) uint64) *dataPlane {
	share := cfg.DataPlaneShare
	if share == 0 {
		share = memory.DefaultShare
	}
	ctx := cfg.DataPlaneContextBytes
	if ctx == 0 {
		ctx = DefaultDataPlaneContextBytes
	}
	dp := &dataPlane{chunk: dataPlaneChunk, size: size}
	for _, g := range cfg.Node.GPUs {
		free := uint64(0)
		if g.MemoryBytes > ctx {
			free = g.MemoryBytes - ctx
		}
		dp.pool = append(dp.pool, uint64(float64(free)*share)/dp.chunk*dp.chunk)
		dp.used = append(dp.used, 0)
		dp.gpus = append(dp.gpus, map[string]*dpCopy{})
	}
	return dp
}

// planNode is the node the controller plans with: n with each GPU's memory the chunks' capacity, as the
// gpuserver gives it (gpuserver/server planNode).
func (dp *dataPlane) planNode(n topology.Node) topology.Node {
	out := n.Clone()
	for i := range out.GPUs {
		out.GPUs[i].MemoryBytes = min(out.GPUs[i].MemoryBytes, dp.pool[i])
	}
	return out
}

// chunks rounds bytes up to whole chunks.
func (dp *dataPlane) chunks(bytes uint64) uint64 { return (bytes + dp.chunk - 1) / dp.chunk * dp.chunk }

// add puts a copy of name on gpu (a prewarmed one, or one a swap makes), whether or not it fits.
func (dp *dataPlane) add(gpu int, name string, now time.Duration) *dpCopy {
	if c := dp.gpus[gpu][name]; c != nil {
		return c
	}
	c := &dpCopy{bytes: dp.chunks(dp.size(name)), lastUsed: now}
	dp.gpus[gpu][name] = c
	dp.used[gpu] += c.bytes
	return c
}

func (dp *dataPlane) drop(gpu int, name string) {
	if c := dp.gpus[gpu][name]; c != nil {
		dp.used[gpu] -= c.bytes
		delete(dp.gpus[gpu], name)
	}
}

// dropAll forgets every copy of name (its instance ended, or its function left).
func (dp *dataPlane) dropAll(name string) {
	for g := range dp.gpus {
		dp.drop(g, name)
	}
}

// pin marks the source copy of an NVLink swap as read (or unread with delta -1).
func (dp *dataPlane) pin(gpu int, name string, delta int) {
	if c := dp.gpus[gpu][name]; c != nil {
		c.pinned += delta
	}
}

// bind carries out decision d on the data plane at now: the controller's evictions, then, for a swap, the
// chunks of the new copy, evicting under pressure as the executor does. It reports false when the swap finds
// no chunks and nothing to evict (the request fails).
func (dp *dataPlane) bind(d controller.Decision, name string, now time.Duration) bool {
	for _, ev := range d.Evict {
		dp.drop(ev.GPU, ev.Function)
	}
	g := d.GPU
	if d.Swap == controller.SwapNone {
		c := dp.add(g, name, now) // present unless the controller knew a copy the data plane never had
		c.users++
		c.lastUsed = now
		return true
	}
	need := dp.chunks(dp.size(name))
	if c := dp.gpus[g][name]; c != nil { // a copy already there (a partial one): it is rewritten
		dp.drop(g, name)
	}
	for dp.used[g]+need > dp.pool[g] {
		victim := ""
		var at time.Duration
		for v, c := range dp.gpus[g] {
			if v == name || c.users > 0 || c.pinned > 0 {
				continue
			}
			if victim == "" || c.lastUsed < at || c.lastUsed == at && v < victim {
				victim, at = v, c.lastUsed
			}
		}
		if victim == "" {
			dp.fails++
			return false
		}
		dp.drop(g, victim)
		dp.ctl.Evicted(victim, g, executor.EvictPressure)
	}
	c := dp.add(g, name, now)
	c.users++
	return true
}

// release ends a binding of name on gpu at now.
func (dp *dataPlane) release(gpu int, name string, now time.Duration) {
	if c := dp.gpus[gpu][name]; c != nil {
		c.users = max(0, c.users-1)
		c.lastUsed = now
	}
}
