"""Serves forward passes of one unchanged PyTorch model to the GPU suite's benchmark (pytorch_test.go), one JSON
command per line on stdin and one JSON reply per line on stdout.

The same script runs natively and with faas-gpu's shim as libcuda.so.1 (the environment decides; this file does
not know), so both sides run identical code on identical inputs. Weights are random from a fixed seed; nothing is
downloaded.

commands:
  {"cmd": "load"}                      model.cuda() and synchronize: {"s": seconds}
  {"cmd": "pass", "batch": B}          one forward pass and synchronize: {"s": seconds, "cpu_s": ..., "stats": ...}
  {"cmd": "timed", "batch": B}         one forward pass between two timing events: {"s": seconds, "issue_s": until
                                       model(x) returned, "gpu_s": the GPU's time between the events}
  {"cmd": "output", "batch": B}        one forward pass: {"output": the first 4096 values}
  {"cmd": "quit"}

"stats" is the shim's counters over the pass (sync, async and local calls; unsupported calls; unknown table slots)
when libcuda.so.1 is the shim, and null natively.

usage: python3 torch_bench.py resnet152|resnet50|bert-base
"""

import ctypes
import json
import sys
import time

import torch

from torch_shim import build


class ShimStats:
    """The shim's counters (faasGpuShimStats), or nothing when libcuda.so.1 is NVIDIA's driver."""

    FIELDS = ("sync", "async", "local", "unsupported", "unknown_slots")

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


def main():
    name = sys.argv[1]
    model, (x1,) = build(name, 1)
    _, (x8,) = build(name, 8)
    model = model.eval()
    inputs = {}
    stats = ShimStats()
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req["cmd"]
        if cmd == "quit":
            break
        if cmd == "load":
            start = time.perf_counter()
            model = model.cuda()
            torch.cuda.synchronize()
            inputs = {1: x1.cuda(), 8: x8.cuda()}
            torch.cuda.synchronize()
            reply = {"s": time.perf_counter() - start}
        elif cmd == "pass":
            x = inputs[req["batch"]]
            before, cpu = stats.read(), time.process_time()
            start = time.perf_counter()
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            after = stats.read()
            delta = None if before is None else {k: after[k] - before[k] for k in after}
            reply = {"s": elapsed, "cpu_s": cpu, "stats": delta}
        elif cmd == "timed":
            x = inputs[req["batch"]]
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start = time.perf_counter()
            begin.record()
            with torch.no_grad():
                model(x)
            end.record()
            issued = time.perf_counter() - start
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            reply = {"s": elapsed, "issue_s": issued, "gpu_s": begin.elapsed_time(end) / 1e3}
        elif cmd == "output":
            with torch.no_grad():
                out = model(inputs[req["batch"]])
            if not torch.is_tensor(out):
                out = out[0]
            reply = {"output": out.float().flatten()[:4096].cpu().tolist()}
        else:
            reply = {"error": "unknown command %r" % cmd}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
