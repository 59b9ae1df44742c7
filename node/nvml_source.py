"""GPU discovery through NVML: fills the same NodeInventory a node file does.

NVML is reached only through the `Nvml` Protocol below, the subset of nvidia-ml-py's `pynvml`
module we call; production passes the module itself (`load_pynvml()`), tests pass the
hand-written fake in tests/fake_nvml.py. Facts used: ../shared/reference/nvml.md.

MIG profile names are derived as NVIDIA's go-nvlib does, from the GPU instance's slice count,
the compute instance's slice count and the instance memory relative to the parent's:
`<G>g.<GB>gb` (or `<C>c.<G>g.<GB>gb`), with `+me`, `+me.all`, `+gfx`, `-me` suffixes for the
special GPU-instance profiles.

May import gpuslice.node.inventory; no other gpuslice module.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable
from typing import Any, Protocol

from gpuslice.node import inventory, nodefile

__all__ = [
    "DiscoveryFailed",
    "Nvml",
    "device_handles",
    "NvmlUnavailable",
    "discover",
    "load_node",
    "load_pynvml",
    "mig_profile_name",
    "read_usage",
]

_MIB = 1 << 20
_GIB = 1 << 30
_NOT_MIG_SPECIFIC = 0xFFFFFFFF

# GPU-instance profile constant -> suffix of the canonical name (nvml.md, go-nvlib).
_PROFILE_SUFFIX_BY_CONSTANT_NAME = {
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": "+me",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1": "+me",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME": "+me.all",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME": "+me.all",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX": "+gfx",
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME": "-me",
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME": "-me",
}


class NvmlUnavailable(RuntimeError):
    """libnvidia-ml cannot be loaded or initialised (no driver, no GPU)."""


class Nvml(Protocol):
    """The part of `pynvml` gpuslice uses (names as nvidia-ml-py spells them)."""

    NVMLError: type[Exception]
    NVML_DEVICE_MIG_ENABLE: int
    NVML_FEATURE_ENABLED: int
    NVML_NVLINK_MAX_LINKS: int
    NVML_GPU_INSTANCE_PROFILE_COUNT: int
    nvmlEventTypeXidCriticalError: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetIndex(self, handle: Any) -> int: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, mig: Any) -> int: ...
    def nvmlDeviceGetAttributes(self, mig: Any) -> Any: ...
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> Any: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int) -> Any: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: Any) -> None: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


def load_pynvml() -> Nvml:
    """The real `pynvml` module, initialised; NvmlUnavailable if there is no driver or GPU."""
    import pynvml  # nvidia-ml-py: loads libnvidia-ml.so.1 only in nvmlInit()

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not be initialised: {exc}") from None
    return pynvml


# --- discovery --------------------------------------------------------------------------


def discover(nvml: Nvml, *, read_sysfs: Callable[[str], str | None] | None = None) -> inventory.NodeInventory:
    """Every GPU NVML sees: UUID, model, memory, index, minor, PCI bus id, NUMA node, MIG
    devices with canonical profile names, NVLink peers. `read_sysfs` (path -> text) is the
    NUMA fallback where NVML does not report it; default reads the real /sys."""
    read_sysfs = read_sysfs or _read_text
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    bus_ids = {_normal_bus_id(_text(nvml.nvmlDeviceGetPciInfo(h).busId)): nvml.nvmlDeviceGetUUID(h) for h in handles}
    gpus = []
    for handle in handles:
        uuid = nvml.nvmlDeviceGetUUID(handle)
        total_bytes = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        mig_enabled = _mig_enabled(nvml, handle)
        gpus.append(
            inventory.Gpu(
                uuid=uuid,
                model=nvml.nvmlDeviceGetName(handle),
                memory_mib=total_bytes // _MIB,
                index=nvml.nvmlDeviceGetIndex(handle),
                numa_node=_numa_node(nvml, handle, bus_id, read_sysfs),
                minor_number=_optional(nvml, nvml.nvmlDeviceGetMinorNumber, handle),
                pci_bus_id=bus_id,
                nvlinks=_nvlink_peers(nvml, handle, bus_ids, uuid),
                mig_enabled=mig_enabled,
                mig=tuple(_mig_devices(nvml, handle, uuid, total_bytes)) if mig_enabled else (),
            )
        )
    return inventory.NodeInventory(gpus=_switch_peers(gpus), source="nvml")


def read_usage(nvml: Nvml, uuid: str) -> tuple[int, int, int | None]:
    """(used MiB, total MiB, GPU utilisation %) of a GPU or MIG device as NVML sees it now.

    Utilisation is None where NVML does not report it (MIG devices). NVMLError propagates.
    """
    handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        util: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:
        util = None
    return int(memory.used) // _MIB, int(memory.total) // _MIB, util


def device_handles(nvml: Nvml) -> dict[str, Any]:
    """UUID -> handle of every GPU and MIG device that answers, found by index.

    nvmlDeviceGetHandleByUUID fails with GPU_IS_LOST for every UUID once any GPU of the node has
    fallen off the bus (nvml.h); by index, one lost GPU leaves the others' handles."""
    handles: dict[str, Any] = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            gpu = nvml.nvmlDeviceGetHandleByIndex(index)
            handles[nvml.nvmlDeviceGetUUID(gpu)] = gpu
            migs = _mig_handles(nvml, gpu) if _mig_enabled(nvml, gpu) else []
        except nvml.NVMLError:
            continue
        for mig in migs:
            try:
                handles[nvml.nvmlDeviceGetUUID(mig)] = mig
            except nvml.NVMLError:
                continue
    return handles


