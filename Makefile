# faas-gpu: `make run` brings everything up on this machine, `make test` runs the tests.
# Each target's recipe is owned by the component it names; keep targets small and documented.

GO        ?= go
BIN       := bin/faas-gpu
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
RUN_ARGS  ?=

# go-nvml's header declares NVML's deprecated functions and its cgo wrappers call them: without this, a cold build
# prints about 150 lines of -Wdeprecated-declarations warnings that say nothing about faas-gpu.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

# Tools the tests need beyond the README's prerequisites (Go, gcc, make, python3) are built once, pinned, into a
# cache outside the repository and reused: ${FAAS_GPU_CACHE:-~/.cache/faas-gpu}/bin.
FAAS_GPU_CACHE ?= $(HOME)/.cache/faas-gpu
TOOLS_BIN      := $(FAAS_GPU_CACHE)/bin
HELM_VERSION   := v3.22.0
HELM_DIR       := $(TOOLS_BIN)/helm-$(HELM_VERSION)
HELM           := $(HELM_DIR)/helm

.PHONY: all build run test test-go test-shim test-fuzz lint shim bench-policy bench-policy-quick bench-swap bench-scratch bench-remoting bench-queue bench-template clean

all: build

## build: compile bin/faas-gpu (and the shim library); a cold Go build cache compiles about 400 packages (minutes on
## a small machine): a progress line every 20 packages, with the seconds so far
build: shim
	@echo "build: compiling $(BIN) (a cold Go build cache takes a few minutes; a line every 20 packages compiled)"
	@{ $(GO) build -v -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/faas-gpu 2>&1; echo "go-build-exit=$$?"; } | awk \
	  'BEGIN { srand(); t0 = srand() } \
	   /^go-build-exit=/ { code = substr($$0, 15) + 0; next } \
	   /^[A-Za-z0-9._~\/-]+$$/ { n++; if (n % 20 == 0) { srand(); printf "build: %d packages compiled, %ds\n", n, srand() - t0; fflush() } next } \
	   { print; fflush() } \
	   END { if (n > 0) { srand(); printf "build: %d packages compiled in %ds\n", n, srand() - t0 } exit code }'
	@echo "build: $(BIN) $(VERSION)"

## run: build bin/faas-gpu and the example functions (./build/<fn>/, as `make functions`), then faas-gpu up on
## 127.0.0.1:8080 with state in ./.faas-gpu
run: build functions
	./$(BIN) up $(RUN_ARGS)

## test: everything CI runs: lint, the shim's C tests, Go tests with -race, short fuzzes of the wire and the API
test: lint test-shim test-go test-fuzz

## test-go: every Go test with -race; the chart tests run the pinned helm (FAAS_GPU_HELM)
test-go: build $(HELM)
	FAAS_GPU_HELM=$(HELM) $(GO) test -race -count=1 -timeout 25m ./...

## helm: helm $(HELM_VERSION), built once from the Go module proxy into $(TOOLS_BIN) (the chart tests render and
## lint the charts with it); prints its path
.PHONY: helm
helm: $(HELM)
	@echo $(HELM)

$(HELM):
	@echo "helm: building helm $(HELM_VERSION) into $(TOOLS_BIN), once (from the Go module proxy; a few minutes)"
	@mkdir -p $(TOOLS_BIN) && rm -rf $(HELM_DIR).tmp
	@GOBIN=$(HELM_DIR).tmp GOFLAGS=-mod=mod $(GO) install \
	  -ldflags "-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@rm -rf $(HELM_DIR) && mv $(HELM_DIR).tmp $(HELM_DIR)

## test-fuzz: the remoting record decoder and hello, the gpuserver HTTP API and the module image parsers (fat
## binaries, cubins, PTX globals, the sim's LoadModule), each fuzzed for a fixed count (their checked-in corpora
## under testdata/fuzz run in test-go too)
test-fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecodeRecord -fuzztime 2000x ./gpuserver/remoting
	$(GO) test -run '^$$' -fuzz FuzzHello -fuzztime 500x ./gpuserver/remoting
	$(GO) test -run '^$$' -fuzz FuzzAPI -fuzztime 2000x ./gpuserver/api
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 2000x ./gpuserver/device/fatbin
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 2000x ./gpuserver/device/cubin
	$(GO) test -run '^$$' -fuzz FuzzGlobals -fuzztime 2000x ./gpuserver/device/ptx
	$(GO) test -run '^$$' -fuzz FuzzLoadModule -fuzztime 2000x ./gpuserver/device/sim

