package server

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestDataPlaneEvictionsAreCountedByTheController: the executors evict idle copies on their own when a swap-in
// runs out of chunks (EvictUnderPressure), and the controller, which plans against the node's nominal memory,
// never heard of it: it went on placing on a copy that was gone, and the pool's status and /metrics counted none
// of those evictions. Now the data plane reports each one: the controller forgets the copy and counts it.
func TestDataPlaneEvictionsAreCountedByTheController(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// 64 MiB of chunks on the one GPU, and the controller plans with them (the data plane's capacity): two
	// functions of a 32 MiB quota fit its plan, their 40 MiB models (more than their quotas) do not fit the chunks.
	s := startOneGPU(ctx, t, Config{DeviceReserveBytes: 64 << 20})
	defer stop(t, s)
	p, x := s.Pool(), s.Executors()
	for _, fn := range []string{"a", "b"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 32 << 20}); err != nil {
			t.Fatal(err)
		}
		// Initialisation: its model's block is allocated under an implicit binding, its first request captures it.
		_, release, err := s.pool.BindImplicit(ctx, fn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.Alloc(ctx, fn, 40<<20); err != nil {
			t.Fatalf("%s: %v", fn, err)
		}
		release()
		b, err := p.Acquire(ctx, fn)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	st := p.Status(ctx)
	if st.Evictions == nil || st.Evictions.DataPlane["pressure"] != 1 || st.Evictions.Controller != 0 {
		t.Fatalf("evictions %+v, want the data plane's one under pressure and none of the controller's", st.Evictions)
	}
	if res := st.GPUs[0].Resident; slices.Contains(res, "a") || !slices.Contains(res, "b") {
		t.Errorf("the controller sees %v resident, want b only (a was evicted by the data plane)", res)
	}
	if gpus, _, err := x.Resident("a"); err != nil || len(gpus) != 0 {
		t.Errorf("a resident on %v (%v) in the data plane, want nowhere", gpus, err)
	}
	// a comes back from its image: the controller knows it must swap.
	b, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if b.Swap != "pcie" {
		t.Errorf("a bound again with swap %q, want pcie (its copy was gone)", b.Swap)
	}
	if err := p.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	metrics, err := s.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range metrics {
		if mf.GetName() != "faas_gpu_evictions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == "pressure" && m.GetCounter().GetValue() >= 1 {
				found = true
			}
		}
	}
	if !found {
		t.Error("faas_gpu_evictions_total{by=\"pressure\"} does not count the data plane's eviction")
	}
}

// modelPy allocates a model of SIZE bytes (40 MiB by default) and fills it with its pattern byte at start (its initialisation, under an
// implicit binding), then answers "sum" with the sum of the model's bytes read back (a request).
const modelPy = `
import os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
size = int(os.environ.get("SIZE", 40 << 20))
ptr = cuda.alloc(size)
cuda.htod(ptr, bytes([int(os.environ["PATTERN"])]) * size)
print("ready", flush=True)
for line in sys.stdin:
    print("sum %d" % sum(cuda.dtoh(ptr, size)), flush=True)
`

// TestExecutorProcessEvictionsAreCountedByTheController is TestDataPlaneEvictionsAreCountedByTheController with an
// executor process per tenant: the executor's eviction under pressure reaches the gpuserver's controller as a frame
// (handoff.KindEvicted), and the evicted function's next request reads its model back from its image.
func TestExecutorProcessEvictionsAreCountedByTheController(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	// 64 MiB of chunks, the controller's plan (the data plane's capacity); two functions of 24 MiB fit it, but
	// 24 MiB of the chunks are held outside the plan (taken here, as memory held beside the functions' copies
	// would be), so the second model's swap-in runs out of chunks.
	s := startOneGPU(ctx, t, Config{DeviceReserveBytes: 64 << 20, Tenants: tc})
	defer stop(t, s)
	const size = 24 << 20
	held, err := s.chunks.Pool(0).Get(size / int(s.chunks.ChunkSize()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.chunks.Pool(0).Put(held) }()
	p := s.Pool()
	procs := map[string]*fnProcess{}
	for i, fn := range []string{"a", "b"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: size}); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(testkit.RepoRoot(t), "functions", "vector-add")
		env := append(testkit.ShimEnv(testkit.Shim(t), s.RemotingSocket(), fn, s.Token(fn)), "FN_DIR="+dir,
			fmt.Sprintf("PATTERN=%d", i+1), fmt.Sprintf("SIZE=%d", size))
		procs[fn] = &fnProcess{testkit.StartPython(t, modelPy, env...)}
		if l, err := procs[fn].next(); l != "ready" || err != nil {
			t.Fatalf("%s said %q (%v)\n%s", fn, l, err, procs[fn].Stderr())
		}
		b, err := p.Acquire(ctx, fn) // its first request: the 24 MiB become its image
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	testkit.EventuallyNil(t, 20*time.Second, "the controller counts the executor's eviction", func() error {
		st := p.Status(ctx)
		if st.Evictions == nil || st.Evictions.DataPlane["pressure"] != 1 {
			return fmt.Errorf("evictions %+v, want the data plane's one under pressure", st.Evictions)
		}
		if res := st.GPUs[0].Resident; slices.Contains(res, "a") {
			return fmt.Errorf("the controller sees %v resident, a was evicted", res)
		}
		return nil
	})
	b, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if b.Swap != "pcie" {
		t.Errorf("a bound again with swap %q, want pcie (its copy was gone)", b.Swap)
	}
	_ = procs["a"].Send("sum")
	if l, err := procs["a"].next(); l != fmt.Sprintf("sum %d", size) || err != nil {
		t.Errorf("a read its model back as %q (%v), want sum %d", l, err, size)
	}
	if err := p.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
}
