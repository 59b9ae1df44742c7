"""A hand-written fake of the `pynvml` functions gpuslice calls (deviceplugin/nvml_source.Nvml),
built from a NodeInventory so it can present the demo node or any node file.

Beyond discovery it can: inject XID events (`inject_xid`), make a GPU stop answering
(`fail_gpu`) and answer again (`recover_gpu`), and report settable used memory and utilisation
(`set_memory_used`, `set_utilization`). GPU processes (`add_process`, `remove_process`,
`set_process_utilization`) are listed by the compute/graphics/MPS process queries and count in
the device's used memory on top of `set_memory_used`; `fail_process_queries` makes those queries
raise, as a driver in trouble does. Return shapes follow nvidia-ml-py: struct-like objects
with the same field names, bytes for c_char fields (pci busId, profile name), NVMLError
subclasses named as pynvml names them. Thread-safe where the plugin calls it from a worker
thread (event waits).

Where it can, it answers as real NVML did on an H200 (docs/gpu-check/h200-2026-11-28.json) or as
nvml.h documents; e2e/nvml builds a loadable NVML from NVIDIA's go-nvml mock that
tests/test_nvml_mock.py runs through pynvml's real ctypes path. One known difference is kept:
nvml.h says nvmlDeviceGetHandleByUUID fails with GPU_IS_LOST if ANY GPU is lost; here only the
lost GPU's own lookups fail.
"""

from __future__ import annotations

import math
import queue
import re
import threading
import types
from typing import Any

from gpuslice.node import inventory

_MIB = 1 << 20
NOT_MIG_SPECIFIC = 0xFFFFFFFF