## test-cluster: the live cluster test (as root): a single-node Kubernetes built from pinned Go modules and Debian
## packages (cached in ~/.cache/faas-gpu/cluster), the chart installed, the live tests in test/cluster/live run,
## everything torn down and the host restored. TEST_CLUSTER_ARGS passes go test flags (e.g. -test.run).
TEST_CLUSTER_ARGS ?=
.PHONY: test-cluster
test-cluster: build $(HELM)
	PATH="$(HELM_DIR):$$PATH" test/cluster/run.sh $(TEST_CLUSTER_ARGS)

## functions: lay out ./build/<fn>/ for every function in stack.yml as `faas-cli build --shrinkwrap` does
## (templates from ./template/<lang>/, where faas-cli reads them)
.PHONY: functions
functions:
	$(GO) run ./cmd/shrinkwrap -f stack.yml -templates template -out build

## test-cuda: the "real CUDA binaries" tier: NVIDIA's CUDA 13 runtime, cuBLAS, cuDNN, nvcc and PyTorch (the pinned
## Python environment, created once in a cache outside the repository) against the shim on the simulated node.
## Runs the packages whose tests use test/pyenv, with FAAS_GPU_TEST_PYENV=1; `make test` skips those tests.
.PHONY: test-cuda
test-cuda: build
	@dir=$$(test/pyenv/pyenv.sh) && echo "test-cuda: pinned Python environment $$dir"
	@dir=$$(test/pyenv/pyenv.sh openai) && echo "test-cuda: pinned OpenAI client environment $$dir"
	FAAS_GPU_TEST_PYENV=1 $(GO) test -count=1 -timeout 60m -v \
	  $$(grep -rl --include='*_test.go' 'faas-gpu/test/pyenv"' . | xargs -n1 dirname | sort -u)

## test-ui: the browser tier: the live pool page (/ui) loaded in headless Chromium (Debian's chromium package,
## which .ci/run installs), checked against the pool, with a screenshot; `make test` skips it
.PHONY: test-ui ui-screenshot
test-ui: build
	FAAS_GPU_TEST_UI=1 $(GO) test -count=1 -timeout 10m -v -run 'TestPoolPageInChromium' ./test/e2e

## ui-screenshot: docs/pool-page.png, the pool page of a node short of memory under load (the test's busy scene)
ui-screenshot: build
	FAAS_GPU_TEST_UI=1 FAAS_GPU_UI_SCENE=busy FAAS_GPU_UI_SCREENSHOT=$(CURDIR)/docs/pool-page.png \
	  $(GO) test -count=1 -timeout 10m -v -run 'TestPoolPageInChromium' ./test/e2e

## pyenv: the pinned CUDA 13 / PyTorch Python environment (cached outside the repository); prints its path
.PHONY: pyenv
pyenv:
	@test/pyenv/pyenv.sh

## lint: gofmt, go vet, go mod tidy without diff
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go') 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@cp go.mod /tmp/faas-gpu-go.mod.bak; cp go.sum /tmp/faas-gpu-go.sum.bak; \
	$(GO) mod tidy; \
	if ! git diff --quiet -- go.mod go.sum; then echo "go mod tidy changes go.mod/go.sum:"; git --no-pager diff -- go.mod go.sum; \
	  cp /tmp/faas-gpu-go.mod.bak go.mod; cp /tmp/faas-gpu-go.sum.bak go.sum; exit 1; fi

## shim: the replacement libcuda.so.1 (gcc, no CUDA headers needed)
shim:
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim; fi

test-shim:
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim test; fi

## gpu-test: the GPU suite on a machine with an NVIDIA GPU and driver (test/gpu/suite.sh, one run within a 470 s
## budget, each step under a time limit; its header lists the steps): the machine and topology, the predictions, PyTorch
## natively and through the shim (held-out ResNet-50 included), the replay bench's per-call driver costs, the
## profiler's per-kernel times, the held-out llm decode step, prediction against measurement (test/gpu/compare.sh),
## then every other CUDA and GPU test and the data-plane benches. `test/gpu/suite.sh --dry` runs its CPU parts and
## prints the rest on any machine. Where Go is installed the test binaries are built first.
GPU_TEST_PKGS := gpuserver/device/nvml gpuserver/device/cuda gpuserver/executor test/gpu
.PHONY: gpu-test gpu-test-bin
gpu-test:
	@if command -v $(GO) >/dev/null 2>&1; then $(MAKE) gpu-test-bin; fi
	test/gpu/suite.sh

