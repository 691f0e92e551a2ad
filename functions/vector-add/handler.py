"""vector-add: c = a + b on the GPU bound to the request, through the CUDA driver API (ctypes on libcuda.so.1).

Request: {"a": [...], "b": [...]} float32 values, equal lengths, at most 1M each. Answer: {"c": [...]}.
"""

import array
import ctypes
import json
import os
import threading

try:
    from . import cudadrv
except ImportError:  # run as a plain module
    import cudadrv

MAX_LEN = 1 << 20
BLOCK = 256

_lock = threading.Lock()
_here = os.path.dirname(os.path.abspath(__file__))
_cuda = cudadrv.Driver()
with open(os.path.join(_here, "kernels.ptx"), "rb") as f:
    _module = _cuda.load_module(f.read())
_kernel = _cuda.function(_module, "vector_add")


def _bad(message):
    return {"statusCode": 400, "body": {"error": message}, "headers": {"Content-Type": "application/json"}}


def _vector(body, name):
    v = body.get(name)
    if not isinstance(v, list):
        return None, f"{name}: must be a list of numbers"
    if len(v) > MAX_LEN:
        return None, f"{name}: at most {MAX_LEN} values, got {len(v)}"
    try:
        return array.array("f", v), None
    except (TypeError, OverflowError):
        return None, f"{name}: must be a list of numbers"


def add(a, b):
    """Returns a + b (float32 arrays of equal length) computed on the device."""
    n = len(a)
    if n == 0:
        return array.array("f")
    size = 4 * n
    with _lock:
        pa, pb, pc = _cuda.alloc(size), _cuda.alloc(size), _cuda.alloc(size)
        try:
            _cuda.htod(pa, a)
            _cuda.htod(pb, b)
            _cuda.launch(_kernel, ((n + BLOCK - 1) // BLOCK,), (BLOCK,), ctypes.c_uint64(pa), ctypes.c_uint64(pb),
                         ctypes.c_uint64(pc), ctypes.c_uint(n))
            out = array.array("f")
            out.frombytes(_cuda.dtoh(pc, size))
            return out
        finally:
            for p in (pa, pb, pc):
                _cuda.free(p)


def handle(event, context):
    try:
        body = json.loads(event.body or b"{}")
    except ValueError as e:
        return _bad(f"body: invalid JSON: {e}")
    if not isinstance(body, dict):
        return _bad("body: must be a JSON object with a and b")
    a, err = _vector(body, "a")
    if err:
        return _bad(err)
    b, err = _vector(body, "b")
    if err:
        return _bad(err)
    if len(a) != len(b):
        return _bad(f"b: length {len(b)} differs from a's {len(a)}")
    c = add(a, b)
    return {"statusCode": 200, "body": {"c": c.tolist()}, "headers": {"Content-Type": "application/json"}}
