"""tenant-fn: the tenant isolation test's function (test/e2e tenants_test.go), victim and attacker at once.

Its model is n floats 1..n, allocated at import (its image after its first request); a module global "secret"
holds 5000..5000+n-1. A request {} answers {"sum": <its model doubled>, "model": <its address>, "global": <the
global's address>}; {"read": <address>} launches vector_add reading n floats at that address (a kernel following any
pointer) and answers its sum, or 500 with the CUDA error.
"""

import array
import ctypes
import json
import os

try:
    from . import cudadrv
except ImportError:  # run as a plain module
    import cudadrv

N = 1024
_here = os.path.dirname(os.path.abspath(__file__))
_cuda = cudadrv.Driver()
with open(os.path.join(_here, "kernels.ptx"), "rb") as f:
    _add = _cuda.function(_cuda.load_module(f.read()), "vector_add")
_model = _cuda.alloc(4 * N)
_cuda.htod(_model, array.array("f", [float(i + 1) for i in range(N)]))
_mod = _cuda.load_module(b".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 secret[4096];\n")
_global, _size = ctypes.c_uint64(), ctypes.c_size_t()
_cuda.check("cuModuleGetGlobal", _cuda.lib.cuModuleGetGlobal_v2(ctypes.byref(_global), ctypes.byref(_size), _mod,
                                                                 b"secret"))
_cuda.htod(_global.value, array.array("f", [float(5000 + i) for i in range(N)]))
_out = _cuda.alloc(4 * N)


def handle(event, context):
    req = json.loads(event.body or b"{}")
    x = int(req.get("read") or _model)
    try:
        _cuda.launch(_add, ((N + 255) // 256,), (256,), ctypes.c_uint64(x), ctypes.c_uint64(x),
                     ctypes.c_uint64(_out), ctypes.c_uint(N))
        _cuda.synchronize()
        out = array.array("f")
        out.frombytes(_cuda.dtoh(_out, 4 * N))
    except cudadrv.CudaError as e:
        return {"statusCode": 500, "body": {"fault": e.code}}
    return {"statusCode": 200, "body": {"sum": sum(out), "model": _model, "global": _global.value}}
