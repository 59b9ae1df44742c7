#!/usr/bin/env bash
# Builds, or finds already built, the real Kubernetes components the e2e tests run: kube-apiserver, etcd,
# kube-scheduler, kube-controller-manager, dmharness (kubelet's device manager), draharness (kubelet's DRA
# manager and plugin manager) and the whole kubelet (the real-node tests). Binaries are cached outside the clone, under $GPUSLICE_K8S_CACHE (default
# ~/.cache/gpuslice-k8s), keyed by the Go version, go.mod, go.sum and our mains, so a fresh clone on the same
# machine builds nothing. Progress goes to stderr; the last line on stdout is the directory holding the binaries.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export GOTOOLCHAIN=local GOFLAGS=-modcacherw CGO_ENABLED=0
say() { echo "build-k8s: $*" >&2; }

command -v go >/dev/null || { say "go is not on PATH"; exit 3; }
K8S_VERSION=$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$HERE/go.mod")
KEY=$( { go version; cat "$HERE/go.mod" "$HERE/go.sum" "$0"; find "$HERE/cmd" -name '*.go' | sort | xargs cat; } \
       | sha256sum | cut -c1-16)
CACHE=${GPUSLICE_K8S_CACHE:-$HOME/.cache/gpuslice-k8s}
OUT=$CACHE/$KEY
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager etcd dmharness draharness kubelet)

complete() { for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done; }
if complete; then
  say "cached: Kubernetes $K8S_VERSION in $OUT"
  echo "$OUT"; exit 0
fi

# The module cache, build cache and binaries take about 7 GB on a cold machine.
need_kb=$((8 * 1024 * 1024))
mkdir -p "$CACHE"
avail_kb=$(df -Pk "$CACHE" | awk 'NR==2{print $4}')
if [ "$avail_kb" -lt "$need_kb" ]; then
  say "only $((avail_kb / 1024)) MiB free under $CACHE; the build needs about 8 GiB"; exit 3
fi

say "building Kubernetes $K8S_VERSION components (${BINARIES[*]}) into $OUT; a cold build takes 10-30 min"
start=$(date +%s)
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
# Without these the servers report v0.0.0-master, and helm's kubeVersion checks fail.
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean"
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"
( cd "$HERE" && go mod download && go build -trimpath -ldflags "$LDFLAGS" -o "$OUT.tmp/" \
    ./cmd/kube-apiserver ./cmd/kube-scheduler ./cmd/kube-controller-manager ./cmd/etcd ./cmd/dmharness \
    ./cmd/draharness ./cmd/kubelet ) >&2
echo "$K8S_VERSION" > "$OUT.tmp/VERSION"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
say "built in $(( $(date +%s) - start )) s: $(du -sh "$OUT" | cut -f1) of binaries in $OUT"
# Older keys are other versions of go.mod or the mains: keep the three newest, remove the rest.
ls -1dt "$CACHE"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "$OUT"
