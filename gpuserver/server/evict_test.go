package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// mlpDriver runs functions/mlp/handler.py in a Python process whose libcuda.so.1 is the shim, one JSON request per
// line on stdin, one JSON answer per line on stdout (the HTTP template is not needed: the test binds through the
// pool itself, as the template's acquire/release would).
type mlpDriver struct {
	*testkit.Python
}

const mlpDriverPy = `
import json, os, sys
sys.path.insert(0, os.environ["FN_PARENT"])
from function import handler
class Event:
    def __init__(self, body):
        self.body, self.headers, self.method, self.query, self.path = body, {}, "POST", {}, "/"
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    try:
        out = handler.handle(Event(line.encode()), None)
    except Exception as e:  # a CUDA error: answer it as the template would, a 500
        out = {"statusCode": 500, "body": {"error": str(e)}}
    print(json.dumps(out), flush=True)
`

func startMLP(t *testing.T, s *Server) *mlpDriver {
	t.Helper()
	testkit.NeedPython(t)
	lib := testkit.Shim(t)
	parent := t.TempDir()
	if err := os.Symlink(filepath.Join(testkit.RepoRoot(t), "functions", "mlp"), filepath.Join(parent, "function")); err != nil {
		t.Fatal(err)
	}
	d := &mlpDriver{testkit.StartPython(t, mlpDriverPy, append(testkit.ShimEnv(lib, s.RemotingSocket(), "mlp",
		s.Token("mlp")), "FN_PARENT="+parent)...)}
	var ready map[string]any
	d.recv(t, &ready)
	return d
}

// recv decodes the driver's next answer into v.
func (d *mlpDriver) recv(t *testing.T, v any) {
	t.Helper()
	line := d.Next()
	if err := json.Unmarshal([]byte(line), v); err != nil {
		t.Fatalf("mlp answered %.200q: %v", line, err)
	}
}

// TestMLPSurvivesEvictionAndSwaps runs the mlp through the shim on a node too small to keep everything resident:
// the controller's swap and evict decisions move and drop its 155 MB model on the executors (GPU to GPU, then
// from the host image after an eviction everywhere), and its output stays identical.
func TestMLPSurvivesEvictionAndSwaps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mlp in a Python process through the shim")
	}
	dir := t.TempDir()
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	// 1.2 GiB GPUs with 1 GiB of chunks each (0.9 of 1.2 GiB, capped at 1 GiB), the controller's plan: one 1 GiB
	// function fills a GPU.
	if node, err = node.WithGPUMemory(1200 << 20); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	p, x := s.Pool(), s.Executors()
	register := func(name string, bytes uint64) {
		if err := p.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: bytes}); err != nil {
			t.Fatal(err)
		}
	}
	register("mlp", 512<<20)
	for i := range 4 {
		register(fmt.Sprintf("fill-%d", i), 1<<30)
		register(fmt.Sprintf("small-%d", i), 256<<20)
	}
	d := startMLP(t, s) // its initialisation ran under implicit bindings

	in := make([]float64, 1024)
	for i := range in {
		in[i] = math.Sin(float64(i))
	}
	line, _ := json.Marshal(map[string]any{"x": in})
	mlp := func() (pool.Binding, string) {
		t.Helper()
		b, err := p.Acquire(ctx, "mlp")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release(ctx, b.ID)
		_ = d.Send(string(line))
		var r struct {
			StatusCode int             `json:"statusCode"`
			Body       json.RawMessage `json:"body"`
		}
		d.recv(t, &r)
		if r.StatusCode != 200 {
			t.Fatalf("mlp on gpu %d: %d %s\nstderr:\n%s", b.GPU, r.StatusCode, r.Body, d.Stderr())
		}
		return b, string(r.Body)
	}
	// occupy holds bindings of the given functions until one runs on gpu, and releases the others.
	occupy := func(prefix string, gpu int) pool.Binding {
		t.Helper()
		var held []pool.Binding
		defer func() {
			for _, b := range held {
				if b.GPU != gpu {
					_ = p.Release(ctx, b.ID)
				}
			}
		}()
		for i := range 4 {
			b, err := p.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, b)
			if b.GPU == gpu {
				return b
			}
		}
		t.Fatalf("no %s binding landed on gpu %d: %+v", prefix, gpu, held)
		return pool.Binding{}
	}

	b0, first := mlp()
	if !strings.Contains(first, `"y"`) {
		t.Fatalf("mlp answered %.200s", first)
	}
	if !x.Captured("mlp") {
		t.Fatal("the first request did not end the mlp's initialisation (no captured image)")
	}

	// Its GPU busy, the mlp runs on another one, its model copied GPU to GPU; the first copy stays parked.
	hold := occupy("small", b0.GPU)
	b1, out := mlp()
	if b1.GPU == b0.GPU || b1.Swap != "nvlink" {
		t.Fatalf("with gpu %d busy the mlp ran on gpu %d with swap %q, want another gpu over nvlink", b0.GPU, b1.GPU,
			b1.Swap)
	}
	if out != first {
		t.Fatalf("after the swap to gpu %d the mlp answered differently:\n%.200s\nfirst:\n%.200s", b1.GPU, out, first)
	}
	if gpus, _, _ := x.Resident("mlp"); !slices.Contains(gpus, b0.GPU) || !slices.Contains(gpus, b1.GPU) {
		t.Fatalf("mlp resident on %v, want gpus %d and %d", gpus, b0.GPU, b1.GPU)
	}
	if err := p.Release(ctx, hold.ID); err != nil {
		t.Fatal(err)
	}

	// A 1 GiB function on every GPU at once: every copy of the mlp is evicted (invalidated).
	var fills []pool.Binding
	for i := range 4 {
		b, err := p.Acquire(ctx, fmt.Sprintf("fill-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		fills = append(fills, b)
	}
	if gpus, _, _ := x.Resident("mlp"); len(gpus) != 0 {
		t.Fatalf("with every GPU filled the mlp is still resident on %v", gpus)
	}
	for _, f := range p.Status(ctx).Functions {
		if f.Name == "mlp" && len(f.Resident) != 0 {
			t.Fatalf("the pool shows the mlp resident on %v after the evictions", f.Resident)
		}
	}
	// Keep its first GPU filled: the mlp comes back from the host image on another GPU.
	for _, f := range fills {
		if f.GPU != b0.GPU {
			if err := p.Release(ctx, f.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	b2, out := mlp()
	if b2.GPU == b0.GPU || b2.Swap != "pcie" {
		t.Fatalf("after the evictions the mlp ran on gpu %d with swap %q, want a gpu other than %d over pcie",
			b2.GPU, b2.Swap, b0.GPU)
	}
	if out != first {
		t.Fatalf("after eviction and a swap-in from host on gpu %d the mlp answered differently", b2.GPU)
	}
	if b3, out := mlp(); b3.Swap != "none" || out != first {
		t.Fatalf("resident again: swap %q, same output %v", b3.Swap, out == first)
	}

	swaps := s.Swaps()
	for _, kind := range []string{"nvlink", "pcie", "none"} {
		if swaps[kind] == 0 {
			t.Errorf("no binding with swap %q counted: %v", kind, swaps)
		}
	}
	var moved uint64
	for _, st := range x.Status() {
		moved += st.SwapBytes
	}
	if moved < 2*150<<20 {
		t.Errorf("executors moved %d bytes, want at least two swaps of the mlp's model", moved)
	}
}
