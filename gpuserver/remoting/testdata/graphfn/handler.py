"""graphfn: CUDA graphs through the shim with ctypes (standard library only), for gpuserver/remoting's graph tests.

At import it allocates a, b and c (n floats) and captures on a stream of its own: c = a + b, c *= 2, a = 0 (a
memset), b = c (a device-to-device copy). Requests:
  {"a": [...], "b": [...]}  copies a and b in, launches the graph `launches` times (default 1), answers c, a, b
  {"invalid": true}         captures a host-to-device copy: answers the results of the copy and of the end
  {"update": alpha}         captures the same nodes with scale alpha and updates the executable graph
  {"nodes": true}           answers cuGraphGetNodes's count and the capture status seen while capturing
"""
import array
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "..", "..", "functions",
                                "vector-add"))
import cudadrv  # noqa: E402

N = 1024
drv = cudadrv.Driver()
L = drv.lib
vp, u64 = ctypes.c_void_p, ctypes.c_uint64
with open(os.path.join(os.path.dirname(os.path.realpath(cudadrv.__file__)), "kernels.ptx"), "rb") as f:
    mod = drv.load_module(f.read() + b"\0")
vector_add, scale = drv.function(mod, "vector_add"), drv.function(mod, "scale")
a, b, c = (drv.alloc(4 * N) for _ in range(3))
stream = vp()
drv.check("cuStreamCreate", L.cuStreamCreate(ctypes.byref(stream), 1))
L.cuLaunchKernel.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
L.cuMemsetD32Async.argtypes = [u64, ctypes.c_uint, ctypes.c_size_t, vp]
L.cuMemcpyDtoDAsync_v2.argtypes = [u64, u64, ctypes.c_size_t, vp]
L.cuMemcpyHtoDAsync_v2.argtypes = [u64, vp, ctypes.c_size_t, vp]
seen = {}


def launch(f, *args):
    params = (vp * len(args))(*[ctypes.cast(ctypes.pointer(x), vp) for x in args])
    drv.check("cuLaunchKernel", L.cuLaunchKernel(f, N // 256, 1, 1, 256, 1, 1, 0, stream, params, None))


def capture(alpha):
    drv.check("cuStreamBeginCapture", L.cuStreamBeginCapture_v2(stream, 0))
    status = ctypes.c_int()
    drv.check("cuStreamIsCapturing", L.cuStreamIsCapturing(stream, ctypes.byref(status)))
    seen["capturing"] = status.value
    launch(vector_add, u64(a), u64(b), u64(c), ctypes.c_uint(N))
    launch(scale, u64(c), ctypes.c_float(alpha), ctypes.c_uint(N))
    drv.check("cuMemsetD32Async", L.cuMemsetD32Async(a, 0, N, stream))
    drv.check("cuMemcpyDtoDAsync", L.cuMemcpyDtoDAsync_v2(b, c, 4 * N, stream))
    g = vp()
    drv.check("cuStreamEndCapture", L.cuStreamEndCapture(stream, ctypes.byref(g)))
    drv.check("cuStreamIsCapturing", L.cuStreamIsCapturing(stream, ctypes.byref(status)))
    seen["after"] = status.value
    return g


graph = capture(2.0)
execg = vp()
drv.check("cuGraphInstantiateWithFlags", L.cuGraphInstantiateWithFlags(ctypes.byref(execg), graph, u64(0)))


def floats(ptr):
    return list(array.array("f", drv.dtoh(ptr, 4 * N)))


def handle(event, context):
    req = json.loads(event.body)
    if req.get("nodes"):
        n = ctypes.c_size_t()
        drv.check("cuGraphGetNodes", L.cuGraphGetNodes(graph, None, ctypes.byref(n)))
        return {"statusCode": 200, "body": {"nodes": n.value, **seen}}
    if req.get("invalid"):
        drv.check("cuStreamBeginCapture", L.cuStreamBeginCapture_v2(stream, 0))
        host = (ctypes.c_float * N)()
        copy = L.cuMemcpyHtoDAsync_v2(a, host, 4 * N, stream)
        g = vp()
        end = L.cuStreamEndCapture(stream, ctypes.byref(g))
        return {"statusCode": 200, "body": {"copy": copy, "end": end, "graph": g.value or 0}}
    if "update" in req:
        g2 = capture(float(req["update"]))
        info = (ctypes.c_int64 * 3)()
        r = L.cuGraphExecUpdate_v2(execg, g2, info)
        return {"statusCode": 200, "body": {"update": r, "result": info[0] & 0xffffffff}}
    drv.htod(a, array.array("f", req["a"]))
    drv.htod(b, array.array("f", req["b"]))
    for _ in range(req.get("launches", 1)):
        drv.check("cuGraphLaunch", L.cuGraphLaunch(execg, stream))
    drv.check("cuStreamSynchronize", L.cuStreamSynchronize(stream))
    return {"statusCode": 200, "body": {"c": floats(c), "a": floats(a), "b": floats(b)}}
