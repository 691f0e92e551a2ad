# A function process through the shim for the tenant isolation tests (gpuserver/server attack_test.go,
# gpuserver/executor tenants_test.go): victim and attacker at once. Its model is n floats 1..n (captured as its image
# at its first request); a module global "secret" holds 5000..5000+n-1. It prints "ready <model address> <global
# address>", then for "good" the sum of its model doubled (vector_add of it with itself), for "read <address>" the
# sum of vector_add reading n floats at that address (a kernel following any pointer), or "fault <CUDA error>".
import array, ctypes, os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
with open(os.path.join(os.environ["FN_DIR"], "kernels.ptx"), "rb") as f:
    add = cuda.function(cuda.load_module(f.read()), "vector_add")
n = 1024
a = cuda.alloc(4 * n)
cuda.htod(a, array.array("f", [float(i + 1) for i in range(n)]))
mod = cuda.load_module(b".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 secret[4096];\n")
gp, gs = ctypes.c_uint64(), ctypes.c_size_t()
cuda.check("cuModuleGetGlobal", cuda.lib.cuModuleGetGlobal_v2(ctypes.byref(gp), ctypes.byref(gs), mod, b"secret"))
cuda.htod(gp.value, array.array("f", [float(5000 + i) for i in range(n)]))
c = cuda.alloc(4 * n)
print("ready %d %d" % (a, gp.value), flush=True)
def run(x):
    cuda.launch(add, ((n + 255) // 256,), (256,), ctypes.c_uint64(x), ctypes.c_uint64(x), ctypes.c_uint64(c),
                ctypes.c_uint(n))
    cuda.synchronize()
    out = array.array("f")
    out.frombytes(cuda.dtoh(c, 4 * n))
    return sum(out)
for line in sys.stdin:
    w = line.split()
    try:
        print("sum %g" % run(a if w[0] == "good" else int(w[1])), flush=True)
    except cudadrv.CudaError as e:
        print("fault %d" % e.code, flush=True)
