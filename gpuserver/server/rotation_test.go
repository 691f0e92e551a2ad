package server

import (
	"context"
	"encoding/json"
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

// stagedMLPPy is the mlp example (functions/mlp: its kernels, its way of deriving weights) with an initialisation
// the test drives step by step: "init L" loads layer L (allocates and copies its weights and bias, outside any
// request), "run" answers the forward pass of a fixed input, "ref" the same pass computed on the host in float64;
// "lazy" is "run" for a function that loads its whole model in its first request (its blocks are then scratch).
const stagedMLPPy = `
import array, ctypes, hashlib, json, os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
DIMS = [int(d) for d in os.environ["DIMS"].split(",")]
SEED = os.environ["SEED"].encode()
EXP = bytes((b & 0x80) | 0x3C for b in range(256))
def weights(layer, count):
    raw = bytearray(hashlib.shake_256(SEED + b"/%d" % layer).digest(4 * count))
    raw[3::4] = raw[3::4].translate(EXP)
    w = array.array("f")
    w.frombytes(bytes(raw))
    return w
X = array.array("f", [((i * 7) % 13 - 6) / 6.0 for i in range(DIMS[0])])
cuda = cudadrv.Driver()
with open(os.path.join(os.environ["FN_DIR"], "kernels.ptx"), "rb") as f:
    mod = cuda.load_module(f.read())
linear, relu = cuda.function(mod, "linear"), cuda.function(mod, "relu")
layers = []
def forward():
    bufs = [cuda.alloc(4 * d) for d in DIMS]
    try:
        cuda.htod(bufs[0], X)
        for i, (k, n, pw, pb) in enumerate(layers):
            cuda.launch(linear, ((n + 15) // 16, 1), (16, 16), ctypes.c_uint64(bufs[i]), ctypes.c_uint64(pw),
                        ctypes.c_uint64(pb), ctypes.c_uint64(bufs[i + 1]), ctypes.c_uint(1), ctypes.c_uint(n),
                        ctypes.c_uint(k))
            if i < len(layers) - 1:
                cuda.launch(relu, ((n + 255) // 256,), (256,), ctypes.c_uint64(bufs[i + 1]),
                            ctypes.c_uint64(bufs[i + 1]), ctypes.c_uint(n))
        y = array.array("f")
        y.frombytes(cuda.dtoh(bufs[-1], 4 * DIMS[-1]))
        return list(y)
    finally:
        for p in bufs:
            cuda.free(p)
def reference():
    row = [float(v) for v in X]
    for i in range(len(DIMS) - 1):
        k, n = DIMS[i], DIMS[i + 1]
        w, b = weights(2 * i, k * n), weights(2 * i + 1, n)
        out = [float(v) for v in b]
        for kk in range(k):
            a = row[kk]
            if a:
                out = [o + a * v for o, v in zip(out, w[kk * n:(kk + 1) * n])]
        row = [max(v, 0.0) for v in out] if i < len(DIMS) - 2 else out
    return row
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "init":
            l = int(cmd[1])
            k, n = DIMS[l], DIMS[l + 1]
            pw, pb = cuda.alloc(4 * k * n), cuda.alloc(4 * n)
            cuda.htod(pw, weights(2 * l, k * n))
            cuda.htod(pb, weights(2 * l + 1, n))
            cuda.synchronize()
            layers.append((k, n, pw, pb))
            print(json.dumps({"ok": True}), flush=True)
        elif cmd[0] == "run":
            print(json.dumps({"y": forward()}), flush=True)
        elif cmd[0] == "lazy":
            if not layers:  # the model is loaded by the first request, as a handler with "model = None" does
                for l in range(len(DIMS) - 1):
                    k, n = DIMS[l], DIMS[l + 1]
                    pw, pb = cuda.alloc(4 * k * n), cuda.alloc(4 * n)
                    cuda.htod(pw, weights(2 * l, k * n))
                    cuda.htod(pb, weights(2 * l + 1, n))
                    layers.append((k, n, pw, pb))
            print(json.dumps({"y": forward()}), flush=True)
        else:
            print(json.dumps({"y": reference()}), flush=True)
    except cudadrv.CudaError as e:
        print(json.dumps({"error": str(e)}), flush=True)
`

// stagedMLP is one function process running stagedMLPPy through the shim.
type stagedMLP struct {
	name string
	py   *testkit.Python
}

func startStagedMLP(t *testing.T, s *Server, name, dims, seed string) *stagedMLP {
	t.Helper()
	fn := filepath.Join(testkit.RepoRoot(t), "functions", "mlp")
	env := append(testkit.ShimEnv(testkit.Shim(t), s.RemotingSocket(), name, s.Token(name)), "FN_DIR="+fn,
		"DIMS="+dims, "SEED="+seed)
	m := &stagedMLP{name: name, py: testkit.StartPython(t, stagedMLPPy, env...)}
	if l, ok := m.py.Line(); !ok || l != "ready" {
		t.Fatalf("%s did not start: %q\n%s", name, l, m.py.Stderr())
	}
	return m
}

// do sends one command and decodes the answer line.
func (m *stagedMLP) do(t *testing.T, cmd string) (y []float64) {
	t.Helper()
	_ = m.py.Send(cmd)
	line, ok := m.py.Line()
	if !ok {
		t.Fatalf("%s ended\n%s", m.name, m.py.Stderr())
	}
	var a struct {
		OK    bool      `json:"ok"`
		Y     []float64 `json:"y"`
		Error string    `json:"error"`
	}
	if err := json.Unmarshal([]byte(line), &a); err != nil || a.Error != "" {
		t.Fatalf("%s %s: %q %v\n%s", m.name, cmd, line, err, m.py.Stderr())
	}
	return a.Y
}

// rotationDims and rotationQuota size the functions of the rotations below: a model of these dimensions takes 6
// chunks of 2 MiB (weights of 1, 4 and 1 MiB, the small blocks together): with a quota of 16 MiB, one function fits
// on a GPU of 24 MiB.
const rotationDims, rotationQuota = "256,1024,1024,256,64", 16 << 20

// startRotationServer starts a server on a v100x4 node whose four GPUs hold one model of rotationDims each; tenants
// (nil: none) is its Tenants.
func startRotationServer(ctx context.Context, t *testing.T, tenants *TenantConfig) *Server {
	t.Helper()
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	if node, err = node.WithGPUMemory(24 << 20); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 24 << 20, Tenants: tenants})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startRotationMLPs registers functions prefix0 to prefix5 with rotationQuota and starts a stagedMLP of
// rotationDims for each, the even ones of one seed, the odd ones of another.
func startRotationMLPs(ctx context.Context, t *testing.T, s *Server, prefix string) []*stagedMLP {
	t.Helper()
	fns := make([]*stagedMLP, 6)
	for i := range fns {
		name := fmt.Sprintf("%s%d", prefix, i)
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: rotationQuota}); err != nil {
			t.Fatal(err)
		}
		fns[i] = startStagedMLP(t, s, name, rotationDims, fmt.Sprintf("seed-%d", i%2))
	}
	return fns
}

