#!/usr/bin/env bash
# Builds, or finds already built, libnvidia-ml.so.1: the loadable NVML whose GPUs are go-nvml's mock
# DGX servers (main.go says what it answers and how a test sets processes, MIG and failures). Its C
# ABI is compiled against NVIDIA's own nvml.h from the PyPI wheel nvidia-nvml-dev (pinned below),
# fetched into a temporary directory with pip and never kept: it is NVIDIA's, under the NVIDIA CUDA
# Toolkit EULA (the wheel's License.txt), not ours to commit. The library is cached outside the clone,
# under $GPUSLICE_NVML_CACHE (default ~/.cache/gpuslice-nvml), keyed by the Go version, go.mod, go.sum,
# the sources, this script and the header's version. Progress goes to stderr; the last line on stdout is
# the directory holding libnvidia-ml.so.1 (point LD_LIBRARY_PATH at it).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export GOTOOLCHAIN=local GOFLAGS=-modcacherw CGO_ENABLED=1
NVML_DEV_VERSION=13.0.87 # nvml.h of CUDA 13.0, the CUDA of driver 580 (the measured H200's)
say() { echo "build-nvml: $*" >&2; }

command -v go >/dev/null || { say "go is not on PATH"; exit 3; }
CC=${CC:-gcc}
command -v "$CC" >/dev/null || { say "no C compiler ($CC) for cgo"; exit 3; }
PYTHON=${GPUSLICE_NVML_PYTHON:-}
if [ -z "$PYTHON" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi

SOURCES=$(cd "$HERE" && ls -1 *.go *.c | sort)
KEY=$( { go version; echo "nvidia-nvml-dev==$NVML_DEV_VERSION"; cat "$HERE/go.mod" "$HERE/go.sum" "$0";
         for f in $SOURCES; do echo "== $f"; cat "$HERE/$f"; done; } | sha256sum | cut -c1-16)
CACHE=${GPUSLICE_NVML_CACHE:-$HOME/.cache/gpuslice-nvml}
OUT=$CACHE/$KEY
if [ -f "$OUT/libnvidia-ml.so.1" ]; then
  say "cached: $OUT/libnvidia-ml.so.1"
  echo "$OUT"; exit 0
fi

start=$(date +%s)
mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/.work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

say "fetching nvml.h: nvidia-nvml-dev==$NVML_DEV_VERSION from PyPI (with $PYTHON -m pip)"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WORK/wheel" \
  "nvidia-nvml-dev==$NVML_DEV_VERSION" >&2 \
  || { say "pip could not download nvidia-nvml-dev==$NVML_DEV_VERSION"; exit 4; }
# The module is built from a copy, with the header in its include/ (main.go's #cgo CFLAGS): go-nvml's
# own cgo code keeps its own nvml.h, and no nvml.h lands in the clone.
mkdir -p "$WORK/src/include"
for f in go.mod go.sum $SOURCES; do cp "$HERE/$f" "$WORK/src/"; done
"$PYTHON" - "$WORK/wheel" "$WORK/src/include" <<'EOF'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("nvidia_nvml_dev-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    header = next(n for n in archive.namelist() if n.endswith("/include/nvml.h"))
    licence = next(n for n in archive.namelist() if n.endswith("License.txt"))
    pathlib.Path(sys.argv[2], "nvml.h").write_bytes(archive.read(header))
    first = archive.read(licence).decode(errors="replace").strip().splitlines()[0]
print(f"build-nvml: {wheel.name}: {header} (licence: {licence}, \"{first}\")", file=sys.stderr)
EOF

say "building libnvidia-ml.so.1 (go-nvml mock + cgo) into $OUT"
( cd "$WORK/src" && go mod download ) >&2
GO_NVML=$(cd "$WORK/src" && go list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)
# go-nvml's bindings reference every NVML function: bind those we do not define to a local stub
# (PROVIDE only defines a symbol that is referenced and not defined elsewhere)...
grep -ohE '\bnvml[A-Za-z0-9_]+[[:space:]]*\(' "$GO_NVML/pkg/nvml/nvml.h" "$WORK/src/include/nvml.h" \
  | sed -E 's/[[:space:]]*\($//' | sort -u \
  | awk '{print "PROVIDE(" $1 " = gpusliceNvmlMockNotFound);"}' > "$WORK/unresolved.ld"
# ...and export exactly the functions nvml_abi.c defines.
EXPORTS=$(grep -oE '^[A-Za-z].* \*?nvml[A-Za-z0-9_]+\(' "$HERE/nvml_abi.c" \
          | sed -E 's/.*[ *](nvml[A-Za-z0-9_]+)\($/\1/' | sort)
{ echo "{ global:"; for f in $EXPORTS; do echo "  $f;"; done; echo "  local: *; };"; } > "$WORK/exports.map"
mkdir -p "$WORK/out"
( cd "$WORK/src" && CGO_CFLAGS="-O2 -Wno-deprecated-declarations" \
    go build -trimpath -buildmode=c-shared \
      -ldflags "-s -w -extldflags '$WORK/unresolved.ld -Wl,--version-script=$WORK/exports.map'" \
      -o "$WORK/out/libnvidia-ml.so.1" . ) >&2
rm -f "$WORK"/out/*.h

# The library must load with RTLD_NOW (as ctypes loads it) and export exactly $EXPORTS.
undefined=$(nm -D --undefined-only "$WORK/out/libnvidia-ml.so.1" | awk '$2 ~ /^nvml/ {print $2}')
[ -z "$undefined" ] || { say "unresolved NVML symbols: $undefined"; exit 5; }
exported=$(nm -D --defined-only "$WORK/out/libnvidia-ml.so.1" | awk '$2 == "T" {print $3}' | sort)
[ "$exported" = "$EXPORTS" ] || { say "exported symbols differ from nvml_abi.c's:"; diff <(echo "$EXPORTS") <(echo "$exported") >&2; exit 5; }
echo "$EXPORTS" > "$WORK/out/EXPORTS"
echo "go-nvml $(cd "$WORK/src" && go list -m -f '{{.Version}}' github.com/NVIDIA/go-nvml), nvml.h from nvidia-nvml-dev==$NVML_DEV_VERSION, $(go version)" > "$WORK/out/VERSION"

rm -rf "$OUT"; mv "$WORK/out" "$OUT"
say "built in $(( $(date +%s) - start )) s: $(du -h "$OUT/libnvidia-ml.so.1" | cut -f1), $(echo "$EXPORTS" | wc -l) NVML functions, in $OUT"
# Older keys are other versions of the sources: keep the three newest, remove the rest.
ls -1dt "$CACHE"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "$OUT"
