"""Serves the llm function's decoding (functions/llm/handler.py, unchanged) to the LLM benchmarks: the GPU suite's
TestGPULLMThroughTheShim and the simulated node's test/llmbench. One JSON command per line on stdin, one JSON reply
per line on stdout. The same script runs natively and with faas-gpu's shim as libcuda.so.1 (the environment
decides), so both sides run identical code on identical inputs.

At start it imports the handler, which builds the model (random weights from LLM_SEED) and moves it to the GPU;
the first reply is {"load_s": seconds of that import and move, synchronised}.
commands:
  {"cmd": "complete", "max_tokens": N, "graphs": true|false, "prompt": "..."}
      a greedy completion (ignore_eos): {"tokens": [...], "ttft_s", "total_s", "decode_tokens_per_s",
      "cuda_graphs", "stats": the shim's counters over the call (null natively)}
  {"cmd": "quit"}
"""

import ctypes
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "functions", "llm"))


class ShimStats:
    FIELDS = ("sync", "async", "local", "unsupported", "unknown_slots", "syncs_answered")

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        self.fn = getattr(lib, "faasGpuShimStats", None)
        if self.fn is not None:
            self.fn.restype = ctypes.c_size_t
            self.fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def read(self):
        if self.fn is None:
            return None
        buf = (ctypes.c_uint64 * len(self.FIELDS))()
        self.fn(buf, ctypes.sizeof(buf))
        return dict(zip(self.FIELDS, buf))


class Event:
    def __init__(self, body):
        self.body, self.headers, self.method, self.query, self.path = json.dumps(body).encode(), {}, "POST", {}, \
            "/v1/completions"


def main():
    start = time.perf_counter()
    import torch
    import handler
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(json.dumps({"load_s": time.perf_counter() - start, "params": sum(p.numel() for p in handler._model.parameters())}),
          flush=True)
    stats = ShimStats()
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        handler.GRAPHS = bool(req.get("graphs"))
        before = stats.read()
        t0 = time.perf_counter()
        r = handler.handle(Event({"prompt": req.get("prompt", "The GPU pool of a node"), "temperature": 0,
                                  "max_tokens": req["max_tokens"], "ignore_eos": True, "return_token_ids": True}),
                           None)
        total = time.perf_counter() - t0
        after = stats.read()
        if r["statusCode"] != 200:
            print(json.dumps({"error": r["body"]}), flush=True)
            continue
        fg = r["body"]["faas_gpu"]
        print(json.dumps({"tokens": r["body"]["choices"][0]["token_ids"], "ttft_s": fg["ttft_ms"] / 1e3,
                          "total_s": total, "decode_tokens_per_s": fg["decode_tokens_per_s"],
                          "cuda_graphs": fg["cuda_graphs"], "graph_error": fg.get("cuda_graph_error"),
                          "stats": None if before is None else {k: after[k] - before[k] for k in after}}),
              flush=True)


if __name__ == "__main__":
    main()