def mig_profile_name(
    gpu_slices: int, compute_slices: int, memory_mib: int, parent_total_bytes: int, suffix: str = ""
) -> str:
    """The canonical MIG profile name, as NVIDIA's go-nvlib derives it.

    Memory is expressed in eighths of the parent rounded up, times the parent's GiB rounded up,
    so an A100 80GB's 9728 MiB instance is "10gb" and its 40192 MiB instance "40gb".
    """
    eighths = math.ceil(memory_mib * _MIB / parent_total_bytes * 8)
    # Halves round away from zero (Go's math.Round), not to even: an H200's 4/8 of 141 GiB is 3g.71gb.
    gb = math.floor(eighths / 8 * math.ceil(parent_total_bytes / _GIB) + 0.5)
    base = f"{gpu_slices}g.{gb}gb" if compute_slices == gpu_slices else f"{compute_slices}c.{gpu_slices}g.{gb}gb"
    return base + suffix


def mig_instance_ids(nvml: Nvml, parent: Any) -> dict[tuple[int, int], str]:
    """(GPU instance id, compute instance id) -> MIG UUID for a MIG-enabled GPU (health events
    name MIG devices by these ids)."""
    ids = {}
    for mig in _mig_handles(nvml, parent):
        key = (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig))
        ids[key] = nvml.nvmlDeviceGetUUID(mig)
    return ids


def _mig_enabled(nvml: Nvml, handle: Any) -> bool:
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
    except nvml.NVMLError:  # NotSupported on GPUs without MIG
        return False
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _mig_handles(nvml: Nvml, parent: Any) -> list[Any]:
    handles = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))
        except nvml.NVMLError:  # empty slot (NotFound / InvalidArgument), as go-nvlib skips them
            continue
    return handles


def _mig_devices(nvml: Nvml, parent: Any, parent_uuid: str, parent_total_bytes: int) -> list[inventory.MigDevice]:
    profiles = _gpu_instance_profiles(nvml, parent)
    devices = []
    for mig in _mig_handles(nvml, parent):
        attributes = nvml.nvmlDeviceGetAttributes(mig)
        gpu_slices = int(attributes.gpuInstanceSliceCount)
        memory_mib = int(attributes.memorySizeMB)
        suffix = ""
        try:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(parent, nvml.nvmlDeviceGetGpuInstanceId(mig))
            profile_id = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).profileId)
        except nvml.NVMLError:
            profile_id = -1
        if profile_id in profiles:
            constant_name, info = profiles[profile_id]
            suffix = _PROFILE_SUFFIX_BY_CONSTANT_NAME.get(constant_name, "")
            gpu_slices = int(info.sliceCount)
            memory_mib = int(info.memorySizeMB)  # go-nvlib names by the profile's memory
        name = mig_profile_name(
            gpu_slices, int(attributes.computeInstanceSliceCount), memory_mib, parent_total_bytes, suffix
        )
        devices.append(
            inventory.MigDevice(
                uuid=nvml.nvmlDeviceGetUUID(mig),
                profile=name,
                memory_mib=int(attributes.memorySizeMB),
                parent_uuid=parent_uuid,
            )
        )
    return devices


