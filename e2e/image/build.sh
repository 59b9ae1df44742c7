#!/usr/bin/env bash
# Builds, or finds already built, the gpuslice image of THIS checkout without a registry or a daemon:
# `make image` with buildah on the Python base that build-base.sh makes from Debian packages, the
# Dockerfile unchanged, and writes it as a docker-archive tar that `ctr -n k8s.io images import` reads.
#
#   bash e2e/image/build.sh            # last stdout line: the tar; progress on stderr
#
# The context is what git sees in the working tree less .dockerignore (context.py), copied out first so
# that stray local files stay out; the tar is cached as $GPUSLICE_IMAGE_CACHE/gpuslice-<key>.tar (default
# ~/.cache/gpuslice-image), key = that context's content, the base tar's key, the tag and this script:
# an unchanged tree builds nothing. The two newest image tars are kept. gpuslice-<key>.txt beside it
# records the build time and sizes.
#
# buildah keeps its storage in $GPUSLICE_IMAGE_CACHE/buildah (root and runroot, overlay driver), private
# to these scripts; its layer cache makes a rebuild skip the base and the build tools. The image's user
# (65532) and its five entry points are started in a working container before the tar is written; no
# working container and no overlay mount is left behind.
#
# Environment: GPUSLICE_IMAGE_TAG (default localhost/gpuslice:dev); GPUSLICE_IMAGE_CA, a CA bundle
# mounted over the image's in RUN steps so that pip trusts a TLS-intercepting proxy (default
# /etc/ssl/certs/ca-certificates.crt when it exists; empty: none); GPUSLICE_IMAGE_BUILD_FLAGS, more
# flags for `buildah bud`. Needs root, buildah, runc, make, git, python3 and, for a cold base,
# debootstrap, umoci and skopeo; the build downloads the locked wheels from PyPI (2-5 min).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TAG=${GPUSLICE_IMAGE_TAG:-localhost/gpuslice:dev}
export GPUSLICE_IMAGE_CACHE=${GPUSLICE_IMAGE_CACHE:-$HOME/.cache/gpuslice-image}
CACHE=$GPUSLICE_IMAGE_CACHE
if [ -z "${GPUSLICE_IMAGE_CA+set}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  GPUSLICE_IMAGE_CA=/etc/ssl/certs/ca-certificates.crt
fi
CA=${GPUSLICE_IMAGE_CA:-}
EXTRA_FLAGS=${GPUSLICE_IMAGE_BUILD_FLAGS:-}
ENTRY_POINTS="gpuslice-webhook gpuslice-device-plugin gpuslice-mps-control-daemon gpuslice-dra-plugin gpuslice-controller"
IMAGE_UID=65532

# Everything but the answer goes to stderr; fd 3 is the caller's stdout.
exec 3>&1 1>&2
say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 3; }

missing=()
for tool in buildah runc make git python3 flock setsid sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || die "missing: ${missing[*]} (Debian: apt-get install buildah runc make git python3)"
[ "$(id -u)" -eq 0 ] || die "must run as root: buildah's overlay storage and runc isolation need it here"
[ -z "$CA" ] || [ -f "$CA" ] || die "GPUSLICE_IMAGE_CA=$CA is not a file"

mkdir -p "$CACHE/buildah"
CACHE=$(cd "$CACHE" && pwd)
GPUSLICE_IMAGE_CACHE=$CACHE
# One build at a time per cache (the buildah storage and the tars are shared); a second caller waits.
exec 9>"$CACHE/.image.lock"
flock 9

STORE=$CACHE/buildah
export CONTAINERS_STORAGE_CONF=$STORE/storage.conf
cat > "$CONTAINERS_STORAGE_CONF" <<EOF
# Written by e2e/image/build.sh: buildah's storage private to the gpuslice image scripts.
[storage]
driver = "overlay"
graphroot = "$STORE/root"
runroot = "$STORE/run"
EOF

STAGE=$(mktemp -d "$CACHE/context.XXXXXX")
cleanup() {
  local rc=$?
  # Working containers first, then whatever buildah left mounted in its storage (it keeps its overlay
  # directory bind-mounted on itself), deepest first.
  buildah rm --all >/dev/null 2>&1 || say "buildah rm --all failed"
  awk -v s="$STORE/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r | while read -r mnt; do
    umount "$mnt" 2>/dev/null || umount -l "$mnt" || say "could not unmount $mnt"
  done
  rm -rf --one-file-system "$STAGE" "${TAR:-$STAGE}.tmp"
  exit "$rc"
}
trap cleanup EXIT
source "$(dirname "${BASH_SOURCE[0]}")/interruptible.sh"

