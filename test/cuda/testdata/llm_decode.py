# llm_decode.py: the llm function's handler (functions/llm) through the shim, greedy and sampled, 8 and 24 tokens;
# prints, as one JSON object, the token ids, the function's timing, and the shim's counters per generated token
# (from the difference of the two lengths, so that the prompt's cost cancels). LLM_CUDA_GRAPHS decides whether
# the decode step is a CUDA graph.
import ctypes, json, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "functions", "llm"))
lib = ctypes.CDLL("libcuda.so.1")
FIELDS = ["Sync", "Async", "Local", "Unsupported", "UnknownSlots", "SyncsAnswered"]
def stats():
    st = (ctypes.c_uint64 * 6)()
    lib.faasGpuShimStats(st, ctypes.sizeof(st))
    return list(st)

import handler  # noqa: E402

class Event:
    def __init__(self, body):
        self.body, self.headers, self.method, self.query, self.path = json.dumps(body).encode(), {}, "POST", {}, "/v1/completions"

def run(n, **kw):
    body = {"prompt": "The GPU pool of a node", "max_tokens": n, "ignore_eos": True, "return_token_ids": True}
    body.update(kw)
    before = stats()
    r = handler.handle(Event(body), None)
    after = stats()
    assert r["statusCode"] == 200, r
    c = r["body"]["choices"][0]
    return c["token_ids"], r["body"]["faas_gpu"], [b - a for a, b in zip(before, after)]

out = {}
# The weights on the GPU (packed into one buffer: copies are computed in dry mode too) equal a build on the CPU.
import torch  # noqa: E402
ref = handler.build_model(handler.VOCAB)
out["weights_equal"] = all(torch.equal(p.detach().cpu(), r.detach()) for p, r in
                           zip(handler._model.parameters(), ref.parameters()))
out["weights_on_gpu"] = all(p.is_cuda for p in handler._model.parameters())
# The layout variants share by: one buffer, the base's tensors first, the adapter's from a 2 MiB chunk of their own,
# the head tied to the embedding on the GPU too.
m = handler._model
adapter = {id(p) for p in handler.adapter_parameters(m)}
tensors = list({id(t): t for t in list(m.parameters()) + list(m.buffers())}.values())
start = min(t.data_ptr() for t in tensors)
end = lambda t: t.data_ptr() + t.numel() * t.element_size()
base_end = max(end(t) for t in tensors if id(t) not in adapter) - start
own = [t.data_ptr() - start for t in tensors if id(t) in adapter]
out["layout"] = {"tied": m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(),
                 "adapter_tensors": len(own), "base_end": base_end, "adapter_start": min(own, default=-1),
                 "start_aligned": start % handler.CHUNK == 0}
run(4, temperature=0)  # the first request allocates the KV cache (and captures the graph)
for kind, kw in (("greedy", {"temperature": 0}), ("sampled", {"temperature": 0.9, "top_p": 0.95, "seed": 11})):
    short, _, s8 = run(8, **kw)
    long, timing, s24 = run(24, **kw)
    per = [(b - a) / 16 for a, b in zip(s8, s24)]
    out[kind] = {"tokens": long, "prefix_equal": long[:8] == short, "timing": timing,
                 "per_token": dict(zip(FIELDS, per))}
out["total"] = dict(zip(FIELDS, stats()))
print(json.dumps(out))
