package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// spinPy is a function process that keeps its GPU busy: "spin S" launches busy kernels of 2 ms (modelled) in
// batches of 16, each batch synchronised, for S seconds of wall time, and answers how many ran.
const spinPy = `
import ctypes, os, sys, time
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
with open(os.path.join(os.environ["FN_DIR"], "kernels.ptx"), "rb") as f:
    busy = cuda.function(cuda.load_module(f.read()), "busy")
x = cuda.alloc(4096)
cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    secs = float(line.split()[1])
    end, n = time.monotonic() + secs, 0
    while time.monotonic() < end:
        for _ in range(16):
            cuda.launch(busy, (132,), (256,), ctypes.c_uint64(2000000))
        cuda.synchronize()
        n += 16
    print("spun %d" % n, flush=True)
`

const spinKernel = 2 * time.Millisecond

// TestCoRunnersGetTheirSharesThroughExecutors: two functions of two tenants, so in two executor processes each
// with a timed virtual GPU of its own, at compute shares 0.3 and 0.7 of the one GPU of the node, both bound at
// once and both busy: the GPU time each receives is its share within 5%, and together they never receive more
// than the one GPU (their gates get tokens only from the gpuserver's grants). An exclusive function (no share)
// never joins them: its request waits until both released, and it holds no share. Without compute sharing the
// second request would wait for the first (the controller binds exclusively), and without the grants each
// executor's virtual GPU would run its function alone at full speed (two GPUs' time).
func TestCoRunnersGetTheirSharesThroughExecutors(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	for _, mode := range []string{"process"} { // in-process, a GPU serves one tenant at a time (executor.ErrBusy)
		t.Run(mode, func(t *testing.T) { coRunnersGetTheirShares(t, mode == "process") })
	}
}

func coRunnersGetTheirShares(t *testing.T, processes bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var tc *TenantConfig
	if processes {
		tc, _ = tenantConfig(t)
	}
	s := startOneGPU(ctx, t, Config{DeviceReserveBytes: 256 << 20, Tenants: tc, SimTimeScale: 1,
		ComputeSharing: true})
	defer stop(t, s)
	fns := []struct {
		name  string
		share float64
	}{{"a.ns1", 0.3}, {"b.ns2", 0.7}}
	for _, f := range fns {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: f.name, MemoryBytes: 64 << 20,
			ComputeRequest: f.share, ComputeLimit: f.share}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: "c.ns3", MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	procs := make([]*fnProcess, len(fns))
	for i, f := range fns {
		procs[i] = startFn(t, s, f.name, spinPy)
	}
	excl := startFn(t, s, "c.ns3", spinPy)

	var ids []string
	for _, f := range fns {
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
		b, err := s.Pool().Acquire(actx, f.name)
		acancel()
		if err != nil {
			t.Fatalf("%s's request beside the other's: %v (not co-run)", f.name, err)
		}
		ids = append(ids, b.ID)
	}
	if s.sharing == nil {
		t.Fatal("compute sharing is off")
	}
	if sh := s.sharing.co.Shares(0); len(sh) != 2 {
		t.Fatalf("the GPU's shared bindings: %+v, want a and b", sh)
	}
	// the exclusive function waits: the GPU is held by shared bindings
	cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if b, err := s.Pool().Acquire(cctx, "c.ns3"); err == nil {
		ccancel()
		t.Fatalf("the exclusive function was bound beside the co-runners (gpu %d)", b.GPU)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Logf("the exclusive request while the GPU is shared: %v", err)
	}
	ccancel()

	const secs = 3.0
	counts := make([]int, len(fns))
	var wg sync.WaitGroup
	errs := make([]error, len(fns))
	for i := range fns {
		_ = procs[i].Send(fmt.Sprintf("spin %g", secs))
	}
	for i := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := procs[i].next()
			if err == nil {
				counts[i], err = strconv.Atoi(strings.TrimPrefix(l, "spun "))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v\n%s", fns[i].name, err, procs[i].Stderr())
		}
	}
	for _, id := range ids {
		if err := s.Pool().Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	ga, gb := time.Duration(counts[0])*spinKernel, time.Duration(counts[1])*spinKernel
	got := float64(ga) / float64(ga+gb)
	total := float64(ga+gb) / (secs * float64(time.Second))
	ticks, took := s.sharing.co.TickStats()
	t.Logf("a received %.4f of the GPU time (a %v, b %v in %gs: %.3f of one GPU); %d grants, %v each", got, ga, gb,
		secs, total, ticks, took/time.Duration(max(1, ticks)))
	if math.Abs(got-0.3) > 0.05*0.3 {
		t.Errorf("a received %.4f of the co-runners' GPU time, want 0.3 within 5%%", got)
	}
	if total > 1.05 {
		t.Errorf("the two executors' functions received %.3f of the one GPU's time", total)
	}

	// once both released, the exclusive function is bound, alone and with no share
	bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
	defer bcancel()
	b, err := s.Pool().Acquire(bctx, "c.ns3")
	if err != nil {
		t.Fatal(err)
	}
	if sh := s.sharing.co.Shares(0); len(sh) != 0 {
		t.Errorf("shares with the exclusive function bound: %+v, want none", sh)
	}
	_ = excl.Send("spin 0.1")
	if l, err := excl.next(); err != nil || !strings.HasPrefix(l, "spun ") {
		t.Errorf("the exclusive function: %q %v", l, err)
	}
	if err := s.Pool().Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
}
