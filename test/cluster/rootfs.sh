#!/usr/bin/env bash
# Builds (or reuses) the Debian base of the cluster test's images with debootstrap, from Debian's packages: a
# minbase bookworm with python3 (the gpu-python functions) and coreutils (the shim init container's cp). Prints the
# path of the cached tarball ($FAAS_GPU_CLUSTER_CACHE/rootfs/bookworm-python3.tar.gz), which the image builder uses as
# the base layer. The mirror is the first deb.debian.org-style URI apt uses here, or $FAAS_GPU_DEBIAN_MIRROR.
set -euo pipefail
CACHE=${FAAS_GPU_CLUSTER_CACHE:-$HOME/.cache/faas-gpu/cluster}
SUITE=bookworm
out=$CACHE/rootfs/$SUITE-python3.tar.gz
if [ -f "$out" ]; then echo "$out"; exit 0; fi
mirror=${FAAS_GPU_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(sed -n 's/^URIs: *\(.*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
	mirror=${mirror:-http://deb.debian.org/debian}
fi
command -v debootstrap >/dev/null || { echo "rootfs.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
mkdir -p "$CACHE/rootfs"
dir=$(mktemp -d "$CACHE/rootfs/.build.XXXXXX")
trap 'rm -rf "$dir"' EXIT
echo "[rootfs] debootstrap $SUITE (minbase + python3) from $mirror" >&2
debootstrap --variant=minbase --include=python3 "$SUITE" "$dir/root" "$mirror" >"$dir/debootstrap.log" 2>&1 || {
	tail -20 "$dir/debootstrap.log" >&2; exit 1; }
# What a container image does not need: apt's caches and lists, documentation.
rm -rf "$dir/root/var/cache/apt/archives/"*.deb "$dir/root/var/lib/apt/lists/"* "$dir/root/usr/share/doc" \
	"$dir/root/usr/share/man" "$dir/root/usr/share/locale"
tar --numeric-owner -C "$dir/root" -cf - . | gzip -1 >"$dir/rootfs.tar.gz"
mv "$dir/rootfs.tar.gz" "$out"
echo "$out"
