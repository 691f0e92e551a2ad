package pool

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

const gib = 1 << 30

func newTestPool(t *testing.T, gpus ...uint64) *FCFS {
	t.Helper()
	var gs []GPU
	for _, m := range gpus {
		gs = append(gs, GPU{Name: "sim", MemoryBytes: m})
	}
	p, err := NewFCFS(gs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func register(t *testing.T, p *FCFS, name string, mem uint64) {
	t.Helper()
	if err := p.Register(context.Background(), FunctionSpec{Name: name, MemoryBytes: mem}); err != nil {
		t.Fatal(err)
	}
}

func TestFCFSBindsResidentFirstAndSwapsOtherwise(t *testing.T) {
	ctx := context.Background()
	p := newTestPool(t, 4*gib, 4*gib)
	register(t, p, "a", gib)
	b1, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if b1.Swap != "pcie" {
		t.Fatalf("first binding swap = %q, want pcie", b1.Swap)
	}
	if err := p.Release(ctx, b1.ID); err != nil {
		t.Fatal(err)
	}
	b2, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if b2.Swap != "none" || b2.GPU != b1.GPU {
		t.Fatalf("second binding = %+v, want resident on GPU %d", b2, b1.GPU)
	}
	if err := p.Release(ctx, b2.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, b2.ID); !errors.Is(err, ErrUnknownBinding) {
		t.Fatalf("double release: err = %v, want ErrUnknownBinding", err)
	}
	st := p.Status(ctx)
	if st.Functions[0].Served != 2 || st.Functions[0].Running != 0 || st.Functions[0].Queued != 0 {
		t.Fatalf("function status = %+v", st.Functions[0])
	}
}

func TestFCFSEvictsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(0, 0)
	p, err := NewFCFS([]GPU{{Name: "sim", MemoryBytes: 2 * gib}}, func() time.Time { now = now.Add(time.Millisecond); return now })
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a", "b", "c"} {
		register(t, p, f, gib)
	}
	for _, f := range []string{"a", "b", "a", "c"} { // c evicts b, the least recently used
		b, err := p.Acquire(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	res := p.Status(ctx).GPUs[0].Resident
	if len(res) != 2 || res[0] != "a" || res[1] != "c" {
		t.Fatalf("resident = %v, want [a c]", res)
	}
	if used := p.Status(ctx).GPUs[0].UsedBytes; used != 2*gib {
		t.Fatalf("used = %d, want %d", used, 2*gib)
	}
}

func TestFCFSQueuesInArrivalOrderAndCancels(t *testing.T) {
	ctx := context.Background()
	p := newTestPool(t, 4*gib)
	register(t, p, "a", gib)
	hold, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// A waiter whose context ends leaves the queue without a binding.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(cctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if q := p.Status(ctx).Queued; q != 0 {
		t.Fatalf("queued after cancel = %d", q)
	}
	// Waiters are served in arrival order.
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := p.Acquire(ctx, "a")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			if err := p.Release(ctx, b.ID); err != nil {
				t.Error(err)
			}
		}()
		testkit.Eventually(t, 10*time.Second, "the acquire queued", func() bool { return p.Status(ctx).Queued == i+1 })
	}
	if err := p.Release(ctx, hold.ID); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("served waiter %d, want %d", got, want)
		}
		want++
	}
}

func TestFCFSRefusesWhatCannotFit(t *testing.T) {
	ctx := context.Background()
	p := newTestPool(t, gib)
	err := p.Register(ctx, FunctionSpec{Name: "big", MemoryBytes: 2 * gib})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	if _, err := p.Acquire(ctx, "nope"); !errors.Is(err, ErrUnknownFunction) {
		t.Fatalf("err = %v, want ErrUnknownFunction", err)
	}
	for _, spec := range []FunctionSpec{{}, {Name: "x"}, {Name: "x", MemoryBytes: 1, Percentile: 100},
		{Name: "x", MemoryBytes: 1, Isolation: "private"}, {Name: "x", MemoryBytes: 1, SLO: -1}} {
		if err := p.Register(ctx, spec); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("Register(%+v) err = %v, want ErrInvalidSpec", spec, err)
		}
	}
}

func TestFCFSDeregisterFailsWaiters(t *testing.T) {
	ctx := context.Background()
	p := newTestPool(t, 4*gib)
	register(t, p, "a", gib)
	hold, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := p.Acquire(ctx, "a"); errc <- err }()
	testkit.Eventually(t, 10*time.Second, "the acquire queued", func() bool { return p.Status(ctx).Queued == 1 })
	if err := p.Deregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrUnknownFunction) {
		t.Fatalf("waiter err = %v, want ErrUnknownFunction", err)
	}
	if err := p.Release(ctx, hold.ID); err != nil {
		t.Fatal(err)
	}
	if used := p.Status(ctx).GPUs[0].UsedBytes; used != 0 {
		t.Fatalf("used after deregister = %d", used)
	}
}

func TestFCFSSetHealthyTakesTheGPUOutOfPlacement(t *testing.T) {
	ctx := context.Background()
	p := newTestPool(t, 4*gib, 4*gib)
	register(t, p, "a", gib)
	held, err := p.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetHealthy(held.GPU, false); err != nil {
		t.Fatal(err)
	}
	if err := p.SetHealthy(7, false); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("SetHealthy(7) err = %v", err)
	}
	st := p.Status(ctx)
	if g := st.GPUs[held.GPU]; g.Healthy || len(g.Resident) != 0 || g.UsedBytes != 0 {
		t.Fatalf("failed GPU status: %+v", g)
	}
	other := 1 - held.GPU
	for range 3 { // every later request goes to the healthy GPU, swapping in once
		b, err := p.Acquire(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if b.GPU != other {
			t.Fatalf("bound to GPU %d, want the healthy GPU %d", b.GPU, other)
		}
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Release(ctx, held.ID); !errors.Is(err, ErrGPUUnhealthy) {
		t.Fatalf("release of the binding on the failed GPU: err = %v, want ErrGPUUnhealthy", err)
	}
	if err := p.SetHealthy(held.GPU, true); err != nil {
		t.Fatal(err)
	}
	if g := p.Status(ctx).GPUs[held.GPU]; !g.Healthy || len(g.Resident) != 0 {
		t.Fatalf("recovered GPU status: %+v", g)
	}
}
