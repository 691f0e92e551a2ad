# torch_basics.py: PyTorch 2.11 through the shim, checked by test/cuda/torch_test.go. Prints one JSON object.
import ctypes, json, torch

lib = ctypes.CDLL("libcuda.so.1")
def stats():
    st = (ctypes.c_uint64 * 5)()
    lib.faasGpuShimStats(st, ctypes.sizeof(st))
    return dict(zip(["Sync", "Async", "Local", "Unsupported", "UnknownSlots"], st))

out = {"available": torch.cuda.is_available(), "count": torch.cuda.device_count()}
p = torch.cuda.get_device_properties(0)
out["props"] = {"name": p.name, "major": p.major, "minor": p.minor, "sms": p.multi_processor_count,
                "total": p.total_memory, "l2": p.L2_cache_size}
free, total = torch.cuda.mem_get_info()
out["mem_get_info"] = [free, total]

g = torch.Generator().manual_seed(1)
x = torch.randn(1000, 1000, generator=g)
raw = torch.randint(0, 256, (3_000_001,), dtype=torch.uint8, generator=g)  # an odd size, a few ring records
y = x.cuda()
out["h2d_d2h_equal"] = torch.equal(y.cpu(), x) and torch.equal(raw.cuda().cpu(), raw)
out["allocated"] = torch.cuda.memory_allocated()
out["reserved"] = torch.cuda.memory_reserved()
del y
out["allocated_after_free"] = torch.cuda.memory_allocated()

pin = torch.empty(1000, 1000).pin_memory()
out["pinned"] = pin.is_pinned()
pin.copy_(x)
s = torch.cuda.Stream()
start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with torch.cuda.stream(s):
    start.record()
    w = pin.to("cuda", non_blocking=True)
    back = torch.empty(1000, 1000).pin_memory()
    back.copy_(w, non_blocking=True)
    stop.record()
s.synchronize()
stop.synchronize()
out["stream_copy_equal"] = torch.equal(back, x)
out["event_query"] = stop.query()
out["elapsed_ms"] = start.elapsed_time(stop)
torch.cuda.synchronize()

# The first matmul creates the cuBLAS handle, the first convolution the cuDNN handle (their kernels are accepted
# and not executed: the simulated node runs in dry mode for this test).
a = torch.randn(128, 64, device="cuda")
(a @ a.t()).sum()
torch.cuda.synchronize()
out["cublas_handle"] = torch.cuda.current_blas_handle() != 0
conv = torch.nn.Conv2d(3, 8, 3).cuda()
conv(torch.randn(1, 3, 32, 32, device="cuda"))
torch.cuda.synchronize()
out["cudnn"] = torch.backends.cudnn.is_available() and torch.backends.cudnn.version()
out["stats"] = stats()
print(json.dumps(out))
