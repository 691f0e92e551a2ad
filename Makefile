# faas-gpu: `make run` brings everything up on this machine, `make test` runs the tests.
# Each target's recipe is owned by the component it names; keep targets small and documented.

GO        ?= go
BIN       := bin/faas-gpu
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
RUN_ARGS  ?=

.PHONY: all build run test test-go test-shim test-fuzz lint gpu-test shim bench-policy bench-swap bench-remoting bench-queue clean

all: build

## build: compile bin/faas-gpu (and the shim library)
build: shim
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/faas-gpu

## run: faas-gpu up on 127.0.0.1:8080 with state in ./.faas-gpu and functions from ./build
run: build
	./$(BIN) up $(RUN_ARGS)

## test: everything CI runs: lint, the shim's C tests, Go tests with -race, a short fuzz of the wire decoder
test: lint test-shim test-go test-fuzz

test-go: build
	$(GO) test -race -count=1 -timeout 25m ./...

## test-fuzz: the remoting record decoder fuzzed for a fixed count (the checked-in corpus runs in test-go too)
test-fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecodeRecord -fuzztime 2000x ./gpuserver/remoting

## functions: lay out ./build/<fn>/ for every function in stack.yml as `faas-cli build --shrinkwrap` does
## pyenv: the pinned CUDA 13 / PyTorch Python environment (cached outside the repository); prints its path
.PHONY: pyenv
pyenv:
	@test/pyenv/pyenv.sh

.PHONY: functions
functions:
	$(GO) run ./provider/shrinkwrap/cmd/shrinkwrap -f stack.yml -templates templates -out build

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

## gpu-test: the GPU suite (needs an NVIDIA GPU and driver); writes the real data-plane figures to docs/bench/swap-cuda.md
gpu-test: build
	FAAS_GPU_TEST_CUDA=1 FAAS_GPU_GPU_REPORT=$(CURDIR)/docs/bench/pytorch-shim.md $(GO) test -count=1 -timeout 25m -v -run 'CUDA|GPU' ./gpuserver/... ./test/...
	$(GO) run ./gpuserver/executor/swapbench -device cuda -out docs/bench/swap-cuda.md

## bench-policy: policy sweeps (node, overload with the offline bound, partial residency, cluster, speed, three
## seeds) on the simulator, writes docs/bench/policy.{md,png,json} and policy-cluster.png
bench-policy: build
	$(GO) run ./gpuserver/simulate/benchpolicy -workloads ../shared/workloads -out docs/bench -seed 1 \
	  $$(test -f docs/bench/policy.json && echo -previous docs/bench/policy.json)

## bench-swap: data-plane benchmarks, writes docs/bench/swap.md
bench-swap: build
	$(GO) run ./gpuserver/executor/swapbench -device sim -out docs/bench/swap.md

## bench-remoting: shim transport benchmarks, writes docs/bench/remoting.md
bench-remoting: build
	$(MAKE) -C shim
	@mkdir -p docs/bench
	$(GO) run ./gpuserver/remoting/cmd/remoting-bench -out docs/bench/remoting.md

## bench-queue: queue worker benchmarks, writes docs/bench/queue.md
bench-queue: build
	@mkdir -p docs/bench
	$(GO) run ./queueworker/bench/queuebench -out docs/bench/queue.md \
	  -models $${FAAS_GPU_WORKLOADS:-../shared/workloads}/models-torpor-v100.csv

clean:
	rm -rf bin
	@if [ -f shim/Makefile ]; then $(MAKE) -C shim clean; fi
