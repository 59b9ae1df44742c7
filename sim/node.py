"""One simulated GPU node's kubelet and device plugin, without gRPC: kubelet's device manager record
(gpuslice.sim.devicemanager) asks the plugin's real allocation policy (gpuslice.node.allocation)
for its preferred devices, falls back as kubelet does, and calls the real Allocate check; a rejection
is a kubelet admission failure. The node's labels come from the plugin's own label functions.

Used by the replay; the demo goes through real gRPC instead (sim/kubelet.py and the plugin's servers).
May import gpuslice.contract, gpuslice.deviceplugin (allocation, inventory, labels) and gpuslice.sim.devicemanager.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

from gpuslice import contract as contract_
from gpuslice.node import allocation, inventory, labels
from gpuslice.sim import devicemanager

__all__ = ["AdmissionFailure", "GpuShare", "Grant", "SimNode"]


class AdmissionFailure(Exception):
    """The pod passed the scheduler but kubelet refused it (devicesToAllocate or Allocate failed)."""


@dataclasses.dataclass(frozen=True)
class GpuShare:
    """What one grant holds of one physical GPU, in the plugin's own units: enough to recompute
    the granted share (units x unit_mib / gpu_memory_mib) without knowing the device-ID format."""

    uuid: str  # the physical GPU (a MIG device's parent)
    units: int  # devices of this grant on that GPU
    total_units: int  # devices of that kind the GPU has in all
    unit_mib: int  # GPU memory per device (a whole nvidia.com/gpu device: the GPU's memory)
    gpu_memory_mib: int

    @property
    def share(self) -> float:
        """Share of the GPU's memory granted, 0..1."""
        return min(1.0, self.units * self.unit_mib / self.gpu_memory_mib) if self.gpu_memory_mib else 0.0

    def to_json(self) -> dict[str, int | str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Grant:
    container: str
    resource: str
    device_ids: tuple[str, ...]
    gpu_uuids: tuple[str, ...]
    memory_mib: int  # per GPU (or MIG device); 0 for whole nvidia.com/gpu devices
    shares: tuple[GpuShare, ...] = ()  # per physical GPU


class SimNode:
    """Kubelet's device manager plus the device plugin's policy for one node.

    `sharing` True: the gpuslice plugin (memory units and MIG slices). False: NVIDIA's plugin
    advertising whole `nvidia.com/gpu` devices (the `whole-gpu` comparison), where any free GPU will do.
    """

    def __init__(
        self,
        name: str,
        node: inventory.NodeInventory,
        contract: contract_.Contract,
        *,
        sharing: bool,
        cpu_per_gpu_milli: int = 0,
    ) -> None:
        self.name = name
        self.cpu_per_gpu_milli = cpu_per_gpu_milli  # steering.cpuPerGpuMilli: the CPU balance labels
        self.node = node
        self.contract = contract
        self.sharing = sharing
        self.memory = allocation.MemoryUnits(node, contract.unit_mib) if sharing else None
        self.mig = (
            {contract.mig_resource(p): allocation.MigSlices(node, p) for p in node.mig_profiles()} if sharing else {}
        )
        self._devices: dict[str, devicemanager.ResourceDevices] = {}
        self.units_in_use: dict[str, int] = {}  # GPU UUID -> memory units held
        self.whole_in_use: set[str] = set()  # GPU UUIDs held as nvidia.com/gpu devices
        self.mig_in_use: set[str] = set()
        self._gpu_mib = {g.uuid: g.memory_mib for g in node.gpus}
        self._slices_on = collections.Counter(
            (contract.mig_resource(m.profile), m.parent_uuid) for m in node.mig_devices()
        )
        self.granted_share: dict[str, float] = {}  # GPU UUID -> share of its memory granted, 0..1

    # --- what the node advertises -------------------------------------------------------

    def allocatable(self) -> dict[str, int]:
        """Extended resources kubelet reports in the node's allocatable."""
        if not self.sharing:
            return {contract_.NVIDIA_GPU: len(self.node.gpus)} if self.node.gpus else {}
        amounts = {}
        if self.memory is not None and self.memory.device_ids:
            amounts[self.contract.gpu_memory_resource] = len(self.memory.device_ids)
        for resource, slices in self.mig.items():
            amounts[resource] = len(slices.device_ids)
        return amounts

    def labels(self, *, steering: bool, headroom: tuple[int, int] | None = None) -> dict[str, str]:
        """The gpuslice labels the plugin would publish now (static ones only without steering);
        `headroom`: the node's unrequested (CPU millicores, memory MiB), as its labeller sees it."""
        if not self.node.gpus:
            return {}
        if not steering or not self.sharing:
            return labels.static_labels(self.node, self.contract)
        return labels.node_labels(
            self.node,
            self.contract,
            allocated=self.units_in_use,
            allocated_mig=self.mig_in_use,
            headroom=headroom,
            cpu_per_gpu_milli=self.cpu_per_gpu_milli,
        )

    def _resource_devices(self, resource: str) -> devicemanager.ResourceDevices:
        devices = self._devices.get(resource)
        if devices is None:
            if resource == contract_.NVIDIA_GPU and not self.sharing:
                ids: Sequence[str] = [g.uuid for g in self.node.gpus]
            elif resource == self.contract.gpu_memory_resource and self.memory is not None:
                ids = self.memory.device_ids
            elif resource in self.mig:
                ids = self.mig[resource].device_ids
            else:
                ids = ()
            devices = self._devices[resource] = devicemanager.ResourceDevices(resource, ids)
        return devices

    # --- admission ----------------------------------------------------------------------

    def admit(self, pod_key: str, containers: Sequence[tuple[str, Mapping[str, int]]]) -> list[Grant]:
        """Allocate every container's devices as kubelet would; all or nothing.

        Raises AdmissionFailure naming the container and kubelet's (or Allocate's) reason.
        """
        grants: list[Grant] = []
        committed: list[tuple[devicemanager.ResourceDevices, str]] = []
        try:
            for container, requests in containers:
                for resource, size in sorted(requests.items()):
                    owner = f"{pod_key}/{container}"
                    devices = self._resource_devices(resource)
                    grant = self._allocate(devices, container, resource, size)
                    devices.commit(owner, grant.device_ids)
                    committed.append((devices, owner))
                    grants.append(grant)
        except (devicemanager.AdmissionError, allocation.AllocationError) as exc:
            for devices, owner in committed:
                devices.release(owner)
            raise AdmissionFailure(f"container {container}: {resource}: {exc}") from None
        for grant in grants:
            self._account(grant, +1)
        return grants

    def credit(self, grants: Sequence[Grant]) -> float:
        """GPUs' worth of memory these admitted grants hold, counted per GPU and never past a
        whole GPU: what the allocation ratio credits the pod with."""
        added = 0.0
        for grant in grants:
            for share in grant.shares:
                before = self.granted_share.get(share.uuid, 0.0)
                after = min(1.0, before + share.share)
                self.granted_share[share.uuid] = after
                added += after - before
        return added

    def _allocate(self, devices: devicemanager.ResourceDevices, container: str, resource: str, size: int) -> Grant:
        available, must_include = devices.preferred_request(size)
        if resource == self.contract.gpu_memory_resource and self.memory is not None:
            preferred = self.memory.preferred(available, must_include, size)
            chosen = devices.choose(size, preferred)
            memory = self.memory.grant(chosen, unhealthy=devices.unhealthy)
            shares = tuple(
                GpuShare(uuid, memory.units, self.memory.units_of_gpu[uuid], self.memory.unit_mib, self._gpu_mib[uuid])
                for uuid in memory.gpu_uuids
            )
            return Grant(container, resource, tuple(chosen), memory.gpu_uuids, memory.memory_mib, shares)
        if resource in self.mig:
            slices = self.mig[resource]
            chosen = devices.choose(size, slices.preferred(available, must_include, size))
            mig = slices.grant(chosen, unhealthy=devices.unhealthy)
            per_parent = collections.Counter(slices.devices[d].parent_uuid for d in chosen)
            shares = tuple(
                GpuShare(parent, n, self._slices_on[(resource, parent)], mig.memory_mib, self._gpu_mib[parent])
                for parent, n in per_parent.items()
            )
            return Grant(container, resource, tuple(chosen), mig.mig_uuids, mig.memory_mib, shares)
        # NVIDIA's plugin for whole GPUs: any free GPUs do, kubelet's own choice stands.
        chosen = devices.choose(size, ())
        shares = tuple(GpuShare(uuid, 1, 1, self._gpu_mib[uuid], self._gpu_mib[uuid]) for uuid in chosen)
        return Grant(container, resource, tuple(chosen), tuple(chosen), 0, shares)

    def _account(self, grant: Grant, sign: int) -> None:
        if grant.resource == self.contract.gpu_memory_resource and self.memory is not None:
            for device_id in grant.device_ids:
                gpu = self.memory.gpu_of[device_id]
                self.units_in_use[gpu] = self.units_in_use.get(gpu, 0) + sign
        elif grant.resource in self.mig:
            (self.mig_in_use.update if sign > 0 else self.mig_in_use.difference_update)(grant.device_ids)
        else:
            (self.whole_in_use.update if sign > 0 else self.whole_in_use.difference_update)(grant.device_ids)

    # --- what is in use -----------------------------------------------------------------

    def gpus_in_use(self) -> int:
        """GPUs holding at least one pod's devices."""
        shared = sum(1 for n in self.units_in_use.values() if n > 0)
        mig_parents = {m.parent_uuid for m in self.node.mig_devices() if m.uuid in self.mig_in_use}
        return shared + len(mig_parents) + len(self.whole_in_use)
