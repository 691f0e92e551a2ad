package controller

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// twoGPUs is a node of two 1 GiB GPUs, each behind its own PCIe switch (1 GB/s), joined by a 10 GB/s NVLink.
func twoGPUs(t *testing.T, memory uint64) topology.Node {
	t.Helper()
	g := topology.GPU{Name: "test GPU", MemoryBytes: memory, CopyEngines: 1, H2DBytesPerSec: 1e9}
	n := topology.Node{Name: "two", GPUs: []topology.GPU{g, g}, SwitchUplinkBytesPerSec: []float64{1e9, 1e9},
		NVLinkBytesPerSec: [][]float64{{0, 10e9}, {10e9, 0}}, Slowdown: topology.Slowdown{HostOtherSwitch: 1,
			NVLinkOtherPair: 1}}
	n.GPUs[1].PCIeSwitch = 1
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	return n
}

func newTwo(t *testing.T, policy Policy) *Controller {
	t.Helper()
	c, err := New(Config{Policy: policy, Node: twoGPUs(t, 1<<30)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dispatchOne dispatches and wants exactly one decision, for request id on GPU gpu with the given swap.
func dispatchOne(t *testing.T, c *Controller, now time.Time, id uint64, gpu int, swap string) Decision {
	t.Helper()
	ds := c.Dispatch(now)
	if len(ds) != 1 || ds[0].Request != id || ds[0].GPU != gpu || ds[0].Swap != swap {
		t.Fatalf("dispatch: %+v, want request %d on gpu %d by %s", ds, id, gpu, swap)
	}
	return ds[0]
}

func submit(t *testing.T, c *Controller, now time.Time, id uint64, fn string) {
	t.Helper()
	if err := c.Submit(now, id, fn); err != nil {
		t.Fatal(err)
	}
}

func finish(t *testing.T, c *Controller, now time.Time, id uint64) {
	t.Helper()
	if _, err := c.Complete(now, id, time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

// TestSetHealthyTakesTheGPUOutOfPlacement: with a on both GPUs and b on GPU 1 only, GPU 1 fails while a request of
// a runs there and a request of b copies b from GPU 1 to GPU 0 over NVLink. Both requests break (their release
// reports pool.ErrGPUUnhealthy), GPU 1 shows unhealthy with nothing resident, the NVLink transfer is over, the
// half-copied b is not kept on GPU 0, and the next requests are bound to GPU 0 only, one at a time, even while
// GPU 1 is idle. Back in service, GPU 1 is empty and takes requests again.
func TestSetHealthyTakesTheGPUOutOfPlacement(t *testing.T) {
	c := newTwo(t, PolicyFaaSGPU)
	t0 := time.Unix(1000, 0)
	for _, fn := range []string{"a", "b"} {
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: fn, MemoryBytes: 400 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	// a onto GPU 0 and GPU 1 from host; then b onto GPU 1 (the idle one with room and no eviction).
	submit(t, c, t0, 1, "a")
	dispatchOne(t, c, t0, 1, 0, SwapPCIe)
	submit(t, c, t0, 2, "a")
	dispatchOne(t, c, t0, 2, 1, SwapPCIe)
	finish(t, c, t0.Add(time.Second), 1)
	finish(t, c, t0.Add(time.Second), 2)
	submit(t, c, t0.Add(2*time.Second), 3, "a")
	dispatchOne(t, c, t0.Add(2*time.Second), 3, 0, SwapNone)
	submit(t, c, t0.Add(2*time.Second), 4, "b")
	dispatchOne(t, c, t0.Add(2*time.Second), 4, 1, SwapPCIe)
	finish(t, c, t0.Add(3*time.Second), 3)
	finish(t, c, t0.Add(3*time.Second), 4)

	// a runs on GPU 1 (resident there and on 0: the first idle replica is 0, so bind 0 first with a), then b is
	// copied from GPU 1 into GPU 0 over NVLink, pinning the copy on GPU 1.
	t1 := t0.Add(4 * time.Second)
	submit(t, c, t1, 5, "a")
	dispatchOne(t, c, t1, 5, 0, SwapNone)
	submit(t, c, t1, 6, "a")
	dispatchOne(t, c, t1, 6, 1, SwapNone)
	finish(t, c, t1, 5)
	submit(t, c, t1, 7, "b")
	d7 := dispatchOne(t, c, t1, 7, 0, SwapNVLink)
	if d7.Source != 1 || c.gpus[1].resident["b"].pinned != 1 || len(c.ActiveTransfers()) != 1 {
		t.Fatalf("b's swap: %+v, pinned %d, transfers %v", d7, c.gpus[1].resident["b"].pinned, c.ActiveTransfers())
	}

	if _, err := c.SetHealthy(t1, 2, false); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("gpu 2 of 2: %v, want ErrUnknownGPU", err)
	}
	if _, err := c.SetHealthy(t1, -1, false); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("gpu -1: %v, want ErrUnknownGPU", err)
	}
	if dropped, err := c.SetHealthy(t1, 1, false); err != nil || len(dropped) != 0 {
		t.Fatalf("fail gpu 1: %v %v", dropped, err)
	}
	st := c.Status()
	if g := st.GPUs[1]; g.Healthy || len(g.Resident) != 0 || g.UsedBytes != 0 || !g.Busy {
		t.Fatalf("failed gpu 1: %+v, want unhealthy, nothing resident, still bound to request 6", g)
	}
	if !st.GPUs[0].Healthy || !slices.Equal(st.GPUs[0].Resident, []string{"a", "b"}) {
		t.Fatalf("gpu 0: %+v", st.GPUs[0])
	}
	for _, f := range st.Functions {
		if slices.Contains(f.Resident, 1) {
			t.Fatalf("%s still counted resident on the failed gpu: %v", f.Name, f.Resident)
		}
	}
	if tr := c.ActiveTransfers(); len(tr) != 0 {
		t.Fatalf("transfers after the source failed: %v", tr)
	}

	// Requests 6 (on GPU 1) and 7 (reading from GPU 1) broke: their release still works and says so.
	if onTime, err := c.Complete(t1.Add(time.Second), 6, time.Millisecond); onTime ||
		!errors.Is(err, pool.ErrGPUUnhealthy) {
		t.Fatalf("complete request 6 on the failed gpu: %v %v", onTime, err)
	}
	if _, err := c.Complete(t1.Add(time.Second), 7, time.Millisecond); !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.Fatalf("complete request 7, copied from the failed gpu: %v", err)
	}
	if _, err := c.Complete(t1.Add(time.Second), 7, time.Millisecond); !errors.Is(err, ErrUnknownReq) {
		t.Fatalf("request 7 completed twice: %v", err)
	}
	if st := c.Status(); !slices.Equal(st.GPUs[0].Resident, []string{"a"}) || st.GPUs[0].UsedBytes != 400<<20 ||
		st.GPUs[0].Busy || st.GPUs[1].Busy {
		t.Fatalf("after the broken requests ended: %+v", st.GPUs)
	}

	// GPU 1 is idle but out of service: b swaps into GPU 0 from host, and the next request waits for GPU 0.
	t2 := t1.Add(2 * time.Second)
	submit(t, c, t2, 8, "b")
	submit(t, c, t2, 9, "a")
	ds := c.Dispatch(t2)
	if len(ds) != 1 || ds[0].Request != 8 || ds[0].GPU != 0 || ds[0].Swap != SwapPCIe {
		t.Fatalf("dispatch after the failure: %+v, want only request 8 on gpu 0 from host", ds)
	}
	finish(t, c, t2.Add(time.Second), 8)
	dispatchOne(t, c, t2.Add(time.Second), 9, 0, SwapNone)
	submit(t, c, t2.Add(time.Second), 10, "b")
	if ds := c.Dispatch(t2.Add(time.Second)); len(ds) != 0 {
		t.Fatalf("request 10 bound while the only healthy gpu is busy: %+v", ds)
	}

	// Back in service, empty: request 10 copies b from GPU 0 over NVLink.
	if _, err := c.SetHealthy(t2.Add(time.Second), 1, true); err != nil {
		t.Fatal(err)
	}
	if g := c.Status().GPUs[1]; !g.Healthy || len(g.Resident) != 0 || g.UsedBytes != 0 {
		t.Fatalf("gpu 1 back in service: %+v, want healthy and empty", g)
	}
	dispatchOne(t, c, t2.Add(time.Second), 10, 1, SwapNVLink)
	finish(t, c, t2.Add(2*time.Second), 9)
	finish(t, c, t2.Add(2*time.Second), 10)
	if n := c.q.Len(); n != 0 || len(c.reqs) != 0 {
		t.Fatalf("left over: %d queued, %d requests", n, len(c.reqs))
	}
}

// TestSetHealthyUnpinsTheSourceOfACopyIntoTheFailedGPU: b is copied from GPU 0 into GPU 1 when GPU 1 fails; the
// copy on GPU 0 is no longer pinned (it can be evicted), and the request's end does not unpin it twice.
func TestSetHealthyUnpinsTheSourceOfACopyIntoTheFailedGPU(t *testing.T) {
	c := newTwo(t, PolicyTorpor)
	t0 := time.Unix(1000, 0)
	for _, fn := range []string{"a", "b"} {
		if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: fn, MemoryBytes: 600 << 20}}); err != nil {
			t.Fatal(err)
		}
	}
	submit(t, c, t0, 1, "b")
	dispatchOne(t, c, t0, 1, 0, SwapPCIe)
	finish(t, c, t0.Add(time.Second), 1)
	submit(t, c, t0.Add(time.Second), 2, "b")
	dispatchOne(t, c, t0.Add(time.Second), 2, 0, SwapNone)
	submit(t, c, t0.Add(time.Second), 3, "b")
	dispatchOne(t, c, t0.Add(time.Second), 3, 1, SwapNVLink)
	finish(t, c, t0.Add(2*time.Second), 2)
	if p := c.gpus[0].resident["b"].pinned; p != 1 {
		t.Fatalf("source pinned %d times, want 1", p)
	}
	if _, err := c.SetHealthy(t0.Add(2*time.Second), 1, false); err != nil {
		t.Fatal(err)
	}
	if p := c.gpus[0].resident["b"].pinned; p != 0 {
		t.Fatalf("source still pinned %d times after the target failed", p)
	}
	// a does not fit beside b on GPU 0: b, no longer pinned, is evicted.
	submit(t, c, t0.Add(2*time.Second), 4, "a")
	d := dispatchOne(t, c, t0.Add(2*time.Second), 4, 0, SwapPCIe)
	if len(d.Evict) != 1 || d.Evict[0] != (Eviction{Function: "b", GPU: 0}) {
		t.Fatalf("a's evictions: %+v, want b from gpu 0", d.Evict)
	}
	if _, err := c.Complete(t0.Add(3*time.Second), 3, 0); !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.Fatalf("complete the copy into the failed gpu: %v", err)
	}
	finish(t, c, t0.Add(3*time.Second), 4)
	for _, g := range c.gpus {
		for name, r := range g.resident {
			if r.pinned != 0 {
				t.Fatalf("%s on gpu %d pinned %d times with no request in flight", name, g.index, r.pinned)
			}
		}
	}
}

