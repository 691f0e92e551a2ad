#!/usr/bin/env bash
# suite.sh: runs the GPU suite (make gpu-test) from the binaries in bin/gpu (make gpu-test-bin builds them, so a GPU
# machine needs no Go), in one run of under 8 minutes, each step under a time limit:
#   1. every CUDA and GPU test of the packages below with FAAS_GPU_TEST_CUDA=1, one process per test; among them
#      PyTorch natively and through the shim side by side (docs/bench/pytorch-shim.md: the four shim/native ratios and
#      the per-cause columns: issue time, GPU time, synchronize overshoot, server time per record), and the llm
#      function's TTFT and tokens/s natively and through the shim (docs/bench/llm-gpu.md)
#   2. the replay bench on the GPU: the four recorded passes through the shim on the cuda backend and natively on the
#      same GPU (docs/bench/remoting-replay-gpu.md), to check the timed virtual GPU's calibration
#   3. the data-plane benchmark on the real driver (docs/bench/swap-cuda.md): pool allocation against the driver's
#      up to 1 GiB, swap throughput, pipelined against serial swap-and-execute
#   4. what keeping scratch costs on the real driver (docs/bench/scratch-cuda.md): eviction and swap-in of a 1 GiB
#      model with 256 MiB and 1 GiB of scratch kept (written back, restored) and per request, side by side
# The tenant executors' checks (docs/tenants.md) are among the tests of step 1; their figures (chunk import, context
# memory) go to docs/bench/tenants-cuda.md.
# Steps print their wall time; the exit status is non-zero when any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
make -s -C shim >/dev/null || exit 1
export FAAS_GPU_TEST_CUDA=1 FAAS_GPU_GPU_REPORT="$root/docs/bench/pytorch-shim.md" FAAS_GPU_LLM_REPORT="$root/docs/bench/llm-gpu.md"
# Tenants isolated by process (docs/tenants.md): chunk import and context memory, measured by the cuda package's tests.
export FAAS_GPU_TENANT_REPORT="$root/docs/bench/tenants-cuda.md"
{
	echo "# Tenant executors on a real GPU (make gpu-test)"
	echo
	echo "Written by test/gpu/suite.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)."
	echo "The isolation checks (TestCUDAContextsIsolate, TestCUDAKernelsCannotReachAnotherTenant,"
	echo "TestCUDAKernelFaultPoisonsOnlyItsContext, TestCUDAShareableChunksCrossProcesses) pass or fail in the suite's log."
	echo
} >"$FAAS_GPU_TENANT_REPORT"
rc=0
start=$(date +%s)
step() { # step LIMIT_SECONDS NAME COMMAND...
	local limit=$1 name=$2 t0=$(date +%s)
	shift 2
	echo "=== $name (limit ${limit}s)"
	timeout --kill-after=10 "$limit" "$@" || { echo "=== $name FAILED (exit $?)"; rc=1; }
	echo "=== $name: $(($(date +%s) - t0))s, suite $(($(date +%s) - start))s"
}
for pkg in gpuserver/device/nvml gpuserver/device/cuda gpuserver/executor test/gpu; do
	bin="$root/bin/gpu/$(echo "$pkg" | tr / -).test"
	if [ ! -x "$bin" ]; then
		echo "suite.sh: $bin is missing: run make gpu-test-bin where Go is installed" >&2
		exit 1
	fi
	# One process per test: on a real GPU a kernel fault poisons every CUDA context of its process, so a test that
	# faults on purpose must not take the tests after it down with it.
	for test in $(cd "$pkg" && "$bin" -test.list 'CUDA|GPU'); do
		limit=60
		[ "$test" = TestGPUPyTorchThroughTheShim ] && limit=240
		step "$limit" "$pkg $test" bash -c "cd '$pkg' && '$bin' -test.v -test.count=1 -test.run '^${test}\$'"
	done
done
step 90 "replay bench on the GPU" "$root/bin/gpu/replay" -device cuda -pin=false -repeat 1 -passes 100 -warmup 5 \
	-out "$root/docs/bench/remoting-replay-gpu.md" -json "$root/docs/bench/remoting-replay-gpu.json"
step 120 swapbench "$root/bin/gpu/swapbench" -device cuda -out "$root/docs/bench/swap-cuda.md"
step 60 "scratch bench" "$root/bin/gpu/scratchbench" -device cuda -model-mib 1024 -scratch-mib 0,256,1024 -rounds 5 \
	-out "$root/docs/bench/scratch-cuda.md"
echo "=== suite: $(($(date +%s) - start))s, exit $rc"
exit $rc
