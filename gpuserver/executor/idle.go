package executor

import (
	"context"
	"fmt"
)

// EvictIdle evicts least recently used copies on gpu that are neither in use nor a swap source until the GPU's
// pool has want free chunks (or nothing idle is left), and returns the free chunks then. It never waits for the
// node: when the node is busy (another call holds it) it evicts nothing. A tenant executor runs it when the
// gpuserver needs chunks back for another tenant (docs/tenants.md); waiting there could deadlock two executors
// that each wait for the other's chunks.
func (n *Node) EvictIdle(ctx context.Context, gpu, want int) (int, error) {
	if err := n.validGPU(gpu); err != nil {
		return 0, err
	}
	end, ok := n.tryOperate()
	if !ok {
		return n.mem.Pool(gpu).Free(), nil
	}
	defer end()
	pool := n.mem.Pool(gpu)
	for pool.Free() < want {
		victim := n.victimLocked(nil, gpu)
		if victim == nil {
			break
		}
		if err := n.evictLocked(ctx, victim, gpu); err != nil {
			return pool.Free(), fmt.Errorf("evict idle %s on gpu %d: %w", victim.name, gpu, err)
		}
		n.evictedLocked(gpu, victim, EvictReclaim)
	}
	return pool.Free(), nil
}

// WaitReady waits until the copies of a swap of function onto its active GPU have completed (a benchmark's end of
// a swap; requests never need it: their work waits per segment).
func (n *Node) WaitReady(ctx context.Context, name string) error {
	defer n.operate()()
	f, err := n.fn(name)
	if err != nil {
		return err
	}
	if f.active < 0 {
		return nil
	}
	return n.waitReadyLocked(ctx, f, f.res[f.active])
}