// TestSetHealthyMovesNativeFunctions: under native binding a function pinned to the failed GPU is pinned to one with
// room; one that finds none loses its waiting requests (the pool fails their acquires with pool.ErrGPUUnhealthy)
// and is refused until a GPU returns.
func TestSetHealthyMovesNativeFunctions(t *testing.T) {
	p, err := NewPool(PoolConfig{Controller: Config{Policy: PolicyNative, Node: twoGPUs(t, 4<<30), ContextBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Footprints 2 GiB: a on GPU 0, b on GPU 1, c on GPU 0 (least used first); GPU 1 keeps 2 GiB free.
	for _, fn := range []string{"a", "b", "c"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	hold, err := p.Acquire(ctx, "a")
	if err != nil || hold.GPU != 0 {
		t.Fatalf("a: %+v %v", hold, err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := p.Acquire(ctx, "c"); waiting <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for p.Status(ctx).Queued != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the acquire of c never queued")
		}
		time.Sleep(time.Millisecond)
	}
	if err := p.SetHealthy(0, false); err != nil {
		t.Fatal(err)
	}
	// a moved to GPU 1 (2 GiB free); c found no room: its waiting acquire fails.
	if err := <-waiting; !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.Fatalf("waiting acquire of c: %v, want ErrGPUUnhealthy", err)
	}
	if _, err := p.Acquire(ctx, "c"); !errors.Is(err, pool.ErrTooLarge) {
		t.Fatalf("acquire of c with no GPU: %v", err)
	}
	if err := p.Release(ctx, hold.ID); !errors.Is(err, pool.ErrGPUUnhealthy) {
		t.Fatalf("release of a's binding on the failed gpu: %v", err)
	}
	if err := p.Release(ctx, hold.ID); !errors.Is(err, pool.ErrUnknownBinding) {
		t.Fatalf("second release: %v", err)
	}
	b, err := p.Acquire(ctx, "a")
	if err != nil || b.GPU != 1 {
		t.Fatalf("a after gpu 0 failed: %+v %v", b, err)
	}
	if err := p.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.SetHealthy(0, true); err != nil {
		t.Fatal(err)
	}
	if b, err = p.Acquire(ctx, "c"); err != nil || b.GPU != 0 {
		t.Fatalf("c once gpu 0 returned: %+v %v", b, err)
	}
	if err := p.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.SetHealthy(5, false); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("gpu 5: %v", err)
	}
}

// TestPropertyGPUFailure drives every policy through random workloads on the v100x4 node in which one random GPU
// fails at a random moment (and, in half the runs, returns later). Checked at every step: no decision places on
// an unhealthy GPU or on a GPU already bound; an unhealthy GPU holds nothing and has no transfers; no copy is
// pinned more times than requests read it; and in the end every submitted request was either refused at Submit,
// dropped with a reason, or completed exactly once - with pool.ErrGPUUnhealthy exactly when a GPU of its binding
// failed while it was bound.
func TestPropertyGPUFailure(t *testing.T) {
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	node, err = node.WithGPUMemory(8 << 30)
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range Policies() {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("%s/%d", policy, seed), func(t *testing.T) {
				propertyRun(t, node, policy, seed)
			})
		}
	}
}

