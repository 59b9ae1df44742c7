"""Who uses what on the node's GPUs: NVML's processes joined with the pods that hold grants.

Three records are joined, each from the party that knows it:

* NVML (gpu_usage): per device, the host PIDs holding memory there and how much;
* the kernel (cgroups): per PID, its pod UID and container runtime ID;
* the API server (podapi): pod UID -> namespace, name and container runtime ID -> container name;
* kubelet (PodResources): per (namespace, pod, container), the device IDs it holds, which say
  the GPU and the grant: memory units `<GPU UUID>::<size>Mi::<n>` x their size, or a MIG device's memory.

A process's memory goes to the container whose grant covers that device. Everything else is
memory gpuslice does not know, with the reason: `outside-pods` (a host process, the MPS server
of another daemon), `unknown-pod` (a pod or container the API server does not list: gone, or not
listed yet),
`no-grant` (a pod with no gpuslice grant on that device, e.g. one holding nvidia.com/gpu), or
`exited` (the process ended before its cgroup was read). Containers that hold a grant but run
no process are reported with 0 MiB used.

Pure functions over plain data. May import gpuslice.contract and
gpuslice.deviceplugin.{cgroups,gpu_usage,inventory,podapi,podresources}.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from gpuslice import contract as contract_
from gpuslice.deviceplugin import cgroups, gpu_usage, podapi
from gpuslice.node import inventory, podresources

__all__ = ["UNKNOWN_REASONS", "ContainerUse", "DeviceUse", "ProcessUse", "Snapshot", "attribute", "grants_of"]

UNKNOWN_REASONS = ("outside-pods", "unknown-pod", "no-grant", "exited")


@dataclasses.dataclass(frozen=True)
class ProcessUse:
    identity: cgroups.Identity  # PID, start time and cgroup when it was measured
    used_mib: int | None  # None: NVML does not say

    @property
    def pid(self) -> int:
        return self.identity.pid


@dataclasses.dataclass(frozen=True)
class ContainerUse:
    namespace: str
    pod: str
    pod_uid: str  # "" when the API server has not listed the pod (no process of it is running)
    container: str
    device: str  # GPU or MIG UUID
    gpu: str  # the physical GPU
    mig: bool
    granted_mib: int
    used_mib: int  # sum over its processes whose use NVML reports
    used_complete: bool  # False: NVML could not say for some process, `used_mib` is a lower bound
    utilization: int | None  # SM busy % of its processes (capped at 100), None where NVML cannot say
    processes: tuple[ProcessUse, ...] = ()

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.pod_uid or f"{self.namespace}/{self.pod}", self.container, self.device, self.gpu)


@dataclasses.dataclass(frozen=True)
class DeviceUse:
    uuid: str
    gpu: str
    mig: bool
    ok: bool
    error: str | None = None
    used_mib: int = 0  # NVML's figure for the whole device (includes what no process accounts for)
    total_mib: int = 0
    utilization: int | None = None
    granted_mib: int = 0  # sum of the grants kubelet has given out on this device
    unknown_mib: Mapping[str, int] = dataclasses.field(default_factory=dict)  # reason -> MiB


@dataclasses.dataclass(frozen=True)
class Snapshot:
    containers: tuple[ContainerUse, ...] = ()
    devices: tuple[DeviceUse, ...] = ()

    def pressured(self, tolerance_mib: int) -> frozenset[str]:
        """GPUs whose processes use more than kubelet's accounting allows for: the sum of every
        container's use beyond its grant there plus what processes gpuslice does not know hold
        (those still running) exceeds `tolerance_mib`. Units kubelet still offers on such a GPU
        are not really free."""
        excess: dict[str, int] = {}
        for use in self.containers:
            excess[use.gpu] = excess.get(use.gpu, 0) + max(0, use.used_mib - use.granted_mib)
        for device in self.devices:
            held = sum(mib for reason, mib in device.unknown_mib.items() if reason != "exited")
            excess[device.gpu] = excess.get(device.gpu, 0) + held
        return frozenset(gpu for gpu, mib in excess.items() if mib > tolerance_mib)


# (namespace, pod, container) -> device UUID -> granted MiB
Grants = dict[tuple[str, str, str], dict[str, int]]


def grants_of(
    holdings: Iterable[podresources.ContainerDevices],
    node: inventory.NodeInventory,
    names: contract_.Contract,
) -> Grants:
    """What each container holds, per device, from kubelet's PodResources record. Units count at
    the size their ID names; IDs of GPUs this node does not share by memory, and malformed ones
    (a stale record), are ignored."""
    mig_memory = {m.uuid: m.memory_mib for m in node.mig_devices()}
    gpus = {g.uuid for g in node.memory_gpus}
    grants: Grants = {}
    for entry in holdings:
        per_device = grants.setdefault((entry.namespace, entry.pod, entry.container), {})
        if entry.resource == names.gpu_memory_resource:
            for device_id in entry.device_ids:
                try:
                    unit = contract_.parse_unit_device_id(device_id)
                except ValueError:
                    continue
                # a unit's size is in its ID: one held from before a size change counts at its own
                if unit.gpu_uuid in gpus:
                    per_device[unit.gpu_uuid] = per_device.get(unit.gpu_uuid, 0) + unit.unit_mib
        else:
            for device_id in entry.device_ids:
                if device_id in mig_memory:
                    per_device[device_id] = mig_memory[device_id]
        if not per_device:
            del grants[(entry.namespace, entry.pod, entry.container)]
    return grants


def attribute(
    samples: Iterable[gpu_usage.DeviceSample],
    identities: Mapping[int, cgroups.Identity | None],
    pods: Iterable[podapi.PodInfo],
    grants: Grants,
) -> Snapshot:
    """The snapshot: every container with a grant (and its use), every device (and what no grant covers)."""
    samples = list(samples)
    by_uid: dict[str, podapi.PodInfo] = {}
    by_name: dict[tuple[str, str], podapi.PodInfo] = {}
    for pod in pods:
        by_uid[pod.uid] = pod
        if pod.static_uid:
            by_uid.setdefault(pod.static_uid, pod)
        by_name[(pod.namespace, pod.name)] = pod
    containers: dict[tuple[str, str, str, str], _Building] = {}
    granted_on: dict[str, int] = {}
    for per_device in grants.values():
        for device, mib in per_device.items():
            granted_on[device] = granted_on.get(device, 0) + mib
    devices = []
    for sample in samples:
        mig = sample.uuid != sample.gpu_uuid
        if not sample.ok:
            devices.append(
                DeviceUse(
                    sample.uuid,
                    sample.gpu_uuid,
                    mig,
                    ok=False,
                    error=sample.error,
                    granted_mib=granted_on.get(sample.uuid, 0),
                )
            )
            continue
        unknown: dict[str, int] = {}
        for process in sample.processes:
            identity = identities.get(process.pid)
            owner, reason = _owner(identity, by_uid, grants, sample.uuid)
            if owner is None:
                unknown[reason] = unknown.get(reason, 0) + (process.used_mib or 0)
                continue
            assert identity is not None
            pod, container = owner
            building = containers.setdefault(
                (pod.namespace, pod.name, container, sample.uuid),
                _Building(pod.uid, grants[(pod.namespace, pod.name, container)][sample.uuid]),
            )
            building.processes.append(ProcessUse(identity, process.used_mib))
        devices.append(
            DeviceUse(
                uuid=sample.uuid,
                gpu=sample.gpu_uuid,
                mig=mig,
                ok=True,
                used_mib=sample.used_mib,
                total_mib=sample.total_mib,
                utilization=sample.utilization,
                granted_mib=granted_on.get(sample.uuid, 0),
                unknown_mib={reason: unknown.get(reason, 0) for reason in UNKNOWN_REASONS},
            )
        )
    samples_by_device = {d.uuid: d for d in devices}
    gpu_of = {d.uuid: d.gpu for d in devices}
    utilization_of = {s.uuid: s.process_utilization for s in samples}
    result = []
    for (namespace, pod_name, container), per_device in sorted(grants.items()):
        for device, granted in sorted(per_device.items()):
            if device not in samples_by_device or not samples_by_device[device].ok:
                continue  # nothing known about this device now: no figure rather than a wrong 0
            found = containers.get((namespace, pod_name, container, device))
            known_pod = by_name.get((namespace, pod_name))
            processes = tuple(found.processes) if found else ()
            per_pid = utilization_of.get(device)
            result.append(
                ContainerUse(
                    namespace=namespace,
                    pod=pod_name,
                    pod_uid=found.pod_uid if found else (known_pod.uid if known_pod else ""),
                    container=container,
                    device=device,
                    gpu=gpu_of[device],
                    mig=device != gpu_of[device],
                    granted_mib=granted,
                    used_mib=sum(p.used_mib or 0 for p in processes),
                    used_complete=all(p.used_mib is not None for p in processes),
                    utilization=None if per_pid is None else min(100, sum(per_pid.get(p.pid, 0) for p in processes)),
                    processes=processes,
                )
            )
    return Snapshot(containers=tuple(result), devices=tuple(devices))


@dataclasses.dataclass
class _Building:
    pod_uid: str
    granted_mib: int
    processes: list[ProcessUse] = dataclasses.field(default_factory=list)


def _owner(
    identity: cgroups.Identity | None,
    by_uid: Mapping[str, podapi.PodInfo],
    grants: Grants,
    device: str,
) -> tuple[tuple[podapi.PodInfo, str] | None, str]:
    """((pod, container name), "") when a grant covers this process on `device`, else (None, reason)."""
    if identity is None:
        return None, "exited"
    if identity.container is None:
        return None, "outside-pods"
    pod = by_uid.get(identity.container.pod_uid)
    if pod is None:
        return None, "unknown-pod"
    container = pod.containers.get(identity.container.container_id)
    if container is None:
        # a container that started after the pod list was read, or a pod-level process
        return None, "unknown-pod" if identity.container.container_id else "no-grant"
    if device not in grants.get((pod.namespace, pod.name, container), {}):
        return None, "no-grant"
    return (pod, container), ""