// rotate sends cmd to every function in turn, each under a binding it acquires and releases, for three rounds:
// every answer of the first round must match the host's reference, every later answer must equal the function's
// first.
func rotate(ctx context.Context, t *testing.T, s *Server, fns []*stagedMLP, cmd string) {
	t.Helper()
	p := s.Pool()
	first := make([][]float64, len(fns))
	for round := range 3 {
		for i, f := range fns {
			b, err := p.Acquire(ctx, f.name)
			if err != nil {
				t.Fatalf("round %d: acquire %s: %v", round, f.name, err)
			}
			y := f.do(t, cmd)
			if err := p.Release(ctx, b.ID); err != nil {
				t.Fatalf("round %d: release %s: %v", round, f.name, err)
			}
			if round == 0 {
				first[i] = y
				ref := f.do(t, "ref")
				for j := range ref {
					if math.Abs(y[j]-ref[j]) > 1e-4*(1+math.Abs(ref[j])) {
						t.Fatalf("%s: first answer on gpu %d (swap %s): y[%d] = %v, the host computes %v (%d of %d "+
							"values zero)", f.name, b.GPU, b.Swap, j, y[j], ref[j], zeroCount(y), len(y))
					}
				}
				continue
			}
			for j := range y {
				if y[j] != first[i][j] {
					t.Fatalf("%s: round %d on gpu %d (swap %s): y[%d] = %v, its first answer was %v (%d of %d "+
						"values zero)", f.name, round, b.GPU, b.Swap, j, y[j], first[i][j], zeroCount(y), len(y))
				}
			}
		}
	}
}

