"""From a ResourceClaim's allocation to what its containers get. Pure: no I/O.

The scheduler's allocator writes, for every device it gave the claim,
`status.allocation.devices.results[] = {request, driver, pool, device, shareID, consumedCapacity}`.
`allocated_shares` keeps the results of this driver on this node's pool and checks each against
the inventory; `grants` turns them into the same MemoryGrant/MigGrant the device plugin's
Allocate builds, so a container sees the same environment in both modes; `overcommitted` is the
plugin's own last check that the shares prepared on one GPU never exceed it.

May import gpuslice.contract, gpuslice.node.{allocation,inventory}, gpuslice.dra.slices
(device names) and gpuslice.quantity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice import quantity
from gpuslice.dra import slices
from gpuslice.node import allocation, inventory

__all__ = ["Share", "ShareError", "allocated_shares", "base_request", "grants", "overcommitted"]


class ShareError(ValueError):
    """The claim cannot be prepared on this node; the message says why (it reaches pod events)."""


@dataclasses.dataclass(frozen=True)
class Share:
    """One device of this driver allocated to a claim on this node."""

    request: str  # the claim's request (its base name, without a firstAvailable subrequest)
    device: str  # DRA device name, e.g. "gpu-0"
    share_id: str | None  # set by the scheduler when the device is allocated more than once
    uuid: str  # GPU or MIG UUID
    gpu_uuid: str  # the physical GPU (the parent of a MIG device)
    memory_mib: int  # memory this share holds
    mig_profile: str | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig_profile is not None


def base_request(name: str) -> str:
    """'gpu/share' (a firstAvailable subrequest) -> 'gpu': containers reference the request itself."""
    return name.split("/", 1)[0]


def _devices_by_name(node: inventory.NodeInventory) -> dict[str, tuple[inventory.Gpu, inventory.MigDevice | None]]:
    named: dict[str, tuple[inventory.Gpu, inventory.MigDevice | None]] = {}
    for gpu in node.gpus:
        if gpu.mig_enabled:
            for position, mig in enumerate(gpu.mig):
                named[slices.mig_device_name(gpu, position)] = (gpu, mig)
        else:
            named[slices.device_name(gpu)] = (gpu, None)
    return named


def _memory_mib(consumed: Mapping[str, Any] | None, full_mib: int, where: str, name: str) -> int:
    """The share's memory from the allocation's consumedCapacity[`name`]; under plain `memory` for
    a claim allocated before the capacity was qualified by the driver's domain."""
    value = (consumed or {}).get(name, (consumed or {}).get(contract_.DRA_CAPACITY_MEMORY))
    if value is None:
        return full_mib  # no consumed capacity recorded: the device is the claim's alone
    try:
        mib = quantity.mib_down(quantity.parse(value))
    except quantity.QuantityError:
        raise ShareError(f"{where}: consumedCapacity.memory {value!r} is not a quantity") from None
    if mib <= 0:
        raise ShareError(f"{where}: consumedCapacity.memory {value!r} is less than 1 MiB")
    return mib


def allocated_shares(
    claim: Mapping[str, Any], node: inventory.NodeInventory, contract: contract_.Contract, pool: str
) -> list[Share]:
    """The shares of this driver on `pool` in the claim's allocation (ShareError when the claim is
    not allocated, or names a device this node does not have)."""
    metadata = claim.get("metadata") or {}
    where = f"ResourceClaim {metadata.get('namespace')}/{metadata.get('name')}"
    allocation_ = (claim.get("status") or {}).get("allocation")
    if not allocation_:
        raise ShareError(f"{where} is not allocated")
    results = (allocation_.get("devices") or {}).get("results") or ()
    driver = contract.dra_driver
    named = _devices_by_name(node)
    shares = []
    for result in results:
        if result.get("driver") != driver or result.get("pool") != pool:
            continue  # another driver's device, or another node's
        name = str(result.get("device"))
        if name not in named:
            raise ShareError(
                f"{where}: device {name!r} of pool {pool!r} is not on this node (known: {', '.join(named)})"
            )
        gpu, mig = named[name]
        request = base_request(str(result.get("request", "")))
        if mig is not None:
            shares.append(Share(request, name, result.get("shareID"), mig.uuid, gpu.uuid, mig.memory_mib, mig.profile))
            continue
        whole = contract.units_per_gpu(gpu.memory_mib) * contract.unit_mib
        mib = _memory_mib(result.get("consumedCapacity"), whole, f"{where} device {name}", contract.dra_capacity_memory)
        shares.append(Share(request, name, result.get("shareID"), gpu.uuid, gpu.uuid, mib))
    if not shares:
        raise ShareError(f"{where} has no device of driver {driver} on node pool {pool!r}")
    return shares


def grants(
    shares: Iterable[Share], node: inventory.NodeInventory, contract: contract_.Contract
) -> dict[str, allocation.MemoryGrant | allocation.MigGrant]:
    """Request name -> what its containers get: the request's GPUs with the memory of its smallest
    share (a share of one GPU, or whole GPUs), or its MIG devices."""
    by_request: dict[str, list[Share]] = {}
    for share in shares:
        by_request.setdefault(share.request, []).append(share)
    result: dict[str, allocation.MemoryGrant | allocation.MigGrant] = {}
    for request, group in by_request.items():
        migs = [s for s in group if s.is_mig]
        if migs:
            if len(migs) != len(group):
                raise ShareError(f"request {request!r} mixes MIG devices and shared GPUs; use two requests")
            result[request] = allocation.MigGrant(
                mig_uuids=tuple(s.uuid for s in migs),
                profile=migs[0].mig_profile or "",
                memory_mib=min(s.memory_mib for s in migs),
                parent_uuids=tuple(s.gpu_uuid for s in migs),
            )
            continue
        memory = min(s.memory_mib for s in group)
        per_gpu = min(contract.units_per_gpu(node.gpu(s.gpu_uuid).memory_mib) for s in group)
        units = memory // contract.unit_mib
        result[request] = allocation.MemoryGrant(
            gpu_uuids=tuple(s.uuid for s in group),
            units=units,
            memory_mib=memory,
            fraction=min(1.0, units / per_gpu) if per_gpu else 1.0,
        )
    return result


def overcommitted(
    prepared: Iterable[Share], new: Iterable[Share], node: inventory.NodeInventory, contract: contract_.Contract
) -> str | None:
    """Why preparing `new` beside the already `prepared` shares would give a GPU more than it has
    (None when it fits). The scheduler guarantees this; the plugin checks it anyway, so a stale
    share (its claim released but not yet unprepared) delays a new one instead of overlapping it."""
    used: dict[str, int] = {}
    exclusive: set[str] = set()
    for share in prepared:
        used[share.uuid] = used.get(share.uuid, 0) + share.memory_mib
        if share.is_mig:
            exclusive.add(share.uuid)
    for share in new:
        if share.is_mig:
            if share.uuid in exclusive:
                return f"MIG device {share.device} ({share.uuid}) is already prepared for another claim"
            exclusive.add(share.uuid)
            continue
        capacity = contract.units_per_gpu(node.gpu(share.uuid).memory_mib) * contract.unit_mib
        total = used.get(share.uuid, 0) + share.memory_mib
        if total > capacity:
            return (
                f"GPU {share.device} ({share.uuid}) would hold {total} MiB of shares, more than its "
                f"{capacity} MiB; waiting for earlier claims on it to be unprepared"
            )
        used[share.uuid] = total
    return None
