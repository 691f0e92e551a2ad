# forward.py MODEL [CALLLOG_DIR]: forward passes of a model with random weights (fixed seed) at batch 1 and 8 through
# the shim; the simulated node accepts the kernels without running them (--sim-kernels=dry). Prints, per batch, the
# shim's counters of one steady-state pass (after three warm-up passes), as one JSON object. With CALLLOG_DIR, the
# shim's call log of that pass is written to CALLLOG_DIR/calllog-MODEL-bN.tsv (faasGpuShimCallLog).
import ctypes, json, sys, torch

lib = ctypes.CDLL("libcuda.so.1")
def stats():
    st = (ctypes.c_uint64 * 5)()
    lib.faasGpuShimStats(st, ctypes.sizeof(st))
    return list(st)

torch.manual_seed(0)
which = sys.argv[1]
logdir = sys.argv[2] if len(sys.argv) > 2 else None
if which == "resnet152":
    import torchvision
    model = torchvision.models.resnet152().eval().cuda()
    inputs = lambda bs: torch.randn(bs, 3, 224, 224, device="cuda")
    run = lambda x: model(x)
elif which == "bert-base":
    from transformers import BertConfig, BertModel
    model = BertModel(BertConfig()).eval().cuda()
    inputs = lambda bs: torch.randint(0, 30522, (bs, 128), device="cuda")
    run = lambda ids: model(input_ids=ids).last_hidden_state
else:
    raise SystemExit("unknown model " + which)

out = {}
with torch.no_grad():
    for bs in (1, 8):
        x = inputs(bs)
        for _ in range(3):
            run(x)
            torch.cuda.synchronize()
        if logdir:
            lib.faasGpuShimCallLog(("%s/calllog-%s-b%d.tsv" % (logdir, which, bs)).encode())
        before = stats()
        y = run(x)
        torch.cuda.synchronize()
        after = stats()
        if logdir and lib.faasGpuShimCallLog(None) != 0:
            raise SystemExit("writing the call log failed")
        d = [b - a for a, b in zip(before, after)]
        out["b%d" % bs] = dict(zip(["Sync", "Async", "Local", "Unsupported", "UnknownSlots"], d),
                               shape=list(y.shape))
out["total"] = dict(zip(["Sync", "Async", "Local", "Unsupported", "UnknownSlots"], stats()))
print(json.dumps(out))
