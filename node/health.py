"""GPU health: NVML XID events mark a GPU or MIG device unhealthy; a probe brings it back.

`HealthState` is the plain record (which GPU/MIG UUIDs are unhealthy, and a generation counter
servers wait on). `HealthMonitor` is the loop that feeds it from NVML:

* critical XID events (nvmlEventTypeXidCriticalError) mark the GPU, or the MIG device named by
  the event's GPU/compute instance ids, unhealthy; application XIDs (`health.ignoredXids`,
  by default 13, 31, 43, 45, 68, 109) are ignored, as NVIDIA's plugin does;
* an event for an unknown device, or a failing event wait, marks every device unhealthy;
* unlike NVIDIA's plugin (whose devices never recover), every `health.recoveryIntervalSeconds`
  each unhealthy device is probed: once it answers NVML normally (handle, UUID, memory info)
  and has raised no critical XID during a whole interval, it is healthy again.

NVML calls block, so they run on the monitor's own single worker thread. May import
gpuslice.config and gpuslice.node.{inventory,nvml_source}.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpuslice import config as config_
from gpuslice.node import inventory, nvml_source

__all__ = ["ALL", "HealthMonitor", "HealthState"]

log = logging.getLogger(__name__)

# Marks every device of the node: used when an event cannot be attributed.
ALL = "*"
_NOT_MIG_SPECIFIC = 0xFFFFFFFF


class HealthState:
    """Which GPU and MIG UUIDs are unhealthy. Changes bump `generation` and wake waiters."""

    def __init__(self) -> None:
        self.unhealthy: frozenset[str] = frozenset()
        self.reasons: dict[str, str] = {}
        self.generation = 0
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs after every change (servers re-send ListAndWatch)."""
        self._listeners.append(listener)

    def mark_unhealthy(self, uuid: str, reason: str) -> bool:
        if uuid in self.unhealthy:
            return False
        self.reasons[uuid] = reason
        self._set(self.unhealthy | {uuid})
        log.warning("%s is unhealthy: %s", "every device" if uuid == ALL else uuid, reason)
        return True

    def mark_healthy(self, uuid: str) -> bool:
        if uuid not in self.unhealthy:
            return False
        self.reasons.pop(uuid, None)
        self._set(self.unhealthy - {uuid})
        log.warning("%s is healthy again", "every device" if uuid == ALL else uuid)
        return True

    def is_unhealthy(self, *uuids: str) -> bool:
        """True if any of `uuids` (a device's GPU, its MIG device...) or the whole node is unhealthy."""
        unhealthy = self.unhealthy
        return bool(unhealthy) and (ALL in unhealthy or any(u in unhealthy for u in uuids))

    def _set(self, unhealthy: frozenset[str]) -> None:
        self.unhealthy = unhealthy
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()
        for listener in self._listeners:
            listener()

    async def wait_changed(self, generation: int) -> int:
        """Wait until the state is newer than `generation`; returns the new generation."""
        while self.generation == generation:
            await self._changed.wait()
        return self.generation


