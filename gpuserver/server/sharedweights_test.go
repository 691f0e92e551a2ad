package server

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// variantPy is a variant of a shared base model through the shim: at start it loads 4 MiB of base weights (the
// same bytes in every variant, from one seed) and a head of its own, outside any request. Commands, each answered
// with a JSON line: "sum" (the base's weights read back, as a digest), "copy" (a host-to-device copy into the base
// weights), "kernel" (the mlp's relu kernel writing the base weights in place, then a synchronisation); a failed
// call answers its CUDA error code.
const variantPy = `
import ctypes, hashlib, json, os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
EXP = bytes((b & 0x80) | 0x3C for b in range(256))
def floats(seed, n):
    raw = bytearray(hashlib.shake_256(seed).digest(4 * n))
    raw[3::4] = raw[3::4].translate(EXP)
    return bytes(raw)
BASE = floats(b"base", 1 << 20)
cuda = cudadrv.Driver()
with open(os.path.join(os.environ["FN_DIR"], "kernels.ptx"), "rb") as f:
    relu = cuda.function(cuda.load_module(f.read()), "relu")
base, head = cuda.alloc(len(BASE)), cuda.alloc(1 << 20)
cuda.htod(base, BASE)
cuda.htod(head, floats(os.environ["HEAD"].encode(), 1 << 18))
cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    try:
        if cmd == "sum":
            print(json.dumps({"sum": hashlib.sha256(cuda.dtoh(base, len(BASE))).hexdigest()}), flush=True)
        elif cmd == "copy":
            cuda.htod(base, bytes(4096))
            print(json.dumps({"code": 0}), flush=True)
        elif cmd == "kernel":
            n = len(BASE) // 4
            cuda.launch(relu, ((n + 255) // 256,), (256,), ctypes.c_uint64(base), ctypes.c_uint64(base), ctypes.c_uint(n))
            cuda.synchronize()
            print(json.dumps({"code": 0}), flush=True)
    except cudadrv.CudaError as e:
        print(json.dumps({"code": e.code}), flush=True)
`

// TestHostileVariantCannotChangeSharedWeights: two variants of one base model in one namespace
// (com.openfaas.gpu.model: shared), hostile and honest, as function processes through the shim on a node of one GPU.
// The hostile variant swaps in first, alone, and writes into its base weights: a copy answers
// CUDA_ERROR_NOT_PERMITTED, a kernel writing them faults its own work. Each time the honest variant swaps in beside
// it, maps the base chunks already on the GPU, and reads the true weights. Before, the first variant's copy and
// kernel succeeded (the chunks were writable until a second copy mapped them) and the honest variant read the
// attacker's bytes as its weights.
func TestHostileVariantCannotChangeSharedWeights(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node, err := topology.Preset("h200x1")
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
	fnDir := filepath.Join(testkit.RepoRoot(t), "functions", "mlp")
	type variant struct {
		name string
		py   *testkit.Python
	}
	start := func(name string) *variant {
		if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 16 << 20,
			Model: pool.ModelShared}); err != nil {
			t.Fatal(err)
		}
		env := append(testkit.ShimEnv(testkit.Shim(t), s.RemotingSocket(), name, s.Token(name)), "FN_DIR="+fnDir,
			"HEAD="+name)
		v := &variant{name: name, py: testkit.StartPython(t, variantPy, env...)}
		if l, ok := v.py.Line(); !ok || l != "ready" {
			t.Fatalf("%s did not start: %q\n%s", name, l, v.py.Stderr())
		}
		return v
	}
	// in runs cmd in a request of v (a binding it acquires and releases) and decodes the answer.
	in := func(v *variant, cmd string) (sum string, code int) {
		t.Helper()
		b, err := s.Pool().Acquire(ctx, v.name)
		if err != nil {
			t.Fatalf("%s: acquire: %v", v.name, err)
		}
		_ = v.py.Send(cmd)
		line, ok := v.py.Line()
		_ = s.Pool().Release(ctx, b.ID) // a binding whose work faulted answers broken: the fault is the point
		if !ok {
			t.Fatalf("%s ended\n%s", v.name, v.py.Stderr())
		}
		var a struct {
			Sum  string `json:"sum"`
			Code int    `json:"code"`
		}
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			t.Fatalf("%s %s: %q: %v", v.name, cmd, line, err)
		}
		return a.Sum, a.Code
	}
	evict := func(names ...string) {
		t.Helper()
		for _, name := range names {
			gpus, _, err := s.Executors().Resident(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range gpus {
				if err := s.Executors().Evict(ctx, name, g); err != nil {
					t.Fatalf("evict %s from gpu %d: %v", name, g, err)
				}
			}
		}
	}
	hostile, honest := start("hostile.variants"), start("honest.variants")
	truth, _ := in(hostile, "sum") // the first requests capture both images
	if got, _ := in(honest, "sum"); got != truth {
		t.Fatalf("the variants' base weights differ before any attack: %s, %s", got, truth)
	}

	for _, attack := range []struct {
		cmd  string
		want int
	}{{"copy", 800 /* CUDA_ERROR_NOT_PERMITTED */}, {"kernel", 700 /* CUDA_ERROR_ILLEGAL_ADDRESS */}} {
		evict(hostile.name, honest.name)
		shared := s.Executors().Sharing().SharedBytes
		if _, code := in(hostile, attack.cmd); code != attack.want { // alone on the gpu, from its image
			t.Fatalf("the hostile variant's %s into its shared weights answered %d, want %d", attack.cmd, code,
				attack.want)
		}
		if _, code := in(hostile, "sum"); code != 0 {
			t.Fatalf("the hostile variant after its %s: CUDA error %d", attack.cmd, code)
		}
		if got, code := in(honest, "sum"); code != 0 || got != truth {
			t.Fatalf("after the hostile variant's %s, the honest variant reads %s (CUDA error %d), the true weights "+
				"are %s", attack.cmd, got, code, truth)
		}
		if s.Executors().Sharing().SharedBytes == shared {
			t.Fatalf("the honest variant mapped no chunk of the hostile one after its %s: the test no longer covers "+
				"the attack", attack.cmd)
		}
	}
}
