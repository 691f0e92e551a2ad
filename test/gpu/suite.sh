#!/usr/bin/env bash
# suite.sh: the GPU suite (make gpu-test), from the binaries in bin/gpu (make gpu-test-bin builds them, so a GPU
# machine needs no Go), in one run of under 8 minutes (SUITE_BUDGET, 470 s): every step has a time limit, cut to what
# is left of the budget, and a step that would start with under 15 s left is skipped with that reason. In order (the
# most needed first, since a lent GPU may be taken back):
#   0. the machine: nvidia-smi (GPUs, driver, clocks, PCIe), nvidia-smi topo -m, the CPUs and NUMA nodes (20 s)
#   1. the predictions (test/gpu/predictions.tsv, docs/remoting-speed.md), printed before anything is measured (5 s)
#   2. PyTorch natively and through the shim (TestGPUPyTorchThroughTheShim, 240 s): ResNet-152, BERT-base and the
#      held-out ResNet-50 at batch 1 and 8, p50 and p99, issue time, GPU time between timing events, the synchronize's
#      overshoot, server time per record, client CPU per pass (docs/bench/pytorch-shim.md); shim/native per pass to
#      FAAS_GPU_MEASURED_TSV
#   3. the replay bench natively and through the shim on the GPU (90 s): per call kind, the real driver's time in its
#      entry points on the issuing thread (launch, the local getter), the client's CPU, p50 and p99
#      (docs/bench/remoting-replay-gpu.md): the measured costs that replace the traces' native_call_ns and
#      native_local_ns
#   4. the profiler natively (profile_torch.py, 90 s): per kernel its GPU time, per runtime and driver call its CPU
#      time on the issuing thread, per pass p50 and p99 and the issuing thread's CPU (build/gpu-trace/gpu-profile-*.tsv,
#      the input of make replay-traces)
#   5. the held-out llm decode step natively and through the shim (TestGPULLMThroughTheShim, 180 s;
#      docs/bench/llm-gpu.md); decode step shim/native to FAAS_GPU_MEASURED_TSV
#   6. prediction, measurement and error side by side (test/gpu/compare.sh, 5 s)
#   7. this round's checks, each a test by name (60 s each; skipped with the reason where the tree lacks it): several
#      GPUs serving one function at once (TestCUDAInstancesServeOneFunctionOnSeveralGPUsAtOnce, gpuserver/executor),
#      co-running functions and their achieved shares (TestCUDACoRunningFunctionsGetTheirShares), NVSwitch
#      topology discovery against nvidia-smi topo -m (TestCUDADiscoversNVSwitchTopology, gpuserver/device/nvml)
#   8. every other CUDA and GPU test of the packages below, one process each (60 s each), then the data-plane bench
#      on the real driver (120 s, docs/bench/swap-cuda.md) and the scratch bench (60 s, docs/bench/scratch-cuda.md)
# The tenant executors' checks (docs/tenants.md) are among the tests of step 8; their figures go to
# docs/bench/tenants-cuda.md.
# Steps print their wall time; the exit status is non-zero when any failed.
#
# usage: test/gpu/suite.sh [--dry]
#   --dry: on any machine (no GPU, no Go, no bin/gpu needed): runs the parts that need no GPU (the machine's
#          description as far as it goes, the predictions, compare.sh on an empty measurement) and prints every other
#          step with its time limit and command instead of running it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
dry=0
[ "${1:-}" = --dry ] && dry=1
budget=${SUITE_BUDGET:-470}
out="$root/build/gpu-suite"
mkdir -p "$out"
measured="$out/measured.tsv"
: >"$measured"
rc=0
limits=0
start=$(date +%s)