class HealthMonitor:
    """Feeds a HealthState from NVML events and recovery probes. Owns its tasks and thread."""

    def __init__(
        self,
        nvml: nvml_source.Nvml,
        node: inventory.NodeInventory,
        settings: config_.HealthConfig,
        state: HealthState,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.node = node
        self.settings = settings
        self.state = state
        self.clock = clock
        self._ignored = frozenset(settings.ignored_xids)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml-health")
        self._last_xid: dict[str, float] = {}  # uuid -> clock() of its last critical XID
        self._mig_ids: dict[str, dict[tuple[int, int], str]] = {}
        # GPU handles from registration; probes use these (nvml_source.device_handles says why).
        self._handles: dict[str, Any] = {}
        self._uuid_of_handle: dict[int, str] = {}  # a lost GPU may not tell its UUID any more
        self._event_set: Any = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if not self.settings.enabled:
            return
        await self._call(self._register_events)
        self._tasks = [
            asyncio.create_task(self._event_loop(), name="health-xid-events"),
            asyncio.create_task(self._recovery_loop(), name="health-recovery-probe"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        # A wait in progress ends within eventTimeoutMs; don't hold shutdown for it.
        event_set, self._event_set = self._event_set, None
        if event_set is not None:
            self._executor.submit(self._free, event_set)
        self._executor.shutdown(wait=False)

    def _free(self, event_set: Any) -> None:
        try:
            self.nvml.nvmlEventSetFree(event_set)
        except self.nvml.NVMLError:
            pass

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # --- events -------------------------------------------------------------------------

    def _register_events(self) -> None:
        nvml = self.nvml
        self._event_set = nvml.nvmlEventSetCreate()
        for gpu in self.node.gpus:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            self._handles[gpu.uuid] = handle
            self._uuid_of_handle[_handle_key(handle)] = gpu.uuid
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                mask = nvml.nvmlEventTypeXidCriticalError & supported
                if not mask:
                    log.warning("%s does not report XID events: health is not watched", gpu.uuid)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            except nvml.NVMLError as exc:
                log.warning("cannot watch XID events of %s: %s", gpu.uuid, exc)
                continue
            if gpu.mig_enabled:
                self._mig_ids[gpu.uuid] = nvml_source.mig_instance_ids(nvml, handle)

    async def _event_loop(self) -> None:
        while True:
            try:
                event = await self._call(self._wait_one)
            except Exception as exc:  # noqa: BLE001 - NVMLError or a broken driver: fail safe, keep watching
                # One lost GPU fails the whole event set's wait: mark the GPUs that no longer answer,
                # or every device when each of them still does (the failure is not theirs to name).
                silent = await self._call(self._silent_gpus)
                for uuid in silent or [ALL]:
                    self.state.mark_unhealthy(uuid, f"NVML event wait failed: {exc}")
                await asyncio.sleep(self.settings.recovery_interval_seconds)
                continue
            if event is not None:
                self.handle_event(event)

    def _wait_one(self) -> Any:
        """One event, or None when the wait timed out."""
        nvml = self.nvml
        try:
            return nvml.nvmlEventSetWait(self._event_set, self.settings.event_timeout_ms)
        except nvml.NVMLError as exc:
            if type(exc).__name__ == "NVMLError_Timeout":
                return None
            raise

    def handle_event(self, event: Any) -> str | None:
        """Apply one NVML event; returns the UUID marked unhealthy (ALL for the node) or None."""
        if not event.eventType & self.nvml.nvmlEventTypeXidCriticalError:
            return None
        xid = int(event.eventData)
        if xid in self._ignored:
            log.info("ignoring application XID %d", xid)
            return None
        target = self._target(event)
        self._last_xid[target] = self.clock()
        self.state.mark_unhealthy(target, f"XID {xid}")
        return target

    def _target(self, event: Any) -> str:
        try:
            uuid = self.nvml.nvmlDeviceGetUUID(event.device)
        except self.nvml.NVMLError:
            uuid = self._uuid_of_handle.get(_handle_key(event.device), ALL)
        known = {g.uuid for g in self.node.gpus}
        if uuid not in known:
            return ALL
        gi, ci = int(event.gpuInstanceId), int(event.computeInstanceId)
        if uuid in self._mig_ids and gi != _NOT_MIG_SPECIFIC:
            mig = self._mig_ids[uuid].get((gi, ci))
            if mig is None and ci == _NOT_MIG_SPECIFIC:
                mig = next((m for (g, _), m in self._mig_ids[uuid].items() if g == gi), None)
            return mig or uuid
        return uuid

    # --- recovery -----------------------------------------------------------------------

    async def _recovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.recovery_interval_seconds)
            await self.probe_once()

    async def probe_once(self) -> list[str]:
        """Probe every unhealthy device once; returns those that recovered."""
        recovered = []
        quiet_since = self.clock() - self.settings.recovery_interval_seconds
        for uuid in sorted(self.state.unhealthy):
            if self._last_xid.get(uuid, float("-inf")) > quiet_since:
                continue  # an XID within the last interval: too soon to trust it
            if await self._call(self._answers, uuid) and self.state.mark_healthy(uuid):
                recovered.append(uuid)
        return recovered

    def _silent_gpus(self) -> list[str]:
        """GPUs that do not answer a query through their handle now."""
        return [g.uuid for g in self.node.gpus if not self._answers(g.uuid)]

    def _answers(self, uuid: str) -> bool:
        nvml = self.nvml
        uuids: Iterable[str] = [g.uuid for g in self.node.gpus] if uuid == ALL else [uuid]
        try:
            for each in uuids:
                handle = self._handles.get(each) or nvml_source.device_handles(nvml).get(each)
                if handle is None:
                    return False
                if nvml.nvmlDeviceGetUUID(handle) != each:
                    return False
                nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError:
            return False
        return True


def _handle_key(handle: Any) -> int:
    """Identity of an NVML device handle: the address it points to (pynvml hands out a new
    ctypes pointer object per call), or the object itself for fakes."""
    try:
        return ctypes.addressof(handle.contents)
    except (AttributeError, TypeError, ValueError):
        return id(handle)
