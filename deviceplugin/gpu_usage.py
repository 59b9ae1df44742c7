"""One NVML sample of every shared device of the node: memory in use, and which processes hold it.

For every GPU not in MIG mode and every MIG device: used and total memory
(nvmlDeviceGetMemoryInfo), device utilisation (nvmlDeviceGetUtilizationRates, not on MIG), the
processes holding a context (compute, graphics and MPS-client queries merged by PID; NVML gives
host PIDs and, per process, the memory it holds, or None where it cannot say), and per-process SM
utilisation where NVML keeps samples (nvmlDeviceGetProcessUtilization; not on MIG devices).

A device that does not answer (a GPU that fell off the bus, a driver error) gives a sample with
`error` set and nothing else: the caller then knows nothing about it this time, rather than
"nothing in use". Facts used: ../shared/reference/nvml.md (PROCESSES / UTILISATION).

Blocking NVML calls: run `UsageReader.read` in a worker thread. May import
gpuslice.deviceplugin.{inventory,nvml_source}.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.node import inventory, nvml_source

__all__ = ["DeviceSample", "GpuProcess", "UsageReader", "shared_devices"]

log = logging.getLogger(__name__)

_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class GpuProcess:
    pid: int  # host PID
    used_mib: int | None  # None: NVML does not say (it reports NVML_VALUE_NOT_AVAILABLE)


@dataclasses.dataclass(frozen=True)
class DeviceSample:
    uuid: str  # GPU or MIG device
    gpu_uuid: str  # the physical GPU (the device itself unless it is a MIG device)
    used_mib: int = 0
    total_mib: int = 0
    utilization: int | None = None  # device busy %, None where NVML does not give it (MIG)
    processes: tuple[GpuProcess, ...] = ()
    # PID -> SM busy % of its latest sample; None: NVML keeps no per-process samples here
    process_utilization: Mapping[int, int] | None = None
    error: str | None = None  # set: the device did not answer, every other field is empty

    @property
    def ok(self) -> bool:
        return self.error is None


def shared_devices(node: inventory.NodeInventory) -> tuple[tuple[str, str], ...]:
    """(device UUID, GPU UUID) of every device pods get a share of: GPUs not in MIG mode and MIG devices."""
    gpus = tuple((g.uuid, g.parent_uuid or g.uuid) for g in node.memory_gpus)
    return gpus + tuple((m.uuid, m.parent_uuid) for m in node.mig_devices())


class UsageReader:
    """Reads `devices` (from `shared_devices`) through NVML. Keeps, per device, the time of the
    last per-process utilisation sample seen, so each read asks only for newer samples."""

    def __init__(
        self,
        nvml: nvml_source.Nvml,
        devices: tuple[tuple[str, str], ...],
        *,
        wall_clock: Callable[[], float] = time.time,
        first_window_seconds: float = 20.0,
    ) -> None:
        self._nvml = nvml
        self._devices = devices
        self._wall_clock = wall_clock
        self._first_window = first_window_seconds
        self._last_seen_us: dict[str, int] = {}
        # Handles are looked up once (nvml_source.device_handles says why not by UUID every time).
        self._handles: dict[str, Any] = {}

    def read(self) -> list[DeviceSample]:
        return [self._read_one(uuid, gpu) for uuid, gpu in self._devices]

    def _read_one(self, uuid: str, gpu_uuid: str) -> DeviceSample:
        nvml = self._nvml
        try:
            handle = self._handle(uuid)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            processes = self._processes(handle)
        except nvml.NVMLError as exc:
            return DeviceSample(uuid=uuid, gpu_uuid=gpu_uuid, error=f"{type(exc).__name__}: {exc}")
        return DeviceSample(
            uuid=uuid,
            gpu_uuid=gpu_uuid,
            used_mib=int(memory.used) // _MIB,
            total_mib=int(memory.total) // _MIB,
            utilization=self._utilization(handle),
            processes=processes,
            process_utilization=self._process_utilization(uuid, handle),
        )

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is not None:
            return handle
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
        except self._nvml.NVMLError:
            # Another GPU may be the lost one: look every device up by index instead.
            self._handles.update(nvml_source.device_handles(self._nvml))
            if uuid not in self._handles:
                raise
            return self._handles[uuid]
        self._handles[uuid] = handle
        return handle

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        """Compute, graphics and MPS-client processes merged by PID (a process with both a
        compute and a graphics context is listed twice by NVML, with the same memory)."""
        nvml = self._nvml
        used: dict[int, int | None] = {}
        # Compute processes must be readable; the others are optional (not every GPU or driver has them).
        queries = (
            ("nvmlDeviceGetComputeRunningProcesses", True),
            ("nvmlDeviceGetGraphicsRunningProcesses", False),
            ("nvmlDeviceGetMPSComputeRunningProcesses", False),
        )
        for name, required in queries:
            query = getattr(nvml, name, None)
            if query is None:
                continue
            try:
                listed = query(handle)
            except nvml.NVMLError as exc:
                if required or type(exc).__name__ not in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound"):
                    raise
                continue
            for process in listed:
                pid = int(process.pid)
                mib = None if process.usedGpuMemory is None else int(process.usedGpuMemory) // _MIB
                previous = used.get(pid)
                used[pid] = mib if previous is None else max(previous, mib or 0)
        return tuple(GpuProcess(pid, mib) for pid, mib in sorted(used.items()))

    def _utilization(self, handle: Any) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except self._nvml.NVMLError:  # NotSupported on MIG devices
            return None

    def _process_utilization(self, uuid: str, handle: Any) -> dict[int, int] | None:
        nvml = self._nvml
        query = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
        if query is None:
            return None
        since = self._last_seen_us.get(uuid)
        if since is None:
            since = int((self._wall_clock() - self._first_window) * 1_000_000)
        try:
            samples = query(handle, since)
        except nvml.NVMLError as exc:
            if type(exc).__name__ == "NVMLError_NotFound":
                return {}  # no process ran a kernel since `since`: every process was idle
            return None  # NotSupported (MIG, older GPUs) and the rest: not known
        latest: dict[int, tuple[int, int]] = {}
        for sample in samples:
            stamp, pid = int(sample.timeStamp), int(sample.pid)
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, int(sample.smUtil))
            self._last_seen_us[uuid] = max(self._last_seen_us.get(uuid, 0), stamp)
        return {pid: min(100, max(0, util)) for pid, (_, util) in latest.items()}
