#!/usr/bin/env bash
# trace.sh: the GPU suite's trace run (make gpu-trace). Builds the shim's trace mode against this machine's real
# libcuda.so.1, records the device's complete attribute table, and runs ResNet-152 and BERT-base (batch 1 and 8)
# under the trace. Writes into OUTDIR:
#   device-<gpu>.tsv          devinfo: driver version, name, UUID, PCI id, memory and every device attribute
#   trace-pytorch-<gpu>.tsv   every entry point, resolution, table and slot the whole run used, with call counts
#   pass-<model>-b<n>.tsv     the calls of one steady-state forward pass
#   gpu-profile-<model>-b<n>.tsv  natively, with the profiler: each launch's issue time and GPU time in one pass
#                             (profile_torch.py; the replay traces' GPU times and gaps: make replay-traces)
# usage: test/gpu/trace.sh OUTDIR
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
make -s -C "$root/shim" trace
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9_-' | tr 'A-Z' 'a-z')
"$root/shim/build/trace/devinfo" >"$out/device-$gpu.tsv"
echo "trace.sh: device table of $gpu: $(grep -c '^attr' "$out/device-$gpu.tsv") attributes"
cd "$root/test/gpu"
LD_LIBRARY_PATH="$root/shim/build/trace${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
	FAAS_GPU_TRACE_OUT="$out/trace-pytorch-$gpu.tsv" python3 trace_torch.py "$out"
echo "trace.sh: $(grep -c . "$out/trace-pytorch-$gpu.tsv") lines in $out/trace-pytorch-$gpu.tsv"
python3 profile_torch.py "$out"