def _gpu_instance_profiles(nvml: Nvml, parent: Any) -> dict[int, tuple[str, Any]]:
    """GPU-instance profile id (as GpuInstanceGetInfo reports it) -> (constant name, profile info)."""
    names = {
        getattr(nvml, name): name
        for name in dir(nvml)
        if name.startswith("NVML_GPU_INSTANCE_PROFILE_") and name != "NVML_GPU_INSTANCE_PROFILE_COUNT"
    }
    profiles = {}
    for constant in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, constant)
        except nvml.NVMLError:  # profile not supported on this GPU
            continue
        profiles[int(info.id)] = (names.get(constant, ""), info)
    return profiles


def _numa_node(nvml: Nvml, handle: Any, bus_id: str, read_sysfs: Callable[[str], str | None]) -> int | None:
    try:
        node = int(nvml.nvmlDeviceGetNumaNodeId(handle))
    except (nvml.NVMLError, AttributeError):  # older drivers/bindings: read sysfs as NVIDIA's plugin does
        text = read_sysfs(f"/sys/bus/pci/devices/{_normal_bus_id(bus_id)}/numa_node")
        try:
            node = int(text.strip()) if text else -1
        except ValueError:
            node = -1
    return node if node >= 0 else None


def _nvlink_peers(nvml: Nvml, handle: Any, bus_ids: dict[str, str], own_uuid: str) -> dict[str, int]:
    """Peer GPU UUID -> active NVLinks; links to a non-GPU (an NVSwitch) are counted under ''."""
    peers: dict[str, int] = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = _normal_bus_id(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except nvml.NVMLError:  # link absent or NVLink not supported
            continue
        peer = bus_ids.get(remote, "")
        if peer != own_uuid:
            peers[peer] = peers.get(peer, 0) + 1
    return peers


def _switch_peers(gpus: list[inventory.Gpu]) -> tuple[inventory.Gpu, ...]:
    """GPUs on NVSwitches reach every other switched GPU: count min(switch links) between them."""
    switched = {g.uuid: g.nvlinks.get("", 0) for g in gpus}
    result = []
    for gpu in gpus:
        links = {peer: n for peer, n in gpu.nvlinks.items() if peer}
        if switched[gpu.uuid]:
            for peer, count in switched.items():
                if peer != gpu.uuid and count:
                    links[peer] = links.get(peer, 0) + min(count, switched[gpu.uuid])
        result.append(dataclasses.replace(gpu, nvlinks=links))
    return tuple(result)


def _optional(nvml: Nvml, getter: Callable[[Any], int], handle: Any) -> int | None:
    try:
        return int(getter(handle))
    except nvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _normal_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' and '0000:19:00.0' -> '0000:19:00.0', lower case."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def _read_text(path: str) -> str | None:
    try:
        return pathlib.Path(path).read_text()
    except OSError:
        return None


class DiscoveryFailed(Exception):
    """The node's GPUs could not be read; `status` is the exit status the console scripts use
    (1: no NVML here, 2: a bad node file or a discovery error)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def load_node(node_file: str | None) -> tuple[inventory.NodeInventory, Any]:
    """The node's inventory, from `node_file` when given, else from NVML: (inventory, the NVML
    module to shut down later, or None). Raises DiscoveryFailed with a one-line message."""
    nvml = None
    try:
        if node_file:
            return nodefile.load(node_file), None
        nvml = load_pynvml()
        return discover(nvml), nvml
    except nodefile.NodeFileError as exc:
        raise DiscoveryFailed(f"node file error: {exc}", 2) from None
    except NvmlUnavailable as exc:
        raise DiscoveryFailed(f"{exc} (use --node-file for a simulated node)", 1) from None
    except Exception as exc:  # noqa: BLE001 - NVML failing mid-discovery, an inconsistent inventory
        if nvml is not None:
            nvml.nvmlShutdown()
        raise DiscoveryFailed(f"GPU discovery failed: {type(exc).__name__}: {exc}", 2) from None
