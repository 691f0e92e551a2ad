#!/usr/bin/env bash
# Builds (or reuses) the binaries the live cluster test runs, from pinned Go modules, in scratch modules generated
# outside the repository, so the project's go.mod never grows with Kubernetes server modules. Everything lands in
# the cache ($FAAS_GPU_CLUSTER_CACHE, default ~/.cache/faas-gpu/cluster): its own Go module and build caches, the
# scratch modules under src/, and the binaries under bin/<set>-<version>/. A set whose binaries exist is reused.
#
#   test/cluster/build-bins.sh [k8s|knative|coredns|all]    prints the bin directory of each set it built or reused
set -euo pipefail

K8S_VERSION=v1.35.8          # k8s.io/kubernetes; the proxy refuses v1.35.7
K8S_STAGING=v0.35.8          # the published staging modules of the same release
KNATIVE_SERVING=v0.50.0      # knative.dev/serving: controller, autoscaler, queue-proxy
COREDNS=v1.12.4              # github.com/coredns/coredns: the cluster's DNS

CACHE=${FAAS_GPU_CLUSTER_CACHE:-$HOME/.cache/faas-gpu/cluster}
export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
export GOWORK=off

log() { printf '[build-bins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# scratch NAME: an empty module directory under the cache, created fresh each build.
scratch() {
	local dir=$CACHE/src/$1
	rm -rf "$dir"
	mkdir -p "$dir"
	printf '%s' "$dir"
}

build_k8s() {
	local out=$CACHE/bin/k8s-$K8S_VERSION
	local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
	if [ -f "$out/.complete" ]; then echo "$out"; return; fi
	log "building Kubernetes $K8S_VERSION (${bins[*]}); a cold build takes 10-20 minutes on 2 cores"
	local dir
	dir=$(scratch k8s)
	cd "$dir"
	go mod init faas-gpu.test/cluster/k8s >/dev/null 2>&1
	go mod edit -go=1.25.0 -require=k8s.io/kubernetes@$K8S_VERSION
	local gomod
	gomod=$(go mod download -json k8s.io/kubernetes@$K8S_VERSION | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	# Each staging module the kubernetes module replaces with ./staging/src/... is replaced with its published version.
	local m
	for m in $(sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod"); do
		go mod edit -replace="$m=$m@$K8S_STAGING"
	done
	local ld="-s -w"
	local p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=35 -X $p.gitTreeState=clean"
	done
	local pkgs=()
	for m in "${bins[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$m"); done
	mkdir -p "$out"
	log "resolving modules"
	go build -trimpath -ldflags "$ld" -o "$out/" "${pkgs[@]}"
	touch "$out/.complete"
	log "built $out"
	echo "$out"
}

build_knative() {
	local out=$CACHE/bin/knative-$KNATIVE_SERVING
	if [ -f "$out/.complete" ]; then echo "$out"; return; fi
	log "building Knative Serving $KNATIVE_SERVING (controller, autoscaler, queue)"
	local dir
	dir=$(scratch knative)
	cd "$dir"
	go mod init faas-gpu.test/cluster/knative >/dev/null 2>&1
	go mod edit -require=knative.dev/serving@$KNATIVE_SERVING
	mkdir -p "$out"
	go build -trimpath -ldflags "-s -w" -o "$out/" knative.dev/serving/cmd/controller \
		knative.dev/serving/cmd/autoscaler knative.dev/serving/cmd/queue
	touch "$out/.complete"
	log "built $out"
	echo "$out"
}

build_coredns() {
	local out=$CACHE/bin/coredns-$COREDNS
	if [ -f "$out/.complete" ]; then echo "$out"; return; fi
	log "building CoreDNS $COREDNS"
	local dir
	dir=$(scratch coredns)
	cd "$dir"
	go mod init faas-gpu.test/cluster/coredns >/dev/null 2>&1
	go mod edit -require=github.com/coredns/coredns@$COREDNS
	# CoreDNS with only the plugins the cluster's Corefile uses (CoreDNS's documented way to choose plugins:
	# a main that imports them and sets the directive order), instead of its full set with every cloud SDK.
	cat >main.go <<'GO'
// Command coredns is CoreDNS with the plugins of a cluster DNS only.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The same relative order as CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "cache", "kubernetes"}
}

func main() { coremain.Run() }
GO
	mkdir -p "$out"
	go build -trimpath -ldflags "-s -w" -o "$out/coredns" .
	touch "$out/.complete"
	log "built $out"
	echo "$out"
}

case "${1:-all}" in
k8s) build_k8s ;;
knative) build_knative ;;
coredns) build_coredns ;;
all) build_k8s; build_knative; build_coredns ;;
*) echo "usage: $0 [k8s|knative|coredns|all]" >&2; exit 2 ;;
esac
