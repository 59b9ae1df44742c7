# syntax=docker/dockerfile:1
# One image for both gpuslice components; the Helm chart picks the entry point per workload:
#   gpuslice-webhook        (Deployment, runs as the image's non-root user)
#   gpuslice-device-plugin  (DaemonSet, the chart runs it as root: kubelet's sockets and NVML need it)
# Build: docker build -t gpuslice:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: generate the gRPC stubs (grpcio-tools is a build-time tool only), install into a venv --
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m pip install --quiet "grpcio-tools>=1.60"
WORKDIR /src
COPY . .
RUN python proto/generate.py \
 && python -m venv /opt/gpuslice \
 && /opt/gpuslice/bin/pip install --quiet . \
 && /opt/gpuslice/bin/gpuslice-webhook --help >/dev/null \
 && /opt/gpuslice/bin/gpuslice-device-plugin --help >/dev/null

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
EXPOSE 8443 9400
CMD ["gpuslice-webhook", "--help"]
