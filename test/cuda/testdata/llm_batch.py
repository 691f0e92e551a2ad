# llm_batch.py: the llm function (functions/llm) with continuous batching (LLM_MAX_BATCH > 1): 16 concurrent
# streamed greedy requests of different prompt lengths and max_tokens (and two sampled ones, seeded), each from a
# thread of its own as the gpu-python template's request threads call the handler, against the same requests
# decoded alone (one at a time, by the function without batching: its Decoder on the paged cache) and, on the CPU,
# transformers' generate() for the greedy ones. Also a client that goes away after 3 tokens, and /metrics while the
# batch runs and after. Prints one JSON object. With the argument "protocol" (dry kernels: the tokens' values mean
# nothing) the requests are not decoded alone.
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "functions", "llm"))
import handler  # noqa: E402


class Event:
    def __init__(self, path, body=None, method="POST"):
        self.body, self.headers, self.method, self.query, self.path = json.dumps(body or {}).encode(), {}, method, \
            {}, path


def metrics():
    r = handler.handle(Event("/metrics", method="GET"), None)
    return {l.split()[0]: int(l.split()[1]) for l in r["body"].splitlines() if not l.startswith("#")}


def body(req, stream):
    prompt, n, sampled = req
    b = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
         "stream": stream}
    if sampled:
        b.update(temperature=0.8, top_p=0.9, seed=sampled)
    return b


def streamed(req, stop_after=None):
    r = handler.handle(Event("/v1/completions", body(req, True)), None)
    if r["statusCode"] != 200:
        return "status %d" % r["statusCode"]
    toks, done = [], False
    gen = r["body"]
    for ev in gen:
        if ev == "data: [DONE]\n\n":
            done = True
        elif ev.startswith("data: {"):
            for c in json.loads(ev[6:])["choices"]:
                toks += c.get("token_ids", [])
        if stop_after is not None and len(toks) >= stop_after:
            gen.close()  # the client went away: the template closes the generator
            return toks
    return toks if done else "incomplete %r" % toks


def main():
    vocab = handler.VOCAB
    reqs = [([(i * 37 + j * 11) % (vocab - 10) + 5 for j in range(1 + 3 * i)], 2 + (i * 5) % 29, None)
            for i in range(16)]
    reqs[5] = (reqs[5][0], 24, 11)  # sampled, seeded
    reqs[12] = (reqs[12][0], 24, 12)
    out = {"device": handler.DEVICE.type, "max_batch": handler.MAX_BATCH}
    protocol = sys.argv[1:] == ["protocol"]
    batcher = handler.BATCHER
    handler.BATCHER = None  # decoded alone: the function without batching (the Decoder, paged)
    alone = [] if protocol else [streamed(r) for r in reqs]
    handler.BATCHER = batcher
    got = [None] * 16
    during = []
    start = threading.Barrier(17)

    def one(i):
        start.wait()
        got[i] = streamed(reqs[i])

    ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    while any(t.is_alive() for t in ts):
        during.append(metrics())
        time.sleep(0.01)
    out["concurrent_s"] = time.perf_counter() - t0
    out["alone"], out["concurrent"] = alone, got
    out["max_tokens"] = [n for _, n, _ in reqs]
    out["prompt_tokens"] = [len(p) for p, _, _ in reqs]
    out["during_max"] = {k: max(m[k] for m in during) for k in ("llm_kv_blocks_in_use", "llm_batch_active",
                                                                 "llm_kv_pool_blocks")} if during else {}
    out["after"] = metrics()
    # A client that goes away after 3 tokens while others decode: it leaves, its blocks come back.
    cancel = [None] * 3

    def other(i):
        cancel[i] = streamed((reqs[i + 8][0], 20, None), stop_after=3 if i == 0 else None)

    ts = [threading.Thread(target=other, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out["cancel"] = cancel
    out["cancel_alone"] = [] if protocol else [streamed((reqs[i + 8][0], 20, None)) for i in range(3)]
    out["final"] = metrics()
    if handler.DEVICE.type == "cpu" and handler.MODEL_DIR:
        import torch
        import transformers
        ref = transformers.AutoModelForCausalLM.from_pretrained(handler.MODEL_DIR, dtype=handler.DTYPE).eval()
        refs = []
        for p, n, sampled in reqs:
            if sampled:
                refs.append(None)
                continue
            ids = torch.tensor([p])
            with torch.no_grad():
                g = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            refs.append(g[0, ids.shape[1]:].tolist())
        out["reference"] = refs
    print(json.dumps(out))


if __name__ == "__main__":
    main()
