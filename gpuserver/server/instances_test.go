package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestInstancesAreBoundOnSeveralGPUsAtOnce: a function's requests were bound one at a time (its blocks lived at
// one address, mapped on one GPU at a time), so four replicas of a hot function used one GPU. Now each instance
// (pool.InstanceKey) is placed and held on its own: four instances hold four GPUs at once, a fifth request of an
// instance already bound waits for its release (one request per instance), and the function's own requests
// (no instance) stay one at a time.
func TestInstancesAreBoundOnSeveralGPUsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{})
	defer stop(t, s)
	p := s.Pool()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "hot", MemoryBytes: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	gpus := map[int]string{}
	var held []pool.Binding
	for _, inst := range []string{"hot-1", "hot-2", "hot-3", "hot-4"} {
		b, err := p.Acquire(ctx, pool.InstanceKey("hot", inst))
		if err != nil {
			t.Fatalf("acquire instance %s while %d are bound: %v", inst, len(held), err)
		}
		if b.Function != "hot" || b.Instance != inst {
			t.Errorf("binding of %s names function %q, instance %q", inst, b.Function, b.Instance)
		}
		if other, ok := gpus[b.GPU]; ok {
			t.Errorf("instances %s and %s are bound on gpu %d at once", other, inst, b.GPU)
		}
		gpus[b.GPU] = inst
		held = append(held, b)
	}
	// One request per instance: a second one of hot-1 waits for its first.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := p.Acquire(short, pool.InstanceKey("hot", "hot-1"))
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a second request of a bound instance: %v, want it to wait (deadline exceeded)", err)
	}
	for _, b := range held {
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if fs := s.Pool().Status(ctx).Functions; len(fs) != 1 || fs[0].Name != "hot" || fs[0].Instances != 4 ||
		fs[0].Served != 4 || len(fs[0].Resident) != 4 {
		t.Errorf("the pool lists %+v, want hot with 4 instances, 4 requests served, copies on 4 GPUs", fs)
	}
	// Deregistering the function forgets its instances.
	if err := p.Deregister(ctx, "hot"); err != nil {
		t.Fatal(err)
	}
	if fs := s.Pool().Status(ctx).Functions; len(fs) != 0 {
		t.Errorf("after deregistering the function the pool lists %v", fs)
	}
	if _, err := p.Acquire(ctx, pool.InstanceKey("hot", "hot-1")); !errors.Is(err, pool.ErrUnknownFunction) {
		t.Errorf("an instance of a deregistered function: %v, want ErrUnknownFunction", err)
	}
}

// TestInstancesInitialiseAndAnswerOnTwoGPUsAtOnce runs two processes of the mlp through the shim, each naming its
// instance (FAAS_GPU_INSTANCE): each initialises its own model at addresses of its own, the second after the first
// instance served its first request (where a replica started late used to answer zeros), both are bound at the
// same moment on two GPUs, and both answer what the host computes... the same for both, since their weights are
// identical (held once in host memory).
func TestInstancesInitialiseAndAnswerOnTwoGPUsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mlp in Python processes through the shim")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{DeviceReserveBytes: 1 << 30})
	defer stop(t, s)
	p := s.Pool()
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
	same := func(what string, a, b []float64) {
		t.Helper()
		nonzero := false
		for i := range a {
			if math.Abs(a[i]-b[i]) > 1e-6*math.Max(1, math.Abs(b[i])) {
				t.Fatalf("%s: y[%d] = %g, want %g", what, i, a[i], b[i])
			}
			nonzero = nonzero || a[i] != 0
		}
		if !nonzero {
			t.Fatalf("%s: every value is zero", what)
		}
	}

	a := startMLPInstance(t, s, "mlp-a")
	ba, err := p.Acquire(ctx, pool.InstanceKey("mlp", "mlp-a"))
	if err != nil {
		t.Fatal(err)
	}
	ya := ask(a) // the first request of instance a: its initialisation ends, its image is captured
	b := startMLPInstance(t, s, "mlp-b")
	bb, err := p.Acquire(ctx, pool.InstanceKey("mlp", "mlp-b")) // a is still bound
	if err != nil {
		t.Fatal(err)
	}
	if ba.GPU == bb.GPU {
		t.Fatalf("both instances are bound on gpu %d", ba.GPU)
	}
	same("instance b, started after a's first request, bound beside a", ask(b), ya)
	same("instance a again, while b is bound", ask(a), ya)
	for _, id := range []string{ba.ID, bb.ID} {
		if err := p.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// Both again, bound the other way round (each copy may move: its own image, its own addresses).
	bb, err = p.Acquire(ctx, pool.InstanceKey("mlp", "mlp-b"))
	if err != nil {
		t.Fatal(err)
	}
	ba, err = p.Acquire(ctx, pool.InstanceKey("mlp", "mlp-a"))
	if err != nil {
		t.Fatal(err)
	}
	same("instance b, second round", ask(b), ya)
	same("instance a, second round", ask(a), ya)
	for _, id := range []string{ba.ID, bb.ID} {
		if err := p.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// b's process ends: its copies leave the controller (the data plane forgot its memory), a serves on.
	b.Kill()
	testkit.EventuallyNil(t, 30*time.Second, "b's copies forgotten", func() error {
		if fs := p.Status(ctx).Functions; len(fs) != 1 || fs[0].Instances != 1 {
			return fmt.Errorf("functions %+v, want mlp with 1 instance", fs)
		}
		return nil
	})
	ba, err = p.Acquire(ctx, pool.InstanceKey("mlp", "mlp-a"))
	if err != nil {
		t.Fatal(err)
	}
	same("instance a after b ended", ask(a), ya)
	if err := p.Release(ctx, ba.ID); err != nil {
		t.Fatal(err)
	}
}

// startMLPInstance is startMLP for one instance of the mlp.
func startMLPInstance(t *testing.T, s *Server, instance string) *mlpDriver {
	t.Helper()
	testkit.NeedPython(t)
	lib := testkit.Shim(t)
	parent := t.TempDir()
	if err := os.Symlink(filepath.Join(testkit.RepoRoot(t), "functions", "mlp"), filepath.Join(parent, "function")); err != nil {
		t.Fatal(err)
	}
	env := append(testkit.ShimEnv(lib, s.RemotingSocket(), "mlp", s.Token("mlp")), "FN_PARENT="+parent,
		contract.EnvInstance+"="+instance)
	d := &mlpDriver{testkit.StartPython(t, mlpDriverPy, env...)}
	var ready map[string]any
	d.recv(t, &ready)
	return d
}
