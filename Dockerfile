# One image for every gpuslice component; the Helm chart picks the entry point per workload:
#   gpuslice-webhook        (Deployment, runs as the image's non-root user)
#   gpuslice-device-plugin  (DaemonSet, the chart runs it as root: kubelet's sockets and NVML need it)
#   gpuslice-mps-control-daemon (DaemonSet with config.mps.enabled: NVIDIA's MPS control daemon)
#   gpuslice-dra-plugin     (DaemonSet with mode dra or both: the kubelet DRA plugin)
#   gpuslice-controller     (Deployment in device-plugin mode, non-root, leader-elected: requeues refused
#                            pods and, with config.pacing.enabled, releases gated pods)
# Build: make image IMAGE=<registry>/gpuslice:0.1.0   (docker, podman or buildah; or `docker build -t ... .`)
# Where no registry is reachable, e2e/image/build.sh builds it with buildah on a Python base made from
# Debian packages (`make image BASE_IMAGE=localhost/python:3.11-slim-bookworm`) and writes a tar for ctr.
# Without a container engine, `make image-check` runs the same build steps in a throwaway venv.
#
# Everything that goes in is pinned: the base image by digest (a multi-arch index; to move it, take
# the digest `docker buildx imagetools inspect python:3.11-slim-bookworm` prints), the Python
# packages by requirements/*.txt with hashes (`make lock`), installed from wheels only.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# --- build: the runtime venv, made by tools/build-image-venv.py ----------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The build tools (grpcio-tools for the stubs, setuptools for the wheel) in their own layer.
COPY requirements/build.txt requirements/build.txt
RUN python -m pip install --quiet --require-hashes --no-deps --only-binary=:all: -r requirements/build.txt
COPY . .
# Stubs, wheel (less the tools: the simulator and the demo), a venv without pip from
# requirements/image.txt (hashes) and the wheel, pruned of what gpuslice never imports, checked to
# hold none of the tools or what only they import, every entry point started with --help.
RUN python tools/build-image-venv.py build --src /src --dest /opt/gpuslice

# --- runtime: the venv on the same base image, nothing else ----------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpuslice" \
      org.opencontainers.image.description="Fractional GPUs for the stock kube-scheduler: device plugin and mutating webhook" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpuslice /opt/gpuslice
# Bytecode was compiled at install time; the root filesystem is read-only in the pod.
ENV PATH=/opt/gpuslice/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric non-root user, so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
EXPOSE 8443 9400 9401
CMD ["gpuslice-webhook", "--help"]
