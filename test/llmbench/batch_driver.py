"""Serves the llm function (functions/llm/handler.py, unchanged) to test/llmbench's batching figures (-batch): one
JSON command per line on stdin, one JSON reply per line on stdout; the environment decides the function's settings
(LLM_MAX_BATCH: continuous batching, or 1: each request alone, one at a time).

At start it imports the handler (the model built and moved to the GPU); the first reply is {"load_s": seconds}.
commands:
  {"cmd": "run", "n": N, "max_tokens": T, "prompt_tokens": P, "offset": K}
      N streamed greedy completions (ignore_eos) started at once, each from a thread of its own as the gpu-python
      template's request threads call the handler, request i with a prompt of P token ids of its own (from K + i):
      {"ttft_s": [...], "end_s": [...] (from the common start), "tokens": [...], "wall_s", "metrics": /metrics}
  {"cmd": "quit"}
"""

import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "functions", "llm"))


class Event:
    def __init__(self, path, body=None, method="POST"):
        self.body, self.headers, self.method, self.query, self.path = json.dumps(body or {}).encode(), {}, method, \
            {}, path


def main():
    start = time.perf_counter()
    import torch
    import handler
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(json.dumps({"load_s": time.perf_counter() - start}), flush=True)

    def metrics():
        r = handler.handle(Event("/metrics", method="GET"), None)
        return {l.split()[0]: int(l.split()[1]) for l in r["body"].splitlines() if not l.startswith("#")}

    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            break
        n, p, k = req["n"], req["prompt_tokens"], req.get("offset", 0)
        ttft, end, count, errors = [None] * n, [None] * n, [0] * n, []
        go = threading.Barrier(n + 1)

        def one(i):
            prompt = [5 + (k + i) * 31 % 4000 + j for j in range(p)]
            body = {"prompt": prompt, "max_tokens": req["max_tokens"], "temperature": 0, "ignore_eos": True,
                    "return_token_ids": True, "stream": True}
            go.wait()
            r = handler.handle(Event("/v1/completions", body), None)
            if r["statusCode"] != 200:
                errors.append(r["body"])
                return
            for ev in r["body"]:
                if ev.startswith("data: {") and '"token_ids"' in ev:
                    if ttft[i] is None:
                        ttft[i] = time.perf_counter() - t0
                    count[i] += 1
            end[i] = time.perf_counter() - t0

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        t0 = time.perf_counter()
        go.wait()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        if errors or None in end:
            print(json.dumps({"error": errors or "a stream did not end"}), flush=True)
            continue
        print(json.dumps({"ttft_s": ttft, "end_s": end, "tokens": count, "wall_s": wall, "metrics": metrics()}),
              flush=True)


if __name__ == "__main__":
    main()