step() { # step LIMIT_SECONDS NAME COMMAND... (runs it, or in --dry prints it)
	local limit=$1 name=$2 t0 left
	shift 2
	left=$((budget - ($(date +%s) - start)))
	if [ "$left" -lt 15 ]; then
		echo "=== $name: SKIPPED: the suite's budget of ${budget}s is spent"
		return
	fi
	[ "$limit" -gt "$left" ] && limit=$left
	if [ "$dry" = 1 ]; then
		echo "=== $name (limit ${limit}s) would run: $*"
		limits=$((limits + limit))
		return
	fi
	t0=$(date +%s)
	echo "=== $name (limit ${limit}s)"
	timeout --kill-after=10 "$limit" "$@" || { echo "=== $name FAILED (exit $?)"; rc=1; }
	echo "=== $name: $(($(date +%s) - t0))s, suite $(($(date +%s) - start))s"
}

cpu_step() { # cpu_step NAME COMMAND...: a step that needs no GPU, run in --dry too
	local name=$1
	shift
	echo "=== $name"
	"$@" || { echo "=== $name FAILED (exit $?)"; rc=1; }
}

machine() {
	if command -v nvidia-smi >/dev/null 2>&1; then
		nvidia-smi -L
		nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,pcie.link.gen.max,pcie.link.width.max \
			--format=csv
		nvidia-smi topo -m
	else
		echo "no nvidia-smi on this machine: no GPU, no driver"
	fi
	command -v lscpu >/dev/null 2>&1 && lscpu | grep -E '^(Model name|CPU\(s\)|Thread|NUMA node)' || nproc
	uname -r
	cat /proc/loadavg
	python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null ||
		echo "no PyTorch in python3"
}

# test binary of a package, or empty (with the reason on stderr)
testbin() {
	local bin="$root/bin/gpu/$(echo "$1" | tr / -).test"
	if [ -x "$bin" ]; then echo "$bin"; else echo "$bin is missing (make gpu-test-bin where Go is installed)" >&2; fi
}

# gotest LIMIT PKG TEST [LABEL]: one test of a package's test binary in a process of its own
gotest() {
	local limit=$1 pkg=$2 test=$3 label=${4:-} bin
	bin=$(testbin "$pkg" 2>/dev/null) || true
	if [ -z "$bin" ] && [ "$dry" = 0 ]; then
		testbin "$pkg" >/dev/null
		echo "=== $label$pkg $test: FAILED: no test binary"
		rc=1
		return
	fi
	step "$limit" "$label$pkg $test" bash -c "cd '$pkg' && '${bin:-$root/bin/gpu/$(echo "$pkg" | tr / -).test}' -test.v -test.count=1 -test.run '^${test}\$'"
}

cpu_step "0. machine, driver, topology" machine
cpu_step "1. predictions (before any measurement)" grep -v '^#' test/gpu/predictions.tsv
if [ "$dry" = 0 ]; then
	make -s -C shim >/dev/null || exit 1
fi
export FAAS_GPU_TEST_CUDA=1 FAAS_GPU_GPU_REPORT="$root/docs/bench/pytorch-shim.md" \
	FAAS_GPU_LLM_REPORT="$root/docs/bench/llm-gpu.md" FAAS_GPU_MEASURED_TSV="$measured" \
	FAAS_GPU_TENANT_REPORT="$root/docs/bench/tenants-cuda.md"
if [ "$dry" = 0 ]; then
	{
		echo "# Tenant executors on a real GPU (make gpu-test)"
		echo
		echo "Written by test/gpu/suite.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)."
		echo "The isolation checks (TestCUDAContextsIsolate, TestCUDAKernelsCannotReachAnotherTenant,"
		echo "TestCUDAKernelFaultPoisonsOnlyItsContext, TestCUDAShareableChunksCrossProcesses) pass or fail in the suite's log."
		echo
	} >"$FAAS_GPU_TENANT_REPORT"
fi
gotest 240 test/gpu TestGPUPyTorchThroughTheShim "2. PyTorch natively and through the shim: "
step 90 "3. replay bench natively and through the shim on the GPU" "$root/bin/gpu/replay" -device cuda -pin=false \
	-nice 0 -max-load 0 -repeat 1 -passes 100 -warmup 5 -out "$root/docs/bench/remoting-replay-gpu.md" \
	-json "$root/docs/bench/remoting-replay-gpu.json"
