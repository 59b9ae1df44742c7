#!/usr/bin/env bash
# Builds, or finds already built, what a real node needs besides the kubelet (which e2e/k8s/build.sh
# builds with the control plane): containerd, its runc shim and ctr at the version this module's
# go.mod pins (tool directives; CDI is on by default in containerd 2), NVIDIA's container runtime
# (nvidia-container-runtime from the NVIDIA Container Toolkit, used in its CDI mode: the `nvidia`
# RuntimeClass the chart's plugin runs under by default), and two images made here,
# never pulled: localhost/pause:3.10 (Kubernetes' own pause.c from the k8s.io/kubernetes module,
# linked statically) and localhost/busybox:1 (Debian's busybox-static), as docker-archive tars.
# runc and the CNI plugins are Debian's (e2e/node/install-packages.sh).
#
# Cached under $GPUSLICE_NODE_CACHE (default ~/.cache/gpuslice-node), keyed by the Go version, this
# module's go.mod/go.sum, e2e/k8s/go.mod (pause.c's version) and this script. Progress goes to stderr;
# the last line on stdout is the directory.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K8S_MOD=$(cd "$HERE/../k8s" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-modcacherw CGO_ENABLED=0
say() { echo "build-node: $*" >&2; }

command -v go >/dev/null || { say "go is not on PATH"; exit 3; }
for tool in gcc umoci skopeo; do
  command -v "$tool" >/dev/null || { say "$tool is missing: run e2e/node/install-packages.sh"; exit 3; }
done
[ -x /bin/busybox ] || { say "/bin/busybox is missing (Debian's busybox-static): run e2e/node/install-packages.sh"; exit 3; }

KEY=$( { go version; cat "$HERE/go.mod" "$HERE/go.sum" "$K8S_MOD/go.mod" "$0"; } | sha256sum | cut -c1-16)
CACHE=${GPUSLICE_NODE_CACHE:-$HOME/.cache/gpuslice-node}
OUT=$CACHE/$KEY
FILES=(containerd containerd-shim-runc-v2 ctr nvidia-container-runtime pause.tar busybox.tar)
complete() { for f in "${FILES[@]}"; do [ -s "$OUT/$f" ] || return 1; done; }
if complete; then say "cached: $OUT"; echo "$OUT"; exit 0; fi

start=$(date +%s)
CONTAINERD_VERSION=$(cd "$HERE" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
say "containerd $CONTAINERD_VERSION, its shim and ctr into $OUT"
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"
T=$(mktemp -d); trap 'chmod -R u+w "$T" 2>/dev/null; rm -rf "$T"' EXIT
# The btrfs, devmapper and zfs snapshotters need cgo or host tools and are never used here.
( cd "$HERE" && go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -o "$OUT.tmp/" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr ) >&2

TOOLKIT_VERSION=$(cd "$HERE" && go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit)
say "nvidia-container-runtime $TOOLKIT_VERSION"
# Its internal/cuda package needs cgo (it links only libc; the CUDA library is opened at run time).
( cd "$HERE" && CGO_ENABLED=1 go build -trimpath -o "$OUT.tmp/" -ldflags "-s -w" \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime ) >&2

say "images: localhost/pause:3.10 (pause.c, static) and localhost/busybox:1 (busybox-static)"
K8S_DIR=$(cd "$K8S_MOD" && go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -f "$K8S_DIR/build/pause/linux/pause.c" ] || { say "pause.c not found under $K8S_DIR"; exit 1; }
mkdir -p "$T/pause" "$T/busybox/bin" "$T/busybox/etc" "$T/busybox/tmp"
gcc -Os -static -o "$T/pause/pause" "$K8S_DIR/build/pause/linux/pause.c"
cp /bin/busybox "$T/busybox/bin/busybox"
# `busybox --list` names busybox itself: a link of that name would point at itself.
for applet in $(/bin/busybox --list | grep -vx busybox); do ln -s busybox "$T/busybox/bin/$applet"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$T/busybox/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\n' > "$T/busybox/etc/group"
chmod 1777 "$T/busybox/tmp"

umoci init --layout "$T/layout" >&2
image() { # NAME TAG ROOTFS ENTRYPOINT
  umoci new --image "$T/layout:$1" >&2
  umoci unpack --rootless --image "$T/layout:$1" "$T/bundle-$1" >&2
  cp -a "$3/." "$T/bundle-$1/rootfs/"
  umoci repack --image "$T/layout:$1" "$T/bundle-$1" >&2
  umoci config --image "$T/layout:$1" --architecture amd64 --os linux --config.workingdir / \
    --config.entrypoint "$4" --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin >&2
  skopeo copy --quiet "oci:$T/layout:$1" "docker-archive:$OUT.tmp/$1.tar:localhost/$1:$2" >&2
}
image pause 3.10 "$T/pause" /pause
image busybox 1 "$T/busybox" /bin/sh
printf "containerd %s\nnvidia-container-toolkit %s\n" "$CONTAINERD_VERSION" "$TOOLKIT_VERSION" > "$OUT.tmp/VERSION"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
say "built in $(( $(date +%s) - start )) s: $(du -sh "$OUT" | cut -f1) in $OUT"
# Older keys are other versions: keep the two newest.
ls -1dt "$CACHE"/*/ 2>/dev/null | tail -n +3 | xargs -r rm -rf
echo "$OUT"