class NVMLError(Exception):
    def __init__(self, message: str = "") -> None:
        super().__init__(message or type(self).__name__)


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_GpuIsLost(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_Unknown(NVMLError):
    pass


class _Process:
    def __init__(self, pid: int, used_mib: int | None, kind: str) -> None:
        self.pid = pid
        self.used_mib = used_mib  # None: NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None
        self.kind = kind  # "compute", "graphics", "compute+graphics" or "mps"
        self.sm_util: int | None = None


# GPU-instance profiles of an A100 80GB: (NVML constant name, constant, slices, profile id, name suffix)
_GI_PROFILES = (
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 0, 1, 19, ""),
    ("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 1, 2, 14, ""),
    ("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 2, 3, 9, ""),
    ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 3, 4, 5, ""),
    ("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 4, 7, 0, ""),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 7, 1, 20, "+me"),
    ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME", 0xF, 1, 21, "+me.all"),
)
_PROFILE_RE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb([+-].*)?$")
# nvmlDeviceGetSupportedEventTypes of the measured H200 (driver 580.159.04)
_SUPPORTED_EVENTS = 0xFF9F


def _nvidia_profile_name(slices: int, memory_mib: int, parent_mib: int, suffix: str) -> str:
    """The name NVML gives a GPU-instance profile ("MIG 1g.18gb"): go-nvlib's rule, with the half
    rounded away from zero as Go's math.Round does."""
    eighths = math.ceil(memory_mib / parent_mib * 8)
    gb = math.floor(eighths / 8 * math.ceil(parent_mib / 1024) + 0.5)
    return f"MIG {slices}g.{gb}gb{suffix}"


class _Gpu:
    def __init__(self, gpu: inventory.Gpu, bus_id: str) -> None:
        self.info = gpu
        self.uuid = gpu.uuid
        self.bus_id = bus_id
        self.used_mib = 0
        self.utilization = 0
        self.lost = False
        self.processes: dict[int, _Process] = {}
        self.process_error: type[NVMLError] | None = None
        self.migs: list[_Mig] = []
        self.links: list[str] = []  # remote bus id per NVLink


class _Mig:
    def __init__(self, mig: inventory.MigDevice, parent: _Gpu, gi: int, ci: int) -> None:
        self.info = mig
        self.uuid = mig.uuid
        self.parent = parent
        self.gi = gi
        self.ci = ci
        match = _PROFILE_RE.match(mig.profile)
        assert match, mig.profile
        self.gpu_slices = int(match.group(2))
        self.compute_slices = int(match.group(1) or match.group(2))
        self.suffix = match.group(4) or ""
        self.used_mib = 0
        self.utilization = 0
        self.processes: dict[int, _Process] = {}
        self.process_error: type[NVMLError] | None = None


class _EventSet:
    def __init__(self) -> None:
        self.events: queue.Queue[Any] = queue.Queue()
        self.registered: dict[str, int] = {}  # GPU uuid -> mask


class FakeNvml:
    """Stands in for the `pynvml` module: pass it wherever nvml_source.Nvml is expected."""

    NVMLError = NVMLError
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_FEATURE_ENABLED = 1
    NVML_FEATURE_DISABLED = 0
    NVML_NVLINK_MAX_LINKS = 36  # nvidia-ml-py 13.x (the measured H200's pynvml said 36 too)
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    def __init__(self, node: inventory.NodeInventory) -> None:
        for name, constant, *_ in _GI_PROFILES:
            setattr(self, name, constant)
        self._lock = threading.Lock()
        self.initialised = False
        self.calls = 0
        self.gpus: list[_Gpu] = []
        for gpu in sorted(node.gpus, key=lambda g: g.index):
            bus_id = gpu.pci_bus_id or f"00000000:{0x10 + gpu.index:02X}:00.0"
            fake = _Gpu(gpu, bus_id)
            for i, mig in enumerate(gpu.mig):
                fake.migs.append(_Mig(mig, fake, gi=i + 1, ci=0))
            self.gpus.append(fake)
        by_uuid = {g.uuid: g for g in self.gpus}
        for fake in self.gpus:
            for peer, count in sorted(fake.info.nvlinks.items()):
                fake.links.extend([by_uuid[peer].bus_id] * count)
        # a node file may list more point-to-point links than a real GPU has (NVSwitch nodes)
        self.NVML_NVLINK_MAX_LINKS = max(36, *(len(g.links) for g in self.gpus)) if self.gpus else 36
        self._by_uuid: dict[str, Any] = {**by_uuid, **{m.uuid: m for g in self.gpus for m in g.migs}}
        self.event_sets: list[_EventSet] = []

    # --- test controls ------------------------------------------------------------------

    def inject_xid(
        self, uuid: str, xid: int, *, gpu_instance: int = NOT_MIG_SPECIFIC, compute_instance: int = NOT_MIG_SPECIFIC
    ) -> None:
        """An XID critical error on GPU `uuid` (optionally on one MIG instance of it)."""
        gpu = self._by_uuid[uuid]
        event = types.SimpleNamespace(
            device=gpu,
            eventType=self.nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=gpu_instance,
            computeInstanceId=compute_instance,
        )
        for event_set in self.event_sets:
            if uuid in event_set.registered:
                event_set.events.put(event)

    def mig_instance(self, mig_uuid: str) -> tuple[int, int]:
        mig = self._by_uuid[mig_uuid]
        return mig.gi, mig.ci

    def fail_gpu(self, uuid: str) -> None:
        """The GPU stops answering NVML (GpuIsLost), as after XID 79."""
        self._by_uuid[uuid].lost = True

    def recover_gpu(self, uuid: str) -> None:
        self._by_uuid[uuid].lost = False

    def set_memory_used(self, uuid: str, mib: int) -> None:
        self._by_uuid[uuid].used_mib = mib

    def set_utilization(self, uuid: str, percent: int) -> None:
        self._by_uuid[uuid].utilization = percent

    def add_process(self, uuid: str, pid: int, used_mib: int | None, *, kind: str = "compute") -> None:
        """Process `pid` holds `used_mib` MiB on GPU or MIG device `uuid` (None: NVML cannot say)."""
        self._by_uuid[uuid].processes[pid] = _Process(pid, used_mib, kind)

    def remove_process(self, uuid: str, pid: int) -> None:
        self._by_uuid[uuid].processes.pop(pid, None)

    def set_process_utilization(self, uuid: str, pid: int, sm_percent: int | None) -> None:
        self._by_uuid[uuid].processes[pid].sm_util = sm_percent

    def fail_process_queries(self, uuid: str, error: type[NVMLError] | None = NVMLError_Unknown) -> None:
        """The process queries of `uuid` raise `error` (None: answer again)."""
        self._by_uuid[uuid].process_error = error

    # --- helpers ------------------------------------------------------------------------

    def _check(self, handle: Any) -> Any:
        with self._lock:
            self.calls += 1
        if not self.initialised:
            raise NVMLError("Uninitialized")
        if not isinstance(handle, (_Gpu, _Mig)):
            raise NVMLError_InvalidArgument()
        gpu = handle.parent if isinstance(handle, _Mig) else handle
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return handle

    def _gpu(self, handle: Any) -> _Gpu:
        handle = self._check(handle)
        if not isinstance(handle, _Gpu):
            raise NVMLError_InvalidArgument()
        return handle

    def _mig(self, handle: Any) -> _Mig:
        """A MIG device handle; NotSupported for a GPU's (nvml.h: these queries take MIG handles)."""
        handle = self._check(handle)
        if not isinstance(handle, _Mig):
            raise NVMLError_NotSupported()
        return handle

    # --- lifecycle / enumeration --------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Gpu:
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self._gpu(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        # nvml.h: GPU_IS_LOST "if any GPU has fallen off the bus", not only the one asked for.
        if self.initialised and any(g.lost for g in self.gpus):
            raise NVMLError_GpuIsLost()
        handle = self._by_uuid.get(uuid)
        if handle is None:
            raise NVMLError_NotFound()
        return self._check(handle)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._check(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        handle = self._check(handle)
        return (
            handle.info.model if isinstance(handle, _Gpu) else f"{handle.parent.info.model} MIG {handle.info.profile}"
        )

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle).info.index

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.info.minor_number is None:
            raise NVMLError_NotSupported()
        return gpu.info.minor_number

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        return types.SimpleNamespace(busId=gpu.bus_id.encode(), busIdLegacy=gpu.bus_id[4:].encode())

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if gpu.info.numa_node is None:
            raise NVMLError_NotSupported()
        return gpu.info.numa_node

    # --- memory / utilisation -----------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        handle = self._check(handle)
        total = handle.info.memory_mib * _MIB
        used = (handle.used_mib + sum(p.used_mib or 0 for p in handle.processes.values())) * _MIB
        return types.SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        handle = self._check(handle)
        if isinstance(handle, _Mig) or handle.info.mig_enabled:  # nvml.h: not on MIG-enabled GPUs
            raise NVMLError_NotSupported()
        return types.SimpleNamespace(gpu=handle.utilization, memory=0)

    # --- processes ----------------------------------------------------------------------

    def _processes(self, handle: Any, kinds: tuple[str, ...]) -> list[Any]:
        handle = self._check(handle)
        if handle.process_error is not None:
            raise handle.process_error()
        gi, ci = (handle.gi, handle.ci) if isinstance(handle, _Mig) else (NOT_MIG_SPECIFIC, NOT_MIG_SPECIFIC)
        return [
            types.SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=None if p.used_mib is None else p.used_mib * _MIB,
                gpuInstanceId=gi,
                computeInstanceId=ci,
            )
            for p in sorted(handle.processes.values(), key=lambda p: p.pid)
            if any(kind in p.kind.split("+") for kind in kinds)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, ("compute",))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, ("graphics",))

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, ("mps",))

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timestamp: int) -> list[Any]:
        handle = self._check(handle)
        if isinstance(handle, _Mig) or handle.info.mig_enabled:  # nvml.h: not on MIG-enabled GPUs
            raise NVMLError_NotSupported()
        if handle.process_error is not None:
            raise handle.process_error()
        samples = [
            types.SimpleNamespace(pid=p.pid, timeStamp=timestamp + 1, smUtil=p.sm_util, memUtil=0, encUtil=0, decUtil=0)
            for p in sorted(handle.processes.values(), key=lambda p: p.pid)
            if p.sm_util is not None
        ]
        if not samples:
            raise NVMLError_NotFound()  # NVML: no sample since `timestamp`
        return samples

    # --- MIG ----------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        mode = int(self._gpu(handle).info.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7 if self._gpu(handle).info.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _Mig:
        gpu = self._gpu(handle)
        if not 0 <= index < 7:
            raise NVMLError_InvalidArgument()
        if index >= len(gpu.migs):
            raise NVMLError_NotFound()
        return gpu.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int:
        return self._mig(mig).gi

    def nvmlDeviceGetComputeInstanceId(self, mig: Any) -> int:
        return self._mig(mig).ci

    def nvmlDeviceGetAttributes(self, mig: Any) -> Any:
        mig = self._mig(mig)
        return types.SimpleNamespace(
            gpuInstanceSliceCount=mig.gpu_slices,
            computeInstanceSliceCount=mig.compute_slices,
            memorySizeMB=mig.info.memory_mib,
            multiprocessorCount=14 * mig.compute_slices,
        )

    def _profile_memory(self, gpu: _Gpu, slices: int, suffix: str) -> int:
        for mig in gpu.migs:
            if mig.gpu_slices == slices and mig.suffix == suffix:
                return mig.info.memory_mib
        return gpu.info.memory_mib * slices // 8

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        gpu = self._gpu(handle)
        for _name, constant, slices, profile_id, suffix in _GI_PROFILES:
            if constant == profile:
                memory_mib = self._profile_memory(gpu, slices, suffix)
                return types.SimpleNamespace(
                    id=profile_id,
                    sliceCount=slices,
                    memorySizeMB=memory_mib,
                    name=_nvidia_profile_name(slices, memory_mib, gpu.info.memory_mib, suffix).encode(),
                )
        raise NVMLError_NotSupported()

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> Any:
        gpu = self._gpu(handle)
        for mig in gpu.migs:
            if mig.gi == gpu_instance_id:
                return mig
        raise NVMLError_NotFound()

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> Any:
        mig = self._check(gpu_instance)
        profile_id = next(p for _, _, s, p, suffix in _GI_PROFILES if s == mig.gpu_slices and suffix == mig.suffix)
        return types.SimpleNamespace(id=mig.gi, profileId=profile_id, device=mig.parent)

    # --- NVLink -------------------------------------------------------------------------

    def _link(self, handle: Any, link: int) -> str:
        """The remote bus id of `link`: NotSupported on a GPU without NVLink (as measured),
        InvalidArgument past the links of one with NVLink (nvml.h: "link is invalid")."""
        gpu = self._gpu(handle)
        if not gpu.links:
            raise NVMLError_NotSupported()
        if link >= len(gpu.links):
            raise NVMLError_InvalidArgument()
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._link(handle, link)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        return types.SimpleNamespace(busId=self._link(handle, link).encode())

    # --- events -------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle)
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: _EventSet) -> None:
        event_set.registered[self._gpu(handle).uuid] = mask

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> Any:
        try:
            return event_set.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError_Timeout() from None

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        if event_set in self.event_sets:
            self.event_sets.remove(event_set)
