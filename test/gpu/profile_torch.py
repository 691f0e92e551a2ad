"""Profiles one steady-state forward pass of ResNet-152 and BERT-base (batch 1 and 8) natively on the GPU and writes
what the replay traces need (shim/testdata/trace/README.md): per launch, when the client issued it and how long its
kernel ran on the GPU, to OUTDIR/gpu-profile-<model>-b<batch>.tsv. Runs natively (NVIDIA's libcuda.so.1), with
torch.profiler (CUPTI); part of make gpu-trace (test/gpu/trace.sh).

Format (tab-separated, times in microseconds from the pass's start):
  # faas-gpu gpu profile 1
  # gpu <name>
  # pass_p50_us <p50 of 50 passes without the profiler>
  # pass_p99_us <their p99>
  # thread_cpu_p50_us <the issuing thread's CPU per pass, p50>
  <api> <api_start_us> <api_dur_us> <kind: kernel|memset|memcpy|sync> <gpu_start_us> <gpu_dur_us> <name>
The profiler adds CPU time per call (about a microsecond), so the issue times are an upper bound; the GPU times are
the kernels' own.

usage: python3 profile_torch.py OUTDIR
"""

import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from torch_shim import build

GPU_CATS = {"kernel": "kernel", "gpu_memset": "memset", "gpu_memcpy": "memcpy"}
API_CATS = ("cuda_runtime", "cuda_driver")


def pass_stats(model, x, n=50):
    """p50 and p99 of n passes without the profiler, and the issuing thread's CPU per pass (p50), in us."""
    times, cpus = [], []
    for _ in range(n):
        c0, start = time.thread_time(), time.perf_counter()
        model(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpus.append(time.thread_time() - c0)
    times.sort()
    cpus.sort()
    return times[n // 2] * 1e6, times[min(n - 1, int(0.99 * n))] * 1e6, cpus[n // 2] * 1e6


def main():
    out = sys.argv[1]
    gpu = torch.cuda.get_device_name(0)
    for name in ("resnet152", "bert-base", "resnet50"):  # resnet50: held out (in no replay trace)
        for batch in (1, 8):
            model, (x,) = build(name, batch)
            model = model.cuda().eval()
            x = x.cuda()
            with torch.no_grad():
                for _ in range(5):
                    model(x)
                torch.cuda.synchronize()
                p50, p99, cpu = pass_stats(model, x)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    model(x)
                    torch.cuda.synchronize()
            chrome = os.path.join(out, "chrome-%s-b%d.json" % (name, batch))
            prof.export_chrome_trace(chrome)
            with open(chrome) as f:
                events = json.load(f)["traceEvents"]
            os.remove(chrome)
            gpu_by_corr = {}
            for e in events:
                kind = GPU_CATS.get(e.get("cat"))
                if kind and "correlation" in e.get("args", {}):
                    gpu_by_corr[e["args"]["correlation"]] = (kind, e["ts"], e.get("dur", 0), e["name"])
            rows = []
            for e in events:
                if e.get("cat") not in API_CATS or e.get("ph") != "X":
                    continue
                corr = e.get("args", {}).get("correlation")
                if corr in gpu_by_corr:
                    kind, gts, gdur, kname = gpu_by_corr[corr]
                    rows.append((e["ts"], e.get("dur", 0), e["name"], kind, gts, gdur, kname))
                elif "Synchronize" in e["name"]:
                    rows.append((e["ts"], e.get("dur", 0), e["name"], "sync", e["ts"], 0, "-"))
            rows.sort()
            if not rows:
                raise SystemExit("%s b%d: the profiler recorded no launches" % (name, batch))
            t0 = rows[0][0]
            path = os.path.join(out, "gpu-profile-%s-b%d.tsv" % (name, batch))
            with open(path, "w") as f:
                f.write("# faas-gpu gpu profile 1\n# gpu\t%s\n# pass_p50_us\t%.1f\n# pass_p99_us\t%.1f\n"
                        "# thread_cpu_p50_us\t%.1f\n" % (gpu, p50, p99, cpu))
                f.write("# columns: api api_start_us api_dur_us kind gpu_start_us gpu_dur_us name\n")
                for ts, dur, api, kind, gts, gdur, kname in rows:
                    f.write("%s\t%.3f\t%.3f\t%s\t%.3f\t%.3f\t%s\n" % (api, ts - t0, dur, kind, gts - t0, gdur,
                                                                      kname.replace("\t", " ")))
            print("profile_torch: %s: %d calls, pass p50 %.0f us, p99 %.0f us, issuing thread CPU %.0f us" %
                  (path, len(rows), p50, p99, cpu))


if __name__ == "__main__":
    main()
