package server

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestBindingLeftByADeadProcessNeverServesItsState: the mlp's process was SIGKILLed while a
// binding of its request was still held; after that binding was released by hand, the next process's requests
// answered all zeros with 200 (its weights had gone into scratch memory of the old, never reset, state). Now the
// function's memory is reset when its last process ends even under a held binding: that binding is broken (its
// release says so, 503), the next process never runs under it, initialises afresh, and answers correctly after
// its model moved to another GPU.
func TestBindingLeftByADeadProcessNeverServesItsState(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mlp in Python processes through the shim")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{DeviceReserveBytes: 1 << 30})
	defer stop(t, s)
	p, x := s.Pool(), s.Executors()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "mlp", MemoryBytes: 512 << 20}); err != nil {
		t.Fatal(err)
	}
	in := make([]float64, 1024)
	for i := range in {
		in[i] = math.Sin(float64(i))
	}
	line, _ := json.Marshal(map[string]any{"x": in})
	ask := func(d *mlpDriver) []float64 {
		t.Helper()
		_ = d.Send(string(line))
		var r struct {
			StatusCode int `json:"statusCode"`
			Body       struct {
				Y []float64 `json:"y"`
			} `json:"body"`
		}
		d.recv(t, &r)
		if r.StatusCode != 200 || len(r.Body.Y) != 256 {
			t.Fatalf("mlp answered %d with %d values\nstderr:\n%s", r.StatusCode, len(r.Body.Y), d.Stderr())
		}
		return r.Body.Y
	}

	a := startMLP(t, s)
	left, err := p.Acquire(ctx, "mlp")
	if err != nil {
		t.Fatal(err)
	}
	want := ask(a)
	if nonzero(want) == 0 {
		t.Fatal("the first answer is all zeros")
	}
	// The process dies mid-request: its binding stays held (by whoever holds it: here the test).
	a.Kill()
	testkit.Eventually(t, 60*time.Second, "the memory of the function whose last process died forgotten", func() bool {
		return !x.Captured("mlp")
	})

	// The next process initialises while the broken binding is still held: it must not run under it, so it
	// waits for a binding of its own.
	started := make(chan *mlpDriver, 1)
	go func() { started <- startMLP(t, s) }()
	testkit.Eventually(t, 60*time.Second, "the new process's initialisation queued for a binding of its own", func() bool {
		st := p.Status(ctx)
		return len(st.Functions) == 1 && st.Functions[0].Queued >= 1
	})
	if err := p.Release(ctx, left.ID); !errors.Is(err, pool.ErrBindingBroken) {
		t.Fatalf("release of the binding the dead process left: %v, want ErrBindingBroken", err)
	}
	b := <-started

	for i, gpu := range []int{-1, 2, 0} { // in place, then moved to other GPUs (scratch would be lost)
		if gpu >= 0 {
			if err := x.SwapIn(ctx, "mlp", gpu, executor.Any); err != nil {
				t.Fatal(err)
			}
		}
		bind, err := p.Acquire(ctx, "mlp")
		if err != nil {
			t.Fatal(err)
		}
		got := ask(b)
		if err := p.Release(ctx, bind.ID); err != nil {
			t.Fatal(err)
		}
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("request %d on gpu %d: y[%d] = %v, the first process answered %v (%d of 256 nonzero)", i,
					bind.GPU, j, got[j], want[j], nonzero(got))
			}
		}
	}
}

func nonzero(v []float64) int {
	n := 0
	for _, x := range v {
		if x != 0 {
			n++
		}
	}
	return n
}
