#!/usr/bin/env bash
# suite.sh: runs the GPU suite (make gpu-test) from the test binaries in bin/gpu (make gpu-test-bin builds them, so a
# GPU machine needs no Go): every CUDA and GPU test of the packages below with FAAS_GPU_TEST_CUDA=1, then the
# data-plane benchmark on the real driver. Writes docs/bench/pytorch-shim.md, docs/bench/llm-gpu.md,
# docs/bench/swap-cuda.md and docs/bench/tenants-cuda.md.
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
for pkg in gpuserver/device/nvml gpuserver/device/cuda gpuserver/executor test/gpu; do
	bin="$root/bin/gpu/$(echo "$pkg" | tr / -).test"
	if [ ! -x "$bin" ]; then
		echo "suite.sh: $bin is missing: run make gpu-test-bin where Go is installed" >&2
		exit 1
	fi
	# One process per test: on a real GPU a kernel fault poisons every CUDA context of its process, so a test that
	# faults on purpose must not take the tests after it down with it.
	for test in $(cd "$pkg" && "$bin" -test.list 'CUDA|GPU'); do
		echo "=== $pkg $test"
		(cd "$pkg" && "$bin" -test.v -test.count=1 -test.timeout=20m -test.run "^${test}\$") || rc=1
	done
done
echo "=== swapbench"
"$root/bin/gpu/swapbench" -device cuda -out "$root/docs/bench/swap-cuda.md" || rc=1
exit $rc
