"""model: the function faas-gpu replay deploys for each function of a trace window. Its model size and its GPU
time per request follow a row of the model table, through the environment:

  REPLAY_MODEL_BYTES    device memory allocated and written at initialisation: the function's model, what a swap
                        moves when the gpuserver places the function on another GPU or brings it back
  REPLAY_EXEC_NS        GPU time of each request: one busy kernel of that many nanoseconds on the GPU bound to
                        the request (on the timed virtual GPU it takes exactly that; on a real GPU it spins)

Every request answers {"gpu": <the bound GPU>} once its kernel finished.

  REPLAY_TIMING=1       time each request's phases in this process (faas-gpu replay --timing): the acquire's round
                        trip less its wait in the gpuserver's queue, the template's work before the handler, the
                        launch, the synchronize (the kernel and its round trip), the template's work after the
                        handler, and the release's round trip. A request with the query timing=1 answers the
                        phases of the requests before it (count, mean, p50, p90, in ms) instead, and starts afresh.
"""

import ctypes
import os
import threading
import time

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


_clock = time.perf_counter_ns
_now = threading.local()  # this request's instants (REPLAY_TIMING)
_phases = []  # the requests' phases in ns, as (acquire, before, launch, sync, after, release)
_PHASES = ("acquire_round_trip", "template_before", "launch", "synchronize", "template_after", "release_round_trip")


def _time_the_template():
    """Wraps the template's acquire and release (index.py runs as __main__) to take their instants."""
    import __main__

    client = getattr(__main__, "GPUClient", None)
    if client is None:
        return
    acquire, release = client._acquire, client.release

    def timed_acquire(self):
        t0 = _clock()
        binding, lease = acquire(self)
        _now.acquired = (t0, _clock(), int(binding.get("queued_ns") or 0))
        _now.handled = None
        return binding, lease

    def timed_release(self, binding_id, lease):
        t0 = _clock()
        try:
            return release(self, binding_id, lease)
        finally:
            t1 = _clock()
            acq, handled = getattr(_now, "acquired", None), getattr(_now, "handled", None)
            if acq is not None and handled is not None:
                a0, a1, queued = acq
                h0, h1, h2 = handled
                _phases.append((a1 - a0 - queued, h0 - a1, h1 - h0, h2 - h1, t0 - h2, t1 - t0))
            _now.acquired = None

    client._acquire, client.release = timed_acquire, timed_release


TIMING = os.environ.get("REPLAY_TIMING", "") in ("1", "true")
if TIMING:
    _time_the_template()


def _summary():
    rows, _phases[:] = list(_phases), []
    out = {"requests": len(rows)}
    for i, name in enumerate(_PHASES):
        v = sorted(r[i] for r in rows)
        if not v:
            continue
        out[name] = {"mean_ms": sum(v) / len(v) / 1e6, "p50_ms": v[len(v) // 2] / 1e6,
                     "p90_ms": v[min(len(v) - 1, int(len(v) * 0.9))] / 1e6}
    return out


def handle(event, context):
    if TIMING and event.query.get("timing") == "1":
        _now.handled = None
        return {"statusCode": 200, "body": _summary(), "headers": {"Content-Type": "application/json"}}
    h0 = _clock()
    with _lock:
        _cuda.launch(_busy, (1,), (1,), ctypes.c_uint64(EXEC_NS))
        h1 = _clock()
        _cuda.synchronize()
    _now.handled = (h0, h1, _clock())
    return {"statusCode": 200, "body": {"gpu": (context.gpu or {}).get("gpu")},
            "headers": {"Content-Type": "application/json"}}