func propertyRun(t *testing.T, node topology.Node, policy Policy, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	c, err := New(Config{Policy: policy, Node: node, Seed: seed, ContextBytes: 512 << 20, ColdStart: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	var fns []string
	for i := range 8 {
		name := fmt.Sprintf("f%d", i)
		spec := pool.FunctionSpec{Name: name, MemoryBytes: uint64(1+rng.IntN(4)) << 29}
		if rng.IntN(2) == 0 {
			spec.SLO = time.Duration(50+rng.IntN(500)) * time.Millisecond
		}
		if err := c.Register(now, Function{FunctionSpec: spec}); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, name)
	}
	const steps = 400
	failAt, healAt := rng.IntN(steps/2), -1
	if rng.IntN(2) == 0 {
		healAt = failAt + 1 + rng.IntN(steps/2)
	}
	failed := rng.IntN(len(node.GPUs))
	type req struct {
		gpu       int
		bound     bool
		ended     bool
		broken    bool // bound on (or swapping from) the failed GPU when it failed
		decision  Decision
		completed int
	}
	reqs := map[uint64]*req{}
	var nextID uint64
	var bound []uint64
	onGPU := map[int]uint64{}
	check := func(ds []Decision) {
		t.Helper()
		for _, d := range ds {
			r := reqs[d.Request]
			if r == nil || r.bound || r.ended {
				t.Fatalf("decision for request %d that is not waiting: %+v", d.Request, d)
			}
			if c.gpus[d.GPU].unhealthy {
				t.Fatalf("request %d placed on unhealthy gpu %d", d.Request, d.GPU)
			}
			if d.Swap == SwapNVLink && c.gpus[d.Source].unhealthy {
				t.Fatalf("request %d copies from unhealthy gpu %d", d.Request, d.Source)
			}
			if other, busy := onGPU[d.GPU]; busy {
				t.Fatalf("request %d placed on gpu %d, still bound to request %d", d.Request, d.GPU, other)
			}
			onGPU[d.GPU] = d.Request
			r.bound, r.gpu, r.decision = true, d.GPU, d
			bound = append(bound, d.Request)
		}
		pins := map[[2]int]int{} // (gpu, function index) -> readers
		for _, id := range bound {
			r := reqs[id]
			if d := r.decision; d.Swap == SwapNVLink && c.reqs[id].swapping && !c.reqs[id].released {
				pins[[2]int{d.Source, slices.Index(fns, d.Function)}]++
			}
		}
		for _, g := range c.gpus {
			transfers := 0
			for _, p := range c.links.Paths() {
				if p.To == g.index || p.From == g.index {
					transfers++
				}
			}
			if g.unhealthy && (len(g.resident) != 0 || g.used != 0 || transfers != 0 || len(g.loading) != 0) {
				t.Fatalf("unhealthy gpu %d: %d resident, %d bytes used, %d transfers", g.index, len(g.resident),
					g.used, transfers)
			}
			for name, res := range g.resident {
				if want := pins[[2]int{g.index, slices.Index(fns, name)}]; res.pinned != want {
					t.Fatalf("%s on gpu %d pinned %d times, %d requests read it", name, g.index, res.pinned, want)
				}
			}
		}
	}
	complete := func(i int) {
		t.Helper()
		id := bound[i]
		bound = slices.Delete(bound, i, i+1)
		r := reqs[id]
		delete(onGPU, r.gpu)
		if c.reqs[id].swapping {
			if err := c.SwapDone(now, id, 10*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		_, err := c.Complete(now, id, time.Duration(1+rng.IntN(50))*time.Millisecond)
		if r.broken != errors.Is(err, pool.ErrGPUUnhealthy) || (err != nil && !r.broken) {
			t.Fatalf("complete request %d (broken %v): %v", id, r.broken, err)
		}
		r.ended = true
		r.completed++
	}
	for step := range steps {
		now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
		switch step {
		case failAt:
			for _, id := range bound {
				d := reqs[id].decision
				if d.GPU == failed || (d.Swap == SwapNVLink && d.Source == failed && c.reqs[id].swapping) {
					reqs[id].broken = true
				}
			}
			dropped, err := c.SetHealthy(now, failed, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range dropped {
				if r := reqs[id]; r == nil || r.bound || r.ended {
					t.Fatalf("dropped request %d is not waiting", id)
				}
				reqs[id].ended = true
			}
		case healAt:
			if _, err := c.SetHealthy(now, failed, true); err != nil {
				t.Fatal(err)
			}
		}
		if len(bound) > 0 && rng.IntN(3) == 0 {
			complete(rng.IntN(len(bound)))
		} else {
			nextID++
			if err := c.Submit(now, nextID, fns[rng.IntN(len(fns))]); err != nil {
				if !errors.Is(err, pool.ErrTooLarge) && !errors.Is(err, pool.ErrOverloaded) { // native; shed
					t.Fatal(err)
				}
			} else {
				reqs[nextID] = &req{}
			}
		}
		check(c.Dispatch(now))
	}
	// Drain: with the failed GPU still out of service when it never returned.
	for len(bound) > 0 {
		now = now.Add(time.Millisecond)
		complete(0)
		check(c.Dispatch(now))
	}
	for id, r := range reqs {
		switch {
		case !r.ended:
			t.Fatalf("request %d never ended (bound %v)", id, r.bound)
		case r.bound && r.completed != 1:
			t.Fatalf("request %d completed %d times", id, r.completed)
		}
	}
	if c.q.Len() != 0 || len(c.reqs) != 0 {
		t.Fatalf("controller still holds %d queued, %d requests", c.q.Len(), len(c.reqs))
	}
}
