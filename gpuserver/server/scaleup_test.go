package server

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// scaleUpDims size the replicas of TestReplicasStartedAfterTheFirstRequestAnswerRight: weights of 1, 4 and 1 MiB
// and the small blocks, 6 chunks of 2 MiB a replica; three replicas fit the quota and a GPU of 64 MiB.
const scaleUpDims, scaleUpQuota = "256,1024,1024,256,64", 48 << 20

// TestReplicasStartedAfterTheFirstRequestAnswerRight scales a function up and rolls it after its first request,
// under every scratch mode, through the pool, the executors and the real shim: replica a initialises and answers
// its first request; replica b starts (a scale-up) and initialises outside any request; replica c (the rolling
// update's new process) initialises while a request of a is in flight, and then a ends. Between rounds the
// function is evicted, so every replica comes back from host memory. Every answer of every replica must equal
// the first, which must match the host's reference. Before, the blocks a later replica allocated in its
// initialisation were scratch, and with scratch per request they were given back at the end of the next request
// and mapped zeroed: the new replicas answered zeros with 200.
func TestReplicasStartedAfterTheFirstRequestAnswerRight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	for _, mode := range []string{pool.ScratchResident, pool.ScratchRequest} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			node, err := topology.Preset("v100x4")
			if err != nil {
				t.Fatal(err)
			}
			if node, err = node.WithGPUMemory(64 << 20); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
				RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
				RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 64 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer stop(t, s)
			const fn = "scaled"
			if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: scaleUpQuota,
				Scratch: mode}); err != nil {
				t.Fatal(err)
			}
			layers := strings.Count(scaleUpDims, ",")
			start := func() *stagedMLP {
				m := startStagedMLP(t, s, fn, scaleUpDims, "scale-seed")
				return m
			}
			initAll := func(m *stagedMLP, from int) {
				for l := from; l < layers; l++ {
					m.do(t, fmt.Sprintf("init %d", l))
				}
			}
			var first []float64
			call := func(what string, m *stagedMLP) {
				t.Helper()
				b, err := s.Pool().Acquire(ctx, fn)
				if err != nil {
					t.Fatalf("%s: acquire: %v", what, err)
				}
				y := m.do(t, "run")
				if err := s.Pool().Release(ctx, b.ID); err != nil {
					t.Fatalf("%s: release: %v", what, err)
				}
				if first == nil {
					ref := m.do(t, "ref")
					for j := range ref {
						if math.Abs(y[j]-ref[j]) > 1e-4*(1+math.Abs(ref[j])) {
							t.Fatalf("%s: first answer y[%d] = %v, the host computes %v (%d of %d values zero)", what,
								j, y[j], ref[j], zeroCount(y), len(y))
						}
					}
					first = y
					return
				}
				for j := range y {
					if y[j] != first[j] {
						t.Fatalf("%s on gpu %d (swap %s): y[%d] = %v, the first answer was %v (%d of %d values zero)",
							what, b.GPU, b.Swap, j, y[j], first[j], zeroCount(y), len(y))
					}
				}
			}
			evict := func() {
				t.Helper()
				gpus, _, err := s.Executors().Resident(fn)
				if err != nil {
					t.Fatal(err)
				}
				for _, g := range gpus {
					if err := s.Executors().Evict(ctx, fn, g); err != nil {
						t.Fatalf("evict from gpu %d: %v", g, err)
					}
				}
			}

			a := start()
			initAll(a, 0)
			call("a, first request", a)
			call("a, second request", a)

			b := start() // scaled up after the first request
			initAll(b, 0)
			for round := range 2 {
				call(fmt.Sprintf("round %d: b", round), b)
				call(fmt.Sprintf("round %d: a", round), a)
				evict()
			}

			c := start() // the rolling update's new replica initialises while a request of a is in flight
			c.do(t, "init 0")
			held, err := s.Pool().Acquire(ctx, fn)
			if err != nil {
				t.Fatal(err)
			}
			initAll(c, 1)
			y := a.do(t, "run")
			if err := s.Pool().Release(ctx, held.ID); err != nil {
				t.Fatal(err)
			}
			for j := range y {
				if y[j] != first[j] {
					t.Fatalf("a beside c's initialisation: y[%d] = %v, the first answer was %v", j, y[j], first[j])
				}
			}
			a.py.Close() // the old replica ends
			for round := range 3 {
				call(fmt.Sprintf("round %d after the roll: c", round), c)
				call(fmt.Sprintf("round %d after the roll: b", round), b)
				evict()
			}
		})
	}
}