step 90 "4. profiler natively: per-kernel GPU times, per-call CPU" bash -c "cd test/gpu && python3 profile_torch.py '$root/build/gpu-trace'"
gotest 180 test/gpu TestGPULLMThroughTheShim "5. held-out llm decode step: "
cpu_step "6. prediction, measurement, error" test/gpu/compare.sh test/gpu/predictions.tsv "$measured"

# 7. this round's checks, each a test named here: run where the tree has it, else skipped with the reason
gpu_pkgs=" gpuserver/device/nvml gpuserver/device/cuda gpuserver/executor test/gpu "
round_tests=" TestCUDAInstancesServeOneFunctionOnSeveralGPUsAtOnce TestCUDACoRunningFunctionsGetTheirShares TestCUDADiscoversNVSwitchTopology "
for check in "TestCUDAInstancesServeOneFunctionOnSeveralGPUsAtOnce|several GPUs serving one function at once|" \
	"TestCUDACoRunningFunctionsGetTheirShares|co-running functions and their achieved shares|compute shares are being built; their GPU test will be run by this name" \
	"TestCUDADiscoversNVSwitchTopology|NVSwitch topology discovery|"; do
	IFS='|' read -r test what why <<<"$check"
	f=$(grep -rlE "^func ${test}\(" --include='*_test.go' gpuserver test cmd provider 2>/dev/null | head -1)
	if [ -z "$f" ]; then
		echo "=== 7. $what: SKIPPED: no test $test in this tree${why:+ ($why)}"
		continue
	fi
	pkg=$(dirname "$f")
	case "$gpu_pkgs" in
	*" $pkg "*) gotest 60 "$pkg" "$test" "7. $what: " ;;
	*)
		if [ "$dry" = 1 ]; then
			echo "=== 7. $what: $pkg $test: SKIPPED: $pkg is not among the GPU suite's test binaries (GPU_TEST_PKGS in the Makefile)"
		else
			echo "=== 7. $what: $pkg $test: FAILED: $pkg is not among the GPU suite's test binaries (GPU_TEST_PKGS in the Makefile)"
			rc=1
		fi
		;;
	esac
done

# 8. every other CUDA and GPU test, one process per test: on a real GPU a kernel fault poisons every CUDA context of
# its process, so a test that faults on purpose must not take the tests after it down with it.
for pkg in gpuserver/device/nvml gpuserver/device/cuda gpuserver/executor test/gpu; do
	bin=$(testbin "$pkg" 2>/dev/null) || true
	if [ -n "$bin" ]; then
		tests=$(cd "$pkg" && "$bin" -test.list 'CUDA|GPU')
	else
		tests=$(grep -ho '^func Test[A-Za-z0-9_]*' "$pkg"/*_test.go | sed 's/^func //' | grep -E 'CUDA|GPU')
	fi
	for test in $tests; do
		case "$test" in TestGPUPyTorchThroughTheShim | TestGPULLMThroughTheShim) continue ;; esac
		case "$round_tests" in *" $test "*) continue ;; esac # step 7's
		gotest 60 "$pkg" "$test" "8. "
	done
done
step 120 "8. swap bench" "$root/bin/gpu/swapbench" -device cuda -out "$root/docs/bench/swap-cuda.md"
step 60 "8. scratch bench" "$root/bin/gpu/scratchbench" -device cuda -model-mib 1024 -scratch-mib 0,256,1024 -rounds 5 \
	-out "$root/docs/bench/scratch-cuda.md"
if [ "$dry" = 0 ]; then
	cpu_step "prediction, measurement, error (again, after every step)" test/gpu/compare.sh test/gpu/predictions.tsv "$measured"
fi
if [ "$dry" = 1 ]; then
	echo "=== dry: the GPU steps' limits add up to ${limits}s; a real run cuts them to the budget of ${budget}s"
fi
echo "=== suite: $(($(date +%s) - start))s, exit $rc$([ "$dry" = 1 ] && echo ' (dry: nothing ran on a GPU)')"
exit $rc
