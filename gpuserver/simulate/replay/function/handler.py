"""model: the function faas-gpu replay deploys for each function of a trace window. Its model size and its GPU
time per request follow a row of the model table, through the environment:

  REPLAY_MODEL_BYTES    device memory allocated and written at initialisation: the function's model, what a swap
                        moves when the gpuserver places the function on another GPU or brings it back
  REPLAY_EXEC_NS        GPU time of each request: one busy kernel of that many nanoseconds on the GPU bound to
                        the request (on the timed virtual GPU it takes exactly that; on a real GPU it spins)

Every request answers {"gpu": <the bound GPU>} once its kernel finished.
"""

import ctypes
import os
import threading

try:
    from . import cudadrv
except ImportError:  # run as a plain module
    import cudadrv

MODEL_BYTES = int(os.environ["REPLAY_MODEL_BYTES"])
EXEC_NS = int(os.environ["REPLAY_EXEC_NS"])
PIECE = 16 << 20  # written in pieces, so that the process never holds the whole model in host memory

_lock = threading.Lock()
_here = os.path.dirname(os.path.abspath(__file__))
_cuda = cudadrv.Driver()
with open(os.path.join(_here, "kernels.ptx"), "rb") as f:
    _module = _cuda.load_module(f.read())
_busy = _cuda.function(_module, "busy")
_model = _cuda.alloc(MODEL_BYTES)
_piece = b"\x5a" * min(PIECE, MODEL_BYTES)
for _off in range(0, MODEL_BYTES, PIECE):
    _cuda.htod(_model + _off, _piece[: min(PIECE, MODEL_BYTES - _off)])
del _piece


def handle(event, context):
    with _lock:
        _cuda.launch(_busy, (1,), (1,), ctypes.c_uint64(EXEC_NS))
        _cuda.synchronize()
    return {"statusCode": 200, "body": {"gpu": (context.gpu or {}).get("gpu")},
            "headers": {"Content-Type": "application/json"}}
