"""Whether pods that could all land on one node fit there together, whatever order kubelet admits
them in, by what the node's labels show free. Pure.

A share takes units of one GPU and a whole-GPU pod takes whole GPUs; kubelet refuses a pod whose
units no single GPU of the node can give. If the labels (current for every pod they count) show
F fully free GPUs, pods that touch at most F GPUs between them cannot be refused there, in any
order: when one is admitted, the others have touched fewer than F GPUs, so a free one is left.
Pods that each fit on one GPU also cannot be refused if their units together fit in the node's
largest free block (`gpu.free-block-units`): whichever GPU each is given, the GPU of that block
keeps room for the rest. That is what lets shares go together onto nodes whose GPUs are all in
use. Both rules are sufficient, not necessary: they let pods go together where nothing can go
wrong, and leave the rest to one at a time. MIG devices are counted like whole GPUs, against the
node's free devices of each profile.

May import gpuslice.{contract,labelcodec} only.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping

from gpuslice import contract as contract_
from gpuslice import labelcodec

__all__ = ["fit_together", "touches"]

GPUS = "gpus"  # the key of whole GPUs touched, beside MIG resources by name


def touches(
    demand: Mapping[str, int], allocatable: Mapping[str, int], labels: Mapping[str, str], contract: contract_.Contract
) -> dict[str, int]:
    """What a pod's `demand` (pacer.ledger.pod_demand) takes of the node's capacity: GPUs touched
    (a share one, N whole GPUs N), and MIG devices per resource."""
    touched: dict[str, int] = {}
    for resource, count in demand.items():
        if resource == contract.gpu_memory_resource:
            per_gpu = _units_per_gpu(allocatable.get(resource, 0), labels, contract)
            touched[GPUS] = touched.get(GPUS, 0) + (-(-count // per_gpu) if per_gpu else 1)
        else:
            touched[resource] = touched.get(resource, 0) + count
    return touched


def fit_together(
    demands: Iterable[Mapping[str, int]],
    allocatable: Mapping[str, int],
    labels: Mapping[str, str],
    contract: contract_.Contract,
) -> bool:
    """Whether pods with these demands can all be admitted on the node in any order, by its labels."""
    total: collections.Counter[str] = collections.Counter()
    units, one_gpu_each = 0, True
    for demand in demands:
        touched = touches(demand, allocatable, labels, contract)
        total.update(touched)
        units += demand.get(contract.gpu_memory_resource, 0)
        one_gpu_each = one_gpu_each and touched.get(GPUS, 0) <= 1
    for key, count in total.items():
        if count <= _free(key, labels, contract):
            continue
        if key == GPUS and one_gpu_each and units <= _count(labels, contract.label_free_block_units):
            continue  # every one fits beside the others in the largest free block
        return False
    return True


def _units_per_gpu(units: int, labels: Mapping[str, str], contract: contract_.Contract) -> int:
    count = _count(labels, contract.label_gpu_count)
    return units // count if count else 0


def _free(key: str, labels: Mapping[str, str], contract: contract_.Contract) -> int:
    label = contract.label_free_gpus if key == GPUS else contract.free_label_of_resource(key)
    return _count(labels, label) if label else 0


def _count(labels: Mapping[str, str], key: str) -> int:
    """The label's count; 0 when it is missing or malformed (nothing is free by a label not believed)."""
    try:
        return labelcodec.read_count(labels, key) or 0
    except labelcodec.Malformed:
        return 0
