"""What a container gets from Allocate: a ContainerAllocateResponse built from an allocation
grant and the configuration. Pure: no gRPC calls, no I/O.

* the GPU itself: `NVIDIA_VISIBLE_DEVICES=<GPU or MIG UUIDs>` (deviceListStrategy envvar) or
  one CDI device `<cdiKind>=<uuid>` per GPU (cdi-cri);
* its size, so applications can size themselves: GPUSLICE_MEMORY_LIMIT_MIB (per GPU),
  GPUSLICE_GPU_FRACTION, GPUSLICE_GPU_COUNT and KAI's GPU_PORTION;
* with MPS enabled (memory units only; MPS does not run on MIG devices): a per-pod limit,
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<ordinal>=<MiB>M for each GPU the container sees and
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in proportion to the share, plus the MPS pipe directory and
  the daemon's shared /dev/shm mounted. NVIDIA's plugin can only give every MPS client the same
  daemon-wide default (total / replicas). The limit is keyed by device ordinal, as CUDA numbers
  the devices the container sees (0 for a share), not by UUID: NVIDIA's plugin moved its MPS
  limits from UUIDs to indices because UUID-keyed limits were not applied (its v0.15.0 notes);
  every GPU of one grant has the same limit, so the order CUDA enumerates them in does not matter.

Names come from gpuslice.contract. May import gpuslice.{contract,config}, the generated
v1beta1 messages and gpuslice.node.allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice import config as config_
from gpuslice import contract
from gpuslice.node import allocation
from gpuslice.proto.deviceplugin.v1beta1 import api_pb2

__all__ = ["format_fraction", "memory_response", "mig_response"]


def format_fraction(fraction: float) -> str:
    """0.5 -> "0.5", 1.0 -> "1", 0.333333 -> "0.3333": short, and never more than granted."""
    text = f"{int(fraction * 10_000) / 10_000:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def _device_list(uuids: Sequence[str], settings: config_.Config) -> api_pb2.ContainerAllocateResponse:
    response = api_pb2.ContainerAllocateResponse()
    if settings.device_list_strategy == "cdi-cri":
        response.cdi_devices.extend(api_pb2.CDIDevice(name=f"{settings.cdi_kind}={uuid}") for uuid in uuids)
    else:
        response.envs[contract.ENV_VISIBLE_DEVICES] = ",".join(uuids)
    return response


def memory_response(grant: allocation.MemoryGrant, settings: config_.Config) -> api_pb2.ContainerAllocateResponse:
    """The container's view of a set of gpu-memory units (one GPU's share, or whole GPUs)."""
    response = _device_list(grant.gpu_uuids, settings)
    fraction = format_fraction(grant.fraction)
    envs = response.envs
    envs[contract.ENV_MEMORY_LIMIT_MIB] = str(grant.memory_mib)
    envs[contract.ENV_GPU_FRACTION] = fraction
    envs[contract.ENV_GPU_COUNT] = str(len(grant.gpu_uuids))
    envs[contract.ENV_KAI_GPU_PORTION] = fraction
    if settings.mps.enabled:
        envs[contract.ENV_MPS_PINNED_MEM_LIMIT] = ",".join(
            f"{ordinal}={grant.memory_mib}M" for ordinal in range(len(grant.gpu_uuids))
        )
        envs[contract.ENV_MPS_THREAD_PERCENTAGE] = str(max(1, min(100, round(grant.fraction * 100))))
        envs[contract.ENV_MPS_PIPE_DIRECTORY] = settings.mps.container_pipe_directory
        response.mounts.append(
            api_pb2.Mount(
                container_path=settings.mps.container_pipe_directory,
                host_path=settings.mps.pipe_directory,
                read_only=False,  # MPS clients write to the control pipe
            )
        )
        # MPS clients and the server exchange shared-memory segments: the container's /dev/shm
        # must be the daemon's, not the pod's own.
        response.mounts.append(
            api_pb2.Mount(container_path="/dev/shm", host_path=settings.mps.shm_directory, read_only=False)
        )
    return response


def mig_response(grant: allocation.MigGrant, settings: config_.Config) -> api_pb2.ContainerAllocateResponse:
    """The container's view of MIG devices: the slices themselves, at their memory size."""
    response = _device_list(grant.mig_uuids, settings)
    envs = response.envs
    envs[contract.ENV_MEMORY_LIMIT_MIB] = str(grant.memory_mib)
    envs[contract.ENV_GPU_COUNT] = str(len(grant.mig_uuids))
    return response
