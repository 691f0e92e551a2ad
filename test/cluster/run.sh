#!/usr/bin/env bash
# make test-cluster: the live cluster test. Installs what is missing (Debian packages), builds or reuses the
# cluster's binaries (build-bins.sh) and the images' Debian base (rootfs.sh), then `cluster run` starts a
# single-node Kubernetes here, runs the live tests in test/cluster/live against it, stops it and restores the host.
# Everything it builds is cached in $FAAS_GPU_CLUSTER_CACHE (default ~/.cache/faas-gpu/cluster).
#
#   test/cluster/run.sh [go test flags...]     e.g. test/cluster/run.sh -run 'TestKubernetes'
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
log() { printf '[test-cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
	echo "test-cluster: needs root (it runs containerd, the kubelet and kube-proxy on this machine)" >&2
	exit 1
fi
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v etcd >/dev/null || need+=(etcd-server)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
	log "installing Debian packages: ${need[*]}"
	apt-get update -qq >/dev/null 2>&1 || true
	# No service is started on install (there is no init system to start one; policy-rc.d may also deny it).
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v helm >/dev/null || { echo "test-cluster: helm is missing (make test-cluster puts the pinned helm on PATH)" >&2; exit 1; }

log "binaries (built once into the cache)"
k8s=$(test/cluster/build-bins.sh k8s)
coredns=$(test/cluster/build-bins.sh coredns)/coredns
knative=$(test/cluster/build-bins.sh knative)
rootfs=$(test/cluster/rootfs.sh)
log "faas-gpu and the shim"
make -s build >/dev/null

cache=${FAAS_GPU_CLUSTER_CACHE:-$HOME/.cache/faas-gpu/cluster}
mkdir -p "$cache/bin/test"
go build -o "$cache/bin/test/cluster" ./test/cluster/cmd/cluster
go test -c -o "$cache/bin/test/live.test" ./test/cluster/live
log "prepared in $(( $(date +%s) - start ))s; starting the cluster"
set +e
"$cache/bin/test/cluster" run -k8s-bin "$k8s" -coredns "$coredns" -knative-bin "$knative" -rootfs "$rootfs" -- \
	"$cache/bin/test/live.test" -test.v -test.count=1 -test.timeout=45m "$@"
rc=$?
set -e
log "done in $(( $(date +%s) - start ))s (exit $rc)"
exit $rc
