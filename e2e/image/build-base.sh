#!/usr/bin/env bash
# Makes, or finds already made, localhost/python:3.11-slim-bookworm: a Python base image built from
# Debian bookworm packages (debootstrap), standing in for Docker Hub's python:3.11-slim-bookworm where no
# registry is reachable. The Dockerfile's FROM is pinned by digest, which no locally made image can carry:
# build on this one with `make image BASE_IMAGE=localhost/python:3.11-slim-bookworm` (e2e/image/build.sh).
#
# The image: debootstrap --variant=minbase with python3, python3-venv, python3-pip, python-is-python3 and
# ca-certificates (Debian's Python 3.11 in /usr/bin; the official image builds 3.11.x into /usr/local),
# less apt's caches and lists, docs, man pages, locales, logs, and Debian's PEP 668 marker
# (/usr/lib/python3.11/EXTERNALLY-MANAGED: with it the Dockerfile's `python -m pip install` is refused).
# One layer, packed by umoci, written by skopeo as a docker-archive tar (buildah pull, ctr images import).
#
# Cached as $GPUSLICE_IMAGE_CACHE/base-<key>.tar (default ~/.cache/gpuslice-image), key = sha256 of this
# script: debootstrap takes the newest bookworm packages, so the recipe is the key; delete the tar to
# refresh the packages on purpose. Needs root, debootstrap, umoci and skopeo, and a Debian mirror
# ($GPUSLICE_DEBIAN_MIRROR, default http://deb.debian.org/debian). A cold build takes 2-6 min.
# Progress goes to stderr; the only line on stdout is the tar's path.
set -euo pipefail

NAME=localhost/python:3.11-slim-bookworm
SUITE=bookworm
PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
MIRROR=${GPUSLICE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${GPUSLICE_IMAGE_CACHE:-$HOME/.cache/gpuslice-image}

# Everything but the answer goes to stderr; fd 3 is the caller's stdout.
exec 3>&1 1>&2
say() { echo "build-base: $*" >&2; }
die() { say "$*"; exit 3; }

missing=()
for tool in debootstrap umoci skopeo flock setsid sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || die "missing: ${missing[*]} (Debian: apt-get install debootstrap umoci skopeo)"
[ "$(id -u)" -eq 0 ] || die "must run as root: debootstrap creates device nodes and files owned by other users"

KEY=$(sha256sum "$0" | cut -c1-16)
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
TAR=$CACHE/base-$KEY.tar
# One build at a time per cache; a second caller waits, then finds the tar.
exec 9>"$CACHE/.base.lock"
flock 9
if [ -s "$TAR" ]; then
  touch "$TAR"
  say "cached: $NAME in $TAR"
  echo "$TAR" >&3
  exit 0
fi

need_kb=$((1024 * 1024))
avail_kb=$(df -Pk "$CACHE" | awk 'NR==2{print $4}')
[ "$avail_kb" -ge "$need_kb" ] || die "only $((avail_kb / 1024)) MiB free under $CACHE; the build needs about 1 GiB"

WORK=$(mktemp -d "$CACHE/base-work.XXXXXX")
cleanup() {
  local rc=$? mnt
  # An interrupted debootstrap can leave /proc, /sys or /dev binds mounted in the target: unmount them
  # (deepest first) before removing anything, and never cross into another filesystem.
  awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || say "could not unmount $mnt"
  done
  rm -rf --one-file-system "$WORK" "$TAR.tmp"
  exit "$rc"
}
trap cleanup EXIT
source "$(dirname "${BASH_SOURCE[0]}")/interruptible.sh"

start=$(date +%s)
ARCH=$(dpkg --print-architecture)
say "making $NAME ($SUITE $ARCH from $MIRROR) into $TAR; a cold build takes 2-6 min"

# An empty image unpacked as a bundle; debootstrap fills its rootfs, repack makes it the one layer.
LAYOUT=$WORK/layout BUNDLE=$WORK/bundle
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:base"
umoci unpack --image "$LAYOUT:base" "$BUNDLE"
ROOTFS=$BUNDLE/rootfs
if ! in_background debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >&2; then
  cp "$ROOTFS/debootstrap/debootstrap.log" "$CACHE/base-debootstrap.log" 2>/dev/null || true
  die "debootstrap failed: the lines above, and its log in $CACHE/base-debootstrap.log"
fi
bootstrapped=$(date +%s)

# Slim. debootstrap copied the host's resolv.conf and hostname: a container runtime provides its own.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/lib/apt/lists/* \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/locale/* \
  "$ROOTFS"/var/log/* "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/usr/lib/python3*/EXTERNALLY-MANAGED
: > "$ROOTFS/etc/resolv.conf"
echo localhost > "$ROOTFS/etc/hostname"
# Nothing may still be mounted inside (debootstrap unmounts /proc and /sys when it succeeds); /dev is
# left empty, as in Docker's images: the runtime mounts its own.
if awk -v r="$ROOTFS/" 'index($2, r) == 1 {found=1} END {exit !found}' /proc/mounts; then
  die "something is still mounted under $ROOTFS"
fi
rm -rf --one-file-system "${ROOTFS:?}"/dev/*
[ -x "$ROOTFS/usr/bin/python3" ] || die "no /usr/bin/python3 in the made rootfs"
PYVERSION=$(dpkg-query --admindir="$ROOTFS/var/lib/dpkg" -W -f '${Version}' python3.11)

umoci repack --image "$LAYOUT:base" --history.created_by "e2e/image/build-base.sh: debootstrap $SUITE + $PACKAGES" "$BUNDLE"
umoci config --image "$LAYOUT:base" --os linux --architecture "$ARCH" --config.cmd python3 \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --config.env LANG=C.UTF-8 \
  --config.label org.opencontainers.image.description="Debian $SUITE python3 ($PYVERSION), made by gpuslice's e2e/image/build-base.sh"
skopeo copy --quiet "oci:$LAYOUT:base" "docker-archive:$TAR.tmp:$NAME"
mv "$TAR.tmp" "$TAR"

rootfs_mb=$(du -sm --one-file-system "$ROOTFS" | cut -f1)
say "made $NAME (Python $PYVERSION) in $(( $(date +%s) - start )) s (debootstrap $(( bootstrapped - start )) s):" \
  "rootfs $rootfs_mb MiB, tar $(( $(stat -c %s "$TAR") / 1024 / 1024 )) MiB"
# Older keys are older recipes: keep this one and the one before it.
ls -1t "$CACHE"/base-*.tar 2>/dev/null | tail -n +3 | xargs -r rm -f
echo "$TAR" >&3