## gpu-test-bin: the GPU suite's test binaries in bin/gpu, for a GPU machine without Go
gpu-test-bin:
	@mkdir -p bin/gpu
	@for p in $(GPU_TEST_PKGS); do $(GO) test -c -ldflags="-s -w" -o bin/gpu/$$(echo $$p | tr / -).test ./$$p || exit 1; done
	$(GO) build -ldflags="-s -w" -o bin/gpu/swapbench ./test/bench/swap
	$(GO) build -ldflags="-s -w" -o bin/gpu/scratchbench ./test/bench/scratch
	$(GO) build -ldflags="-s -w" -o bin/gpu/replay ./test/bench/replay

## gpu-trace: on a GPU machine, record what PyTorch uses of the real driver and, natively with the profiler, each
## launch's issue time and GPU time (shim/testdata/trace, see its README: gpu-profile-*.tsv feed make replay-traces)
.PHONY: gpu-trace
gpu-trace:
	test/gpu/trace.sh build/gpu-trace
	@echo "compare build/gpu-trace with shim/testdata/trace and copy what changed; then on a machine with the pinned"
	@echo "Python environment: make replay-traces REPLAY_PROFILES=build/gpu-trace (or shim/testdata/trace once copied)"

## check-docs: the docs checked against the code and run as written: every faas-gpu flag and make target a doc names
## exists and every link resolves (test/docs), and the documented flows run verbatim (test/e2e, DOC_TESTS: the
## README's curl quickstart and faas-cli deploy order, docs/openfaas-gateway.md's standalone setup as root and as
## nobody, PyTorch's kernels on the default node, faas-cli against up, make run and make build). CHECK_DOCS_NETWORK=1
## adds the flows that download from PyPI (the README's PyTorch flow, pip requirements through up). Not run: the CE
## gateway setup (it needs the gateway built from openfaas/faas 0.27.14) and, where no faas-cli is found, faas-cli
## itself (the tests then send the requests it sends).
DOC_TESTS := TestReadmeQuickstart|TestReadmeFaasCLIDeploysWhatDownloadsNothingFirst|TestStandaloneSetupAsDocumented|TestKernelsTheSimulatedNodeCannotCompute|TestFaasCLIAgainstUp|TestMakeRunBuildsTheExampleFunctions|TestMakeBuildShowsProgress|TestExampleFunctionsInStackAndReadme
DOC_NETWORK_TESTS := TestReadmePyTorchFlowOnTheDefaultNode|TestFunctionsWithPipRequirementsThroughUp
.PHONY: check-docs
check-docs: build
	$(GO) test -count=1 ./test/docs/
	$(GO) test -count=1 -timeout 20m -run '^($(DOC_TESTS))$$' ./test/e2e/
	@if [ -n "$(CHECK_DOCS_NETWORK)" ]; then \
	  echo "FAAS_GPU_TEST_PYENV=1 $(GO) test -count=1 -timeout 60m -run '^($(DOC_NETWORK_TESTS))$$' ./test/e2e/"; \
	  FAAS_GPU_TEST_PYENV=1 $(GO) test -count=1 -timeout 60m -run '^($(DOC_NETWORK_TESTS))$$' ./test/e2e/; fi

## check-rotation: the rotation check from outside: six mlp copies through a node that holds four, three rounds;
## every answer 200, equal to its function's first and to the host reference (test/rotation/run.sh)
.PHONY: check-rotation
check-rotation: build functions
	test/rotation/run.sh

## bench-policy: every policy on both figures (functions and requests within SLO, refusals) over five seeds: Torpor's
## node, the Azure trace's hours, Torpor's arrivals with the overload control on and off, cluster sizing against
## static packing, keep-alive and late binding, the router against round robin; writes docs/bench/policy.{md,json}
## (with -seeds 1,3: 731 s wall, 17.5 min of CPU, on two cores at load 3-4; the default five seeds were not timed;
## wall time grows with whatever else the machine runs)
bench-policy:
	$(GO) run ./test/bench/policy -workloads $${FAAS_GPU_WORKLOADS:-../shared/workloads} -out docs/bench

## bench-policy-quick: the same on two seeds and fewer points (about 2.5 minutes on two quiet cores), writes
## build/bench/policy-quick.{md,json}
bench-policy-quick:
	$(GO) run ./test/bench/policy -workloads $${FAAS_GPU_WORKLOADS:-../shared/workloads} -out build/bench -quick

## bench-swap: data-plane benchmarks, writes docs/bench/swap.md
bench-swap: build
	$(GO) run ./test/bench/swap -device sim -out docs/bench/swap.md

## bench-scratch: eviction and swap-in of a function with scratch kept (written back, restored) against scratch
## declared per request, side by side; writes docs/bench/scratch.md
bench-scratch:
	$(GO) run ./test/bench/scratch -device sim -out docs/bench/scratch.md

