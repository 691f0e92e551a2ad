"""Runs ResNet-152 and BERT-base forward passes under the shim's trace mode and writes what each pass used.

The process runs with shim/build/trace as libcuda.so.1 (make gpu-trace sets this up): every driver entry point,
cuGetProcAddress resolution and private-table slot is counted by the trace library. This script snapshots the
counts around one forward pass of each model at batch 1 and 8 (after warm-up, so the pass is a steady-state one)
and writes the difference, the calls one forward pass makes, to OUTDIR/pass-<model>-b<batch>.tsv. The whole run's
counts (initialisation included) go to the file named by FAAS_GPU_TRACE_OUT.

usage: python3 trace_torch.py OUTDIR
"""

import ctypes
import os
import sys

import torch

from torch_shim import build


def snapshot(lib, path):
    if lib.faas_gpu_trace_dump(path.encode()) != 0:
        raise SystemExit("faas_gpu_trace_dump(%s) failed" % path)
    counts = {}
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] in ("export", "proc", "slot", "entry"):
                counts[(fields[0], fields[1])] = int(fields[2])
    return counts


def main():
    out = sys.argv[1]
    lib = ctypes.CDLL("libcuda.so.1")
    if not hasattr(lib, "faas_gpu_trace_dump"):
        raise SystemExit("libcuda.so.1 is not the shim's trace mode (LD_LIBRARY_PATH=shim/build/trace)")
    lib.faas_gpu_trace_dump.argtypes = [ctypes.c_char_p]
    tmp = os.path.join(out, "snapshot.tsv")
    for name in ("resnet152", "bert-base"):
        for batch in (1, 8):
            model, inputs = build(name, batch)
            model = model.cuda().eval()
            inputs = tuple(t.cuda() for t in inputs)
            with torch.no_grad():
                for _ in range(3):
                    model(*inputs)
                torch.cuda.synchronize()
                before = snapshot(lib, tmp)
                model(*inputs)
                torch.cuda.synchronize()
                after = snapshot(lib, tmp)
            path = os.path.join(out, "pass-%s-b%d.tsv" % (name, batch))
            with open(path, "w") as f:
                for key in sorted(after):
                    n = after[key] - before.get(key, 0)
                    if n:
                        f.write("%s\t%s\t%d\n" % (key[0], key[1], n))
            print("traced one forward pass of %s at batch %d: %s" % (name, batch, path), flush=True)
            del model, inputs
            torch.cuda.empty_cache()
    os.remove(tmp)


if __name__ == "__main__":
    main()
