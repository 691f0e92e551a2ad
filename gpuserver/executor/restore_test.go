package executor_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// restartRig is a node started again on the same device and repository directory, as after a gpuserver restart.
func restartRig(t *testing.T, dev *sim.Backend, dir string) *rig {
	t.Helper()
	addrs := executor.NewAddresses(dev)
	mem, err := memory.New(addrs, memory.Config{Share: 1, MaxBytesPerGPU: 256 << 20})
	must(t, err)
	repo, err := repository.Open(repository.Config{Dir: dir, Registrar: dev})
	must(t, err)
	n, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo, Addresses: addrs})
	must(t, err)
	r := &rig{dev: dev, mem: mem, repo: repo, node: n}
	t.Cleanup(func() { stopRig(t, r) })
	return r
}

func stopRig(t *testing.T, r *rig) {
	if r.node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(t, r.node.Close(ctx))
	must(t, r.mem.Close(ctx))
	must(t, r.repo.Close())
	r.node = nil
}

// TestRestartRestoresAFunctionFromItsImage initialises a function, restarts the node, and initialises it again:
// with the same bytes its blocks land at the image's addresses, its copies are skipped and its image is reused
// (nothing captured); with other bytes (a new version of the function) it falls back to a capture.
func TestRestartRestoresAFunctionFromItsImage(t *testing.T) {
	ctx := context.Background()
	node, _ := topology.Preset("v100x4")
	node, _ = node.WithGPUMemory(512 << 20)
	dev, err := sim.New(sim.Options{Node: node})
	must(t, err)
	t.Cleanup(func() { _ = dev.Close(ctx) }) // after the rigs' cleanups
	dir := filepath.Join(t.TempDir(), "shm")
	sizes := []int{5 << 20, 512, 3 << 20, 1024}

	r1 := restartRig(t, dev, dir)
	m1 := initModel(t, r1, "llm", 0, sizes...)
	if st := r1.node.Images(); st.Captures != 1 {
		t.Fatalf("first start: %+v", st)
	}
	stopRig(t, r1)

	r2 := restartRig(t, dev, dir)
	m2 := initModel(t, r2, "llm", 1, sizes...) // same sizes and bytes, on another GPU
	for i := range m1.blocks {
		if m1.blocks[i] != m2.blocks[i] {
			t.Fatalf("block %d at %#x after the restart, %#x before", i, m2.blocks[i], m1.blocks[i])
		}
	}
	st := r2.node.Images()
	if st.Captures != 0 || st.Reused != 1 || st.SkippedBytes != uint64(5<<20+512+3<<20+1024) {
		t.Fatalf("after the restart: %+v, want the image reused, every copy skipped, nothing captured", st)
	}
	verify(t, r2, m1, 1)
	// Its copies elsewhere come from the reused image.
	b, err := r2.node.Acquire(ctx, "llm", 3, executor.Host)
	must(t, err)
	verify(t, r2, m1, 3)
	b.Release()
	stopRig(t, r2)

	// A new version of the function (other bytes) is captured anew.
	r3 := restartRig(t, dev, dir)
	must(t, r3.node.Register("llm"))
	b, err = r3.node.Acquire(ctx, "llm", 2, executor.Host)
	must(t, err)
	s, err := r3.node.Stream("llm")
	must(t, err)
	m3 := model{name: "llm"}
	for i, size := range sizes {
		p, err := r3.node.Alloc(ctx, "llm", uint64(size))
		must(t, err)
		d := pattern(size, byte(i+100))
		must(t, s.CopyHtoD(p, d))
		m3.blocks, m3.data = append(m3.blocks, p), append(m3.data, d)
	}
	must(t, s.Synchronize(ctx))
	must(t, r3.node.EndInit(ctx, "llm"))
	b.Release()
	if st := r3.node.Images(); st.Captures != 1 || st.Reused != 0 || st.Fallbacks != 1 {
		t.Fatalf("new version after the restart: %+v, want a fallback to a capture", st)
	}
	must(t, r3.node.Evict(ctx, "llm", 2))
	b, err = r3.node.Acquire(ctx, "llm", 0, executor.Host)
	must(t, err)
	verify(t, r3, m3, 0) // the new bytes, from the new image
	b.Release()
}
