"""DRA mode of the replay on the real control plane (`gpuslice-sim --scheduler kube --mode dra`).

What the chart and the DRA plugin put in a DRA-mode cluster, for the trace's nodes: the DeviceClasses
of whole GPUs and of shares (as charts/gpuslice/templates/dra-plugin.yaml renders them), every node's
ResourceSlices (`dra.slices.build_slices`, what the plugin publishes), and the webhook in DRA mode
making a ResourceClaimTemplate per distinct share; kube-controller-manager's resource-claim
controller makes each pod's claim and the real scheduler's DRA allocator places it.

What a pod was granted is read back from its claims' allocation (consumed memory per device), so
the figure is what the allocator gave, not what the pod asked. Nothing on the node can refuse a
pod whose claims are allocated: the allocator has already put every share on one device within
its capacity. Each allocation is still checked against the device's capacity; an overrun would be
reported as an error, never credited.

May import gpuslice.{config,contract}, gpuslice.node.inventory, gpuslice.dra.slices,
gpuslice.sim.node (its GpuShare) and gpuslice.quantity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice import quantity as quantity_
from gpuslice.dra import slices
from gpuslice.node import inventory
from gpuslice.sim import node as node_

__all__ = ["DRA_CONTROLLERS", "DeviceLedger", "device_classes", "memory_mib", "node_slices"]

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
DEVICE_CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"
# Claims from the webhook's templates are made by this controller of kube-controller-manager.
DRA_CONTROLLERS = ("resource-claim-controller",)


def device_classes(contract: contract_.Contract) -> list[dict[str, Any]]:
    """The chart's DeviceClasses of whole GPUs and of shares (the trace has no MIG devices)."""
    attributes = f'device.attributes["{contract.dra_driver}"]'
    expression = f'device.driver == "{contract.dra_driver}" && {attributes}.type == "{contract_.DRA_TYPE_GPU}"'
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": contract.dra_device_class},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": contract.dra_share_device_class},
            "spec": {},
        },
    ]


def node_slices(node: inventory.NodeInventory, contract: contract_.Contract, node_name: str) -> list[dict[str, Any]]:
    """The ResourceSlices the DRA plugin publishes for this node (empty for a node without GPUs)."""
    if not node.gpus:
        return []
    return slices.build_slices(node, contract, node_name)


def memory_mib(quantity: Any) -> float:
    """A memory quantity ('40960Mi', '40Gi', '1073741824') in MiB; ValueError when it is not one."""
    return float(quantity_.parse(quantity)) / quantity_.MIB


class DeviceLedger:
    """Per node, each shared device's memory and what allocations consumed of it."""

    def __init__(self, contract: contract_.Contract) -> None:
        self.driver = contract.dra_driver
        self.memory = contract.dra_capacity_memory
        self.capacity: dict[tuple[str, str], float] = {}  # (pool, device) -> MiB
        self.consumed: dict[tuple[str, str], float] = {}
        self.overruns: list[str] = []

    def add_slices(self, objects: Iterable[Mapping[str, Any]]) -> None:
        for obj in objects:
            spec = obj["spec"]
            pool = spec["pool"]["name"]
            for device in spec.get("devices") or ():
                memory = (device.get("capacity") or {}).get(self.memory)
                if memory is not None:
                    self.capacity[(pool, device["name"])] = memory_mib(memory["value"])

    def grant(self, claim: Mapping[str, Any]) -> tuple[str, float, list[node_.GpuShare]]:
        """(node, GPUs' worth of memory, per device what it holds) of one allocated claim: each
        result's consumed memory over its device's memory, each device never counted past whole.
        A share is in MiB (unit_mib 1), named by the device. ValueError when not allocated."""
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ValueError("claim not allocated")
        granted = 0.0
        shares = []
        pools = set()
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") != self.driver:
                continue
            key = (result["pool"], result["device"])
            pools.add(result["pool"])
            capacity = self.capacity.get(key)
            if capacity is None:
                self.overruns.append(f"claim allocated an unknown device {key}")
                continue
            consumed = (result.get("consumedCapacity") or {}).get(self.memory)
            amount = memory_mib(consumed) if consumed is not None else capacity
            before = self.consumed.get(key, 0.0)
            after = before + amount
            self.consumed[key] = after
            if after > capacity + 1e-6:
                self.overruns.append(f"device {key}: {after:.0f} MiB allocated of {capacity:.0f}")
            granted += (min(after, capacity) - min(before, capacity)) / capacity
            mib = round(capacity)
            shares.append(node_.GpuShare(result["device"], round(amount), mib, 1, mib))
        return (next(iter(pools)) if len(pools) == 1 else ",".join(sorted(pools))), granted, shares
