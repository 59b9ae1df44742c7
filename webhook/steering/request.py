"""What the webhook converted a pod to, as the steering families read it: the request's identity
(its GPU need and the class it was pinned to) and, apart from it, the pod's CPU and memory, which
only the per-pod families read. Imports nothing of gpuslice."""

from __future__ import annotations

import dataclasses

__all__ = ["IDENTITY", "Request"]


@dataclasses.dataclass(frozen=True)
class Request:
    """What the webhook converted the pod to."""

    units: int = 0  # gpu-memory units per GPU (0 for MIG)
    gpus: int = 1  # >1 only for whole GPUs, and for MIG devices: how many of the profile
    whole_gpus: bool = False
    mig_profile: str | None = None  # resource-form profile for MIG isolation
    units_per_gpu: int = 0  # units of one GPU of the class the pod is pinned to (0: unknown)
    largest_node_gpus: int = 0  # GPUs of the largest node of the pod's class(es) (0: unknown)
    # The pod's CPU request (-1: not considered). Read by the CPU balance terms only, which are
    # built per pod; not part of the request's identity, so the cached terms are shared by pods
    # of any CPU request.
    cpu_milli: int = dataclasses.field(default=-1, compare=False)
    memory_mib: int = dataclasses.field(default=-1, compare=False)  # idem, read by the host fit term only
    cpu_per_gpu_milli: int = 0  # steering.cpuPerGpuMilli: CPU expected per GPU (0: no CPU balance terms)


# The fields that tell requests apart (`compare=True`): what the families whose terms are built
# once per distinct request may read (webhook/steering/__init__.py).
IDENTITY = frozenset(f.name for f in dataclasses.fields(Request) if f.compare)