in_background bash "$HERE/build-base.sh" > "$STAGE/base-tar" || die "no Python base image (build-base.sh, above)"
BASE_TAR=$(tail -n 1 "$STAGE/base-tar")
[ -s "$BASE_TAR" ] || die "build-base.sh gave no base tar"
BASE_NAME=$(tar -xOf "$BASE_TAR" manifest.json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["RepoTags"][0])')

CONTEXT_KEY=$(python3 "$HERE/context.py" "$REPO" --stage "$STAGE/src")
KEY=$( { echo "$CONTEXT_KEY"; basename "$BASE_TAR"; echo "$TAG"; echo "$EXTRA_FLAGS"; cat "$0"; } | sha256sum | cut -c1-16)
TAR=$CACHE/gpuslice-$KEY.tar
INFO=$CACHE/gpuslice-$KEY.txt
if [ -s "$TAR" ]; then
  touch "$TAR" "$INFO"
  say "cached: $TAG of this tree in $TAR ($(tr '\n' ' ' < "$INFO" 2>/dev/null))"
  echo "$TAR" >&3
  exit 0
fi

need_kb=$((3 * 1024 * 1024))
avail_kb=$(df -Pk "$CACHE" | awk 'NR==2{print $4}')
[ "$avail_kb" -ge "$need_kb" ] || die "only $((avail_kb / 1024)) MiB free under $CACHE; the build needs about 3 GiB"

# buildah's layer cache grows by a few hundred MB a build: past GPUSLICE_IMAGE_STORE_MAX_MB (default 4096)
# it starts again from nothing.
store_mb=$(du -sm --one-file-system "$STORE" | cut -f1)
if [ "$store_mb" -gt "${GPUSLICE_IMAGE_STORE_MAX_MB:-4096}" ]; then
  say "buildah storage holds $store_mb MiB: removing its images and layer cache"
  buildah rmi --all --force >/dev/null
fi
say "building $TAG from $REPO (context $(echo "$CONTEXT_KEY" | cut -c1-16)) on $BASE_NAME into $TAR"
start=$(date +%s)
buildah pull --quiet "docker-archive:$BASE_TAR" >/dev/null
FLAGS="--layers --pull=never --network host --isolation oci"
[ -z "$CA" ] || FLAGS="$FLAGS -v $CA:/etc/ssl/certs/ca-certificates.crt:ro"
[ -z "$EXTRA_FLAGS" ] || FLAGS="$FLAGS $EXTRA_FLAGS"
# The Makefile's own target, run in the staged copy of the context.
in_background make -s -C "$STAGE/src" image ENGINE=buildah IMAGE="$TAG" BASE_IMAGE="$BASE_NAME" IMAGE_BUILD_FLAGS="$FLAGS" >&2 \
  || die "make image failed (the buildah output above says where)"
built=$(date +%s)

# The image's user and its entry points, in a working container of the image as it will run.
user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$TAG")
[ "${user%%:*}" = "$IMAGE_UID" ] || die "the image's user is '$user', not $IMAGE_UID"
ctr=$(buildah from --pull=never --quiet "$TAG")
ids=$(buildah run --isolation oci --network none "$ctr" -- sh -c \
  'echo "$(id -u):$(id -g)"; for e in '"$ENTRY_POINTS"'; do "$e" --help >/dev/null || { echo "$e --help failed" >&2; exit 1; }; done') \
  || die "an entry point did not start in the image (above)"
buildah rm "$ctr" >/dev/null
[ "$ids" = "$IMAGE_UID:$IMAGE_UID" ] || die "processes in the image run as $ids, not $IMAGE_UID:$IMAGE_UID"
checked=$(date +%s)

buildah push --quiet "$TAG" "docker-archive:$TAR.tmp:$TAG"
image_size=$(buildah images --format '{{.Size}}' "$TAG" | head -n 1)
tar_mib=$(( $(stat -c %s "$TAR.tmp") / 1024 / 1024 ))
{
  echo "tag=$TAG"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  changes=$(git -C "$REPO" status --porcelain 2>/dev/null || true)
  echo "commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none)${changes:+ with local changes}"
  echo "base=$(basename "$BASE_TAR")"
  echo "build_s=$(( built - start ))"
  echo "check_s=$(( checked - built ))"
  echo "image_size=$image_size"
  echo "tar_mib=$tar_mib"
} > "$INFO"
mv "$TAR.tmp" "$TAR"
say "built $TAG in $(( built - start )) s (entry points checked as $ids in $(( checked - built )) s):" \
  "image $image_size, tar $tar_mib MiB, buildah storage $(du -sh --one-file-system "$STORE" | cut -f1)"
# Keep the two newest image tars (and their records).
ls -1t "$CACHE"/gpuslice-*.tar 2>/dev/null | tail -n +3 | while read -r old; do rm -f "$old" "${old%.tar}.txt"; done
echo "$TAR" >&3
