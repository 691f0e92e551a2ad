package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
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
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20})
	defer stop(t, s)
	p := s.Pool()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "va.ns1", MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	shim, _ := filepath.Abs("../../shim")
	if out, err := exec.Command("make", "-s", "-C", shim).CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}
	fn, _ := filepath.Abs("../../functions/vector-add")
	cmd := exec.Command("python3", "-c", faultyPy)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(shim, "build"), "FN_DIR="+fn,
		"FAAS_GPU_REMOTING_SOCKET="+s.RemotingSocket(), "FAAS_GPU_FUNCTION=va.ns1", "FAAS_GPU_TOKEN="+s.Token("va.ns1"),
		"PYTHONDONTWRITEBYTECODE=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	out := bufio.NewScanner(stdout)
	next := func() string {
		t.Helper()
		if !out.Scan() {
			t.Fatalf("the function process ended: %v\n%s", out.Err(), stderr.String())
		}
		return out.Text()
	}
	if l := next(); l != "ready" {
		t.Fatalf("the function process said %q", l)
	}
	request := func(what string) (string, error) {
		t.Helper()
		b, err := p.Acquire(ctx, "va.ns1")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(in, what)
		l := next()
		return l, p.Release(ctx, b.ID)
	}
	const want = "sum 1.0496e+06" // 2 * (1 + ... + 1024)
	if l, err := request("good"); l != want || err != nil {
		t.Fatalf("first request: %q %v", l, err)
	}
	l, err := request("bad")
	if l != "fault 700 model intact" {
		t.Fatalf("the faulting request: %q\n%s", l, stderr.String())
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
