package server

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// faultyPy is a function process through the shim: its model is n floats 1..n; "good" computes a + a and prints the
// sum, "try" does the same and prints "error <CUDA result>" when a call fails, "bad" launches the kernel on address
// 0x1000, then (as a handler that catches the error would) reads its model back in the same request.
const faultyPy = `
import array, ctypes, os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
with open(os.path.join(os.environ["FN_DIR"], "kernels.ptx"), "rb") as f:
    add = cuda.function(cuda.load_module(f.read()), "vector_add")
n = 1024
a = cuda.alloc(4 * n)
cuda.htod(a, array.array("f", [float(i + 1) for i in range(n)]))
c = cuda.alloc(4 * n)
print("ready", flush=True)
def run(x):
    cuda.launch(add, ((n + 255) // 256,), (256,), ctypes.c_uint64(x), ctypes.c_uint64(a), ctypes.c_uint64(c),
                ctypes.c_uint(n))
    cuda.synchronize()
    out = array.array("f")
    out.frombytes(cuda.dtoh(c, 4 * n))
    return sum(out)
for line in sys.stdin:
    if line.strip() == "good":
        print("sum %g" % run(a), flush=True)
        continue
    if line.strip() == "try":
        try:
            print("sum %g" % run(a), flush=True)
        except cudadrv.CudaError as e:
            print("error %d" % e.code, flush=True)
        continue
    try:
        run(0x1000)
        print("no fault", flush=True)
    except cudadrv.CudaError as e:
        back = array.array("f")
        back.frombytes(cuda.dtoh(a, 4 * n))
        print("fault %d model %s" % (e.code, "intact" if list(back) == [float(i + 1) for i in range(n)] else "lost"),
              flush=True)
`

// TestKernelFaultInARequest, through the pool and the shim: one request's kernel faults; the
// request's call answers CUDA_ERROR_ILLEGAL_ADDRESS (700), the process goes on in the same request with its model
// restored from its image, the binding's release says it broke (so the template answers 503, not 200), the GPU
// stays healthy, and the next request is served correctly. Before, the GPU was marked unhealthy for good.
func TestKernelFaultInARequest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a Python process through the shim")
	}
	lib := testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20})
	defer stop(t, s)
	p := s.Pool()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "va.ns1", MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	fn := filepath.Join(testkit.RepoRoot(t), "functions", "vector-add")
	py := testkit.StartPython(t, faultyPy, append(testkit.ShimEnv(lib, s.RemotingSocket(), "va.ns1",
		s.Token("va.ns1")), "FN_DIR="+fn)...)
	if l := py.Next(); l != "ready" {
		t.Fatalf("the function process said %q", l)
	}
	request := func(what string) (string, error) {
		t.Helper()
		b, err := p.Acquire(ctx, "va.ns1")
		if err != nil {
			t.Fatal(err)
		}
		_ = py.Send(what)
		l := py.Next()
		return l, p.Release(ctx, b.ID)
	}
	const want = "sum 1.0496e+06" // 2 * (1 + ... + 1024)
	if l, err := request("good"); l != want || err != nil {
		t.Fatalf("first request: %q %v", l, err)
	}
	l, err := request("bad")
	if l != "fault 700 model intact" {
		t.Fatalf("the faulting request: %q\n%s", l, py.Stderr())
	}
	if !errors.Is(err, pool.ErrBindingBroken) {
		t.Fatalf("release of the faulting request's binding: %v, want ErrBindingBroken (503)", err)
	}
	for g := range s.Executors().GPUs() {
		if !s.Executors().Healthy(g) {
			t.Fatalf("gpu %d taken out of service", g)
		}
	}
	if l, err := request("good"); l != want || err != nil {
		t.Fatalf("the request after the fault: %q %v", l, err)
	}
}