// TestRotationThroughTheControllerKeepsEveryAnswer is the six-mlp scenario through the pool, the executors and
// the real shim: six functions initialise layer by layer on a node whose four GPUs hold one model each, so the
// controller evicts functions between the calls of their initialisations, and then answer three rounds of
// requests, coming back from the host image. Every answer must equal the function's first, which must match the
// host's reference. Before, an eviction ended the initialisation of the evicted function early, the layers it
// loaded afterwards were scratch, and answers came back all zeros.
func TestRotationThroughTheControllerKeepsEveryAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim")
	}
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := startRotationServer(ctx, t, nil)
	defer stop(t, s)
	fns := startRotationMLPs(ctx, t, s, "mlp")
	for l := range strings.Count(rotationDims, ",") {
		for _, f := range fns {
			f.do(t, fmt.Sprintf("init %d", l))
		}
	}
	rotate(ctx, t, s, fns, "run")
	if sw := s.Swaps(); sw["pcie"] == 0 {
		t.Fatalf("no swap-in from the host: %v", sw)
	}
	if st := s.Executors().Images(); st.Saves == 0 {
		t.Fatalf("no initialising function was evicted (image stats %+v): the test no longer covers that", st)
	}
}

func zeroCount(v []float64) int {
	n := 0
	for _, x := range v {
		if x == 0 {
			n++
		}
	}
	return n
}

// TestLazyModelsKeepEveryAnswerAcrossEvictions is the six-mlp rotation for functions that load their model in their
// first request (a handler's "model = None ... if model is None: model = load()"), through the pool, the controller,
// the real shim and, as on up, an executor process per tenant: every block of their model is scratch. Four GPUs hold
// one model each, so the functions evict each other and come back three times; every answer must equal the
// function's first, which must match the host's reference. Before, scratch was dropped on eviction and mapped
// zeroed at the next swap-in: the answers after an eviction were computed on zeros and served with 200.
func TestLazyModelsKeepEveryAnswerAcrossEvictions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tc, _ := tenantConfig(t)
	s := startRotationServer(ctx, t, tc)
	defer stop(t, s)
	rotate(ctx, t, s, startRotationMLPs(ctx, t, s, "lazy"), "lazy")
	var back, restored uint64
	for _, st := range s.pool.node.Status() {
		back, restored = back+st.ScratchWrittenBack, restored+st.ScratchRestored
	}
	if back == 0 || restored == 0 {
		t.Fatalf("scratch written back %d bytes, restored %d: no lazy model was evicted and swapped in again, the "+
			"test no longer covers that", back, restored)
	}
	if m := grep(scrape(t, s), "faas_gpu_scratch_written_back_bytes_total"); m == "" {
		t.Fatal("no faas_gpu_scratch_written_back_bytes_total in the metrics")
	}
	t.Logf("scratch written back %d MiB, restored %d MiB; swaps %v", back>>20, restored>>20, s.Swaps())
}
