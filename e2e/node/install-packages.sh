#!/usr/bin/env bash
# Installs the Debian packages the real-node tests and the local image build need, when one is missing:
# runc (containerd's OCI runtime), the CNI plugins (the pod bridge), busybox-static, umoci and skopeo
# (images made without a registry), buildah and fuse-overlayfs (the gpuslice image, no daemon),
# debootstrap (the local Python base image), iptables (the API server's Service address for pods),
# gcc and libc6-dev (the static pause binary). Needs root and Debian's apt; does nothing when all are present.
set -euo pipefail
PACKAGES=(runc containernetworking-plugins busybox-static umoci skopeo buildah fuse-overlayfs debootstrap
          iptables iproute2 gcc libc6-dev)
missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-packages: missing ${missing[*]}; installing them needs root and apt-get" >&2; exit 3
fi
echo "install-packages: installing ${missing[*]}" >&2
apt-get update -q >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
