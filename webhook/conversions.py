"""What the webhook decided for one pod, before it becomes a patch (device-plugin mode) or a
ResourceClaim (DRA mode): the conversion kind, the resource and units per container, the GPU-class
pin, the steering request and the decision notes. Also the one rounding rule for a share of a GPU,
which the simulator uses too. Pure.

May import the webhook's steering module (for its Request) only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gpuslice.webhook import steering

__all__ = [
    "KIND_CPU_POD",
    "KIND_FRACTION",
    "KIND_MEMORY",
    "KIND_MIG",
    "KIND_WHOLE_GPUS",
    "Conversion",
    "fraction_units",
]

# Conversion kinds: Outcome.kind and the metrics' label.
KIND_MEMORY = "gpu-memory"
KIND_FRACTION = "gpu-fraction"
KIND_WHOLE_GPUS = "whole-gpus"
KIND_MIG = "mig"
KIND_CPU_POD = "cpu-pod"  # no conversion: a pod that asks for no device, given steering preferences


@dataclasses.dataclass
class Conversion:
    """Collected while converting one pod; turned into patch ops (webhook/patches.py) or a claim
    (webhook/dra_claims.py) at the end."""

    kind: str
    resource: str
    container_units: dict[tuple[str, int], int]  # (field, index) -> units of `resource`
    decision: dict[str, Any]
    required: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # GPU-class pin expressions
    steering_request: steering.Request | None = None
    # Other systems' resource names the converted container loses besides nvidia.com/gpu
    # (webhook/foreign.py: nvidia.com/mig-<profile>, HAMi's).
    replaces: tuple[str, ...] = ()
    # A share on this many distinct GPUs (gpu-fraction-num-devices, DRA mode only): container_units
    # are then the units of each GPU's share, the decision's `units` their sum.
    devices: int = 1
    # DRA mode, a fraction of one GPU by a pod without a controller: the other GPU classes it may
    # take instead of its own, in order, as (class memory MiB, units of that class's GPU): its
    # claim's prioritized list (webhook/dra_claims.py). Empty: the pod is pinned to its class.
    other_classes: tuple[tuple[int, int], ...] = ()


def fraction_units(fraction: float, units_per_gpu: int) -> int:
    """Units for a share of one GPU: rounded down (at least one), so shares that add up to one
    GPU always fit on it (five pods of 0.2 share one GPU); a share of 1 is the whole GPU."""
    if fraction >= 1:
        return units_per_gpu
    return max(1, math.floor(fraction * units_per_gpu + 1e-9))
