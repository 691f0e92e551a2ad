"""edge: exercises the gpu-python entrypoint's request and response handling."""

import os
import time


def events(n, gate, raise_at, closed):
    """n server-sent events; before each after the first it waits until the file gate exists (so a test can
    tell that the first event arrived before the handler went on); raises before event raise_at; writes the file
    closed when the generator is closed early (the client went away)."""
    done = False
    try:
        for i in range(n):
            if i == raise_at:
                raise RuntimeError("boom in the stream")
            if i > 0 and gate:
                deadline = time.monotonic() + 30
                while not os.path.exists(gate) and time.monotonic() < deadline:
                    time.sleep(0.005)
            yield "data: %d\n\n" % i
        done = True
    finally:
        if not done and closed:
            with open(closed, "w") as f:
                f.write("closed")


def handle(event, context):
    q = event.query
    if q.get("raise"):
        raise RuntimeError("boom")
    if q.get("tuple"):
        return ("tuple body", 201, {"X-T": "1"})
    if q.get("bytes"):
        return b"\x00\x01"
    if q.get("str"):
        return "plain"
    if q.get("stream"):
        gen = events(int(q["stream"]), q.get("gate"), int(q.get("raise_at", "-1")), q.get("closed"))
        return {"statusCode": 200, "headers": {"Content-Type": "text/event-stream"}, "body": gen}
    if q.get("lines"):
        return (({"i": i} for i in range(int(q["lines"]))), 201, {"X-Lines": "yes"})
    return {
        "statusCode": 202,
        "body": {
            "len": len(event.body),
            "method": event.method,
            "path": event.path,
            "multi": q.getlist("m"),
            "header": event.headers.get("x-test"),
            "gpu": context.gpu,
        },
        "headers": {"X-Handler": "yes"},
    }
