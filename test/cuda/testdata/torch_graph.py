# torch_graph.py: torch.cuda.graph through the shim (dry kernels: the values are not computed, the driver calls
# are). Captures a small MLP step with a static input and output, replays it, and prints, as one JSON object: the
# shim's counters of one replay and of one eager step, the graph's node count as PyTorch sees it, whether the
# capture queries answered the real state, and whether the GPU random generator still works after the capture
# (a failed capture breaks it).
import ctypes, json, torch

lib = ctypes.CDLL("libcuda.so.1")
def stats():
    st = (ctypes.c_uint64 * 5)()
    lib.faasGpuShimStats(st, ctypes.sizeof(st))
    return dict(zip(["Sync", "Async", "Local", "Unsupported", "UnknownSlots"], list(st)))

def delta(a, b):
    return {k: b[k] - a[k] for k in a}

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).cuda().eval()
x = torch.zeros(8, 256, device="cuda")
out = {}
with torch.no_grad():
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            y = model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    seen = {}
    with torch.cuda.graph(g):
        seen["is_current_stream_capturing"] = torch.cuda.is_current_stream_capturing()
        y = model(x)
    seen["after"] = torch.cuda.is_current_stream_capturing()
    out["capture_queries"] = seen
    torch.cuda.synchronize()
    before = stats()
    g.replay()
    torch.cuda.synchronize()
    out["replay"] = delta(before, stats())
    before = stats()
    model(x)
    torch.cuda.synchronize()
    out["eager"] = delta(before, stats())
    out["shape"] = list(y.shape)
# The random generator works after a capture (graph-safe state registered, nothing left half-captured).
r = torch.randn(4, device="cuda")
torch.cuda.synchronize()
out["randn_after"] = list(r.shape)
out["total"] = stats()
print(json.dumps(out))