## bench-remoting: shim transport benchmarks (docs/bench/remoting.md) and the replay bench: the recorded PyTorch
## passes of shim/testdata/trace/replay-*.tsv through the shim and a gpuserver on the timed virtual GPU, beside the
## native pass computed from the same traces (docs/bench/remoting-replay.md). REPLAY_ARGS passes flags to it.
## The replay bench runs first: it sets its own priority (nice -15 in an autogroup of its own) and pinning, and refuses
## a machine loaded above its CPU count (REPLAY_ARGS=-force runs anyway, its report labelled) before either report is
## rewritten.
REPLAY_ARGS ?=
bench-remoting: build
	$(MAKE) -C shim
	@mkdir -p docs/bench
	$(GO) run ./test/bench/replay -out docs/bench/remoting-replay.md -json docs/bench/remoting-replay.json $(REPLAY_ARGS)
	$(GO) run ./test/bench/remoting -out docs/bench/remoting.md

## replay-traces: the replay traces from the dry PyTorch passes' call logs (the CUDA tier, FAAS_GPU_CALLLOG_DIR) and
## the GPU's per-pass figures (shim/testdata/trace/h100-passes.tsv); see shim/testdata/trace/README.md
REPLAY_PROFILES ?= $(if $(wildcard shim/testdata/trace/gpu-profile-*.tsv),shim/testdata/trace)
.PHONY: replay-traces
replay-traces: build
	@dir=$$(test/pyenv/pyenv.sh) && echo "replay-traces: pinned Python environment $$dir"
	@rm -rf build/calllog && mkdir -p build/calllog
	FAAS_GPU_TEST_PYENV=1 FAAS_GPU_CALLLOG_DIR=$(CURDIR)/build/calllog $(GO) test -count=1 -run TestTorchDryForward ./test/cuda/
	$(GO) run ./test/bench/replay/gentrace -calllogs build/calllog -out shim/testdata/trace \
	  $$(test -n "$(REPLAY_PROFILES)" && echo -profiles $(REPLAY_PROFILES))

## bench-llm: the llm function through the shim on the simulated node (dry kernels; needs test/pyenv): TTFT warm
## and cold from the host image, decode steps/s eagerly and with CUDA graphs (the synchronize after a read answered
## in the shim and not, side by side), 4 and 16 variants of one base (a process each: about 10 GB of host memory and
## 6 minutes of CPU at once; GOGC=50 keeps the simulated GPU's heap smaller); writes docs/bench/llm.md (no
## modelled GPU time) and docs/bench/llm-timed.md (the timed virtual GPU, 4 variants: sharing does not depend on
## time; with a lower bound of shim/native with graphs from its uniform kernel time)
.PHONY: bench-llm
bench-llm: build
	@test/pyenv/pyenv.sh >/dev/null
	GOGC=50 $(GO) run ./test/llmbench -runs 10 -tokens 64 -out docs/bench/llm.md
	GOGC=50 $(GO) run ./test/llmbench -timed -runs 10 -tokens 64 -variants 4 -out docs/bench/llm-timed.md

## bench-llm-batch: continuous batching in the llm function on the timed virtual GPU (needs test/pyenv): decode
## tokens/s per GPU, TTFT warm and cold and the binding's hold per request at 1, 4, 16 and 64 concurrent sequences,
## batched (LLM_MAX_BATCH=64) beside one at a time (LLM_MAX_BATCH=1); writes docs/bench/llm-batch.md
.PHONY: bench-llm-batch
bench-llm-batch: build
	@test/pyenv/pyenv.sh >/dev/null
	GOGC=50 nice -n 10 $(GO) run ./test/llmbench -batch -runs 3 -tokens 64 -out docs/bench/llm-batch.md

## bench-tenants: an executor process per tenant against every tenant in the gpuserver's process, side by side
## (remoting round trip and async records through the shim, swaps, acquire/release), writes docs/bench/tenants.md
.PHONY: bench-tenants
bench-tenants: build
	$(GO) run ./test/bench/tenants -out docs/bench/tenants.md -rounds 5

## bench-queue: queue worker benchmarks, writes docs/bench/queue.md
bench-queue: build
	@mkdir -p docs/bench
	$(GO) run ./test/bench/queue -out docs/bench/queue.md \
	  -models $${FAAS_GPU_WORKLOADS:-../shared/workloads}/models-torpor-v100.csv

## bench-template: the gpu-python template behind the provider under 200 concurrent clients, listen backlog 5 vs
## the template's default, writes docs/bench/template.md
bench-template:
	@mkdir -p docs/bench
	$(GO) run ./test/load/templatebench -out docs/bench/template.md -concurrency 200 -duration 20s

clean:
	rm -rf bin
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim clean; fi
