"""batchy: a GPU function that takes several requests in flight at once under one GPU binding (CONCURRENCY: the
gpu-python template's opt-in, as the llm function's continuous batching uses it), for TestSharedBindingThroughUp.

POST ?n=N streams two JSON lines: the first once N requests of this process are in flight together (a barrier;
"together": false if they never were within 30 s), with the binding the request runs under, the second after
POST ?release=1 came (or 30 s passed), so that a test can look at the gpuserver while they are all held. POST
?ready=1 answers at once."""

import threading

CONCURRENCY = 32

_lock = threading.Lock()
_barriers = {}
_release = threading.Event()


def _barrier(n):
    with _lock:
        b = _barriers.get(n)
        if b is None or b.broken:
            b = _barriers[n] = threading.Barrier(n)
        return b


def handle(event, context):
    gpu = context.gpu or {}
    if event.query.get("ready"):
        return {"statusCode": 200, "body": {"binding": gpu.get("id")}}
    if event.query.get("release"):
        _release.set()
        return {"statusCode": 200, "body": {"binding": gpu.get("id")}}
    n = int(event.query.get("n") or "1")

    def stream():
        try:
            _barrier(n).wait(timeout=30)
            together = True
        except threading.BrokenBarrierError:
            together = False
        yield {"binding": gpu.get("id"), "together": together}
        _release.wait(timeout=30)
        yield {"done": True}

    return {"statusCode": 200, "headers": {"Content-Type": "application/x-ndjson"}, "body": stream()}
