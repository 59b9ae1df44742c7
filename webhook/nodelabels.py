"""One node's gpuslice labels, and where known its status, read into the numbers the cluster view
aggregates. Pure; no I/O.

The labels are untrusted input: the device plugin on each node writes them, and a broken or
compromised node could publish a 20-digit GPU memory or a 192 GiB "H100" with 8 free GPUs that
would draw every pod. So every number must be ASCII digits within sane bounds, free counts may
not exceed totals, and where the node object carries kubelet's own count of the gpuslice memory
resource (status.capacity / status.allocatable, which the plugin cannot write) the labels must
agree with it. A node that fails is left out of the view (`Distrusted`, with a short reason code
for metrics and a sentence for the log); others are unaffected. A node whose plugin is gone
(its resource missing from allocatable, or 0) while its labels still say free keeps its class
but offers no free capacity: steering ignores it.

May import gpuslice.{contract,labelcodec} and the webhook's parsing module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice import labelcodec
from gpuslice.webhook import parsing

__all__ = ["Distrusted", "NodeGpus", "read"]

MIN_GPU_MEMORY_MIB = 1024  # 1 GiB: no GPU worth sharing has less
MAX_GPU_MEMORY_MIB = 1024 * 1024  # 1 TiB: none has more
MAX_GPUS_PER_NODE = 64

# Reason codes (metric label values): a bounded set.
MALFORMED = "malformed-label"
MEMORY_OUT_OF_RANGE = "memory-out-of-range"
COUNT_OUT_OF_RANGE = "count-out-of-range"
FREE_ABOVE_TOTAL = "free-above-total"
CAPACITY_MISMATCH = "capacity-mismatch"
PLUGIN_DOWN = "device-plugin-down"  # not distrusted: kept, but with nothing free


class Distrusted(ValueError):
    """The node's labels are not believable; `reason` is one of the codes above."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class NodeGpus:
    """What one node contributes to the aggregates (kept so a change can be subtracted)."""

    memory_mib: int | None  # None: no shared GPUs on the node
    product: str
    gpus: int
    free_units: int
    mig_memory: tuple[tuple[str, int], ...]  # (resource-form profile, MiB)
    free_block: int = 0  # largest free units on one GPU
    free_gpus: int = 0  # GPUs with every unit free
    free_cpu_milli: int = -1  # -1: the node publishes no headroom
    free_memory_mib: int = -1
    plugin_down: bool = False  # the labels say free, kubelet has nothing allocatable


def _number(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return labelcodec.read_count(labels, key)
    except labelcodec.Malformed as exc:
        raise Distrusted(MALFORMED, str(exc)) from None


def _units(status: Mapping[str, Any], field: str, resource: str) -> int | None:
    """Units of `resource` in status.<field>; None when absent or unreadable."""
    amounts = status.get(field)
    if not isinstance(amounts, Mapping) or resource not in amounts:
        return None
    return int(parsing.request_quantity(amounts[resource]))


def _memory_in_range(key: str, mib: int) -> None:
    if not MIN_GPU_MEMORY_MIB <= mib <= MAX_GPU_MEMORY_MIB:
        raise Distrusted(
            MEMORY_OUT_OF_RANGE,
            f"label {key}={mib} is outside {MIN_GPU_MEMORY_MIB}..{MAX_GPU_MEMORY_MIB} MiB (1 GiB..1 TiB)",
        )


def _mig(labels: Mapping[str, str], contract: contract_.Contract) -> tuple[tuple[str, int], ...]:
    try:
        memory = labelcodec.mig_memory_of(labels, contract)
    except labelcodec.Malformed as exc:
        raise Distrusted(MALFORMED, str(exc)) from None
    mig = []
    for profile, mib in memory.items():
        if mib:
            _memory_in_range(contract.label_mig_memory(profile), mib)
            mig.append((profile, mib))
    return tuple(sorted(mig))


def read(
    labels: Mapping[str, str], contract: contract_.Contract, *, status: Mapping[str, Any] | None = None
) -> NodeGpus | None:
    """The node's GPUs from its labels (None: no gpuslice GPU labels), checked against `status`
    (the node's status, with capacity and allocatable) when given; raises Distrusted."""
    c = contract
    memory = _number(labels, c.label_gpu_memory_mib)
    gpus = _number(labels, c.label_gpu_count) or 0
    if memory is not None and memory > 0:
        _memory_in_range(c.label_gpu_memory_mib, memory)
    if gpus > MAX_GPUS_PER_NODE:
        raise Distrusted(COUNT_OUT_OF_RANGE, f"label {c.label_gpu_count}={gpus} is above {MAX_GPUS_PER_NODE}")
    if memory is not None and (memory <= 0 or gpus <= 0):
        memory = None
    free = _number(labels, c.label_free_units)
    block = _number(labels, c.label_free_block_units)
    whole = _number(labels, c.label_free_gpus)
    cpu = _number(labels, c.label_free_cpu_milli)
    mem = _number(labels, c.label_free_memory_mib)
    mig = _mig(labels, contract)
    if memory is None and not mig:
        return None

    free_units = free_block = free_gpus = 0
    plugin_down = False
    if memory is not None:
        per_gpu = c.units_per_gpu(memory)
        if whole is not None and whole > gpus:
            raise Distrusted(FREE_ABOVE_TOTAL, f"label {c.label_free_gpus}={whole} is above {c.label_gpu_count}={gpus}")
        # The plugin takes the smallest GPU's memory for the label (a mixed node may have more units).
        capacity = gpus * per_gpu
        if isinstance(status, Mapping):
            capacity, plugin_down = _check_status(status, c, memory, gpus, per_gpu, free)
        # Without steering labels the plugin publishes no free counts: treat the node as empty.
        free_units = capacity if free is None else min(free, capacity)
        free_block = per_gpu if block is None else min(block, per_gpu, max(free_units, 0))
        free_gpus = gpus if whole is None else whole
        if plugin_down:
            free_units = free_block = free_gpus = 0
    return NodeGpus(
        memory_mib=memory,
        product=labels.get(c.label_gpu_product, "") if memory is not None else "",
        gpus=gpus if memory is not None else 0,
        free_units=free_units,
        mig_memory=mig,
        free_block=free_block,
        free_gpus=free_gpus,
        free_cpu_milli=-1 if cpu is None else cpu,
        free_memory_mib=-1 if mem is None else mem,
        plugin_down=plugin_down,
    )


def _check_status(
    status: Mapping[str, Any], c: contract_.Contract, memory: int, gpus: int, per_gpu: int, free: int | None
) -> tuple[int, bool]:
    """(units free counts are capped at, whether the plugin is down) from kubelet's counts."""
    resource = c.gpu_memory_resource
    capacity = _units(status, "capacity", resource)
    allocatable = _units(status, "allocatable", resource)
    if capacity:
        if capacity < gpus * per_gpu:
            raise Distrusted(
                CAPACITY_MISMATCH,
                f"labels say {gpus} GPUs of {memory} MiB ({gpus * per_gpu} units of {c.unit_mib} MiB), "
                f"but kubelet counts {capacity} units of {resource}",
            )
        if free is not None and free > capacity:
            raise Distrusted(
                FREE_ABOVE_TOTAL,
                f"label {c.label_free_units}={free} is above the node's {capacity} units of {resource}",
            )
    says_free = free is None or free > 0
    if not allocatable:
        return 0, says_free
    return allocatable, False
