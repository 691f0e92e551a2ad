"""slowstream: the gpu-python handler of the slow-client and maximum-hold tests (stream_test.go), on top of
functions/vector-add (VECTOR_ADD_DIR): every answer is computed on the GPU bound to its request.

  ?chunks=N&size=B  streams N chunks of B bytes: chunk i is the float32 vector c_j = i + j (j < B/4), each added
                    on the GPU as it is yielded (a generation, as an LLM's tokens)
  ?gate=PATH        c = a + b of the body, then waits (at most 60 s) until the file PATH exists before answering
  otherwise         c = a + b of the body (functions/vector-add)
"""

import array
import os
import sys
import time

sys.path.insert(0, os.environ["VECTOR_ADD_DIR"])
import handler as vadd  # noqa: E402  functions/vector-add, imported by path


def chunks(n, size):
    count = size // 4
    b = array.array("f", range(count))
    for i in range(n):
        yield vadd.add(array.array("f", [float(i)]) * count, b).tobytes()


def handle(event, context):
    q = event.query
    if q.get("chunks"):
        return {"statusCode": 200, "headers": {"Content-Type": "application/octet-stream"},
                "body": chunks(int(q["chunks"]), int(q["size"]))}
    res = vadd.handle(event, context)
    if q.get("gate"):
        deadline = time.monotonic() + 60
        while not os.path.exists(q["gate"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    return res
