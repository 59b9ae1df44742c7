"""The set of device plugins of one node: one PluginServer per resource, kept registered.

`build_resources` turns a NodeInventory (the `migStrategy` view of node/migstrategy.py)
and the Config into the resources we advertise: `<prefix>/gpu-memory` (memory units of every GPU
not in MIG mode) and one `<prefix>/mig-<profile>` per MIG profile present.

`PluginManager` serves and registers them all, then watches kubelet's device-plugin directory
(inotify, through watchfiles). Kubelet, when it restarts, deletes every plugin socket there and
re-creates kubelet.sock; a created or deleted kubelet.sock or plugin socket wakes the manager,
which compares the files' identities with what it served and registered with, and re-serves and
re-registers the affected plugins. A failed registration (kubelet not up yet) is retried with
backoff; a slow periodic pass is the safety net for what a watch can miss.

May import gpuslice.{backoff,config,timeouts}, gpuslice.deviceplugin.{allocation,health,inventory,metrics,
response,server} and watchfiles.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import threading
from collections.abc import Callable, Collection, Sequence

import watchfiles

from gpuslice import backoff, timeouts
from gpuslice import config as config_
from gpuslice.deviceplugin import server
from gpuslice.node import allocation, health, inventory, metrics, response

__all__ = ["KUBELET_SOCKET", "PluginManager", "build_resources"]

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
# The safety net's period: a full pass even when the watch reported nothing. A watch can miss a
# change: inotify drops events when its queue overflows, the directory can be replaced under a
# hostPath mount, and a change between the first pass and the watch starting is never reported.
RESYNC_SECONDS = 10.0
# Without a watch (inotify limits, a filesystem without it) the manager polls, this often.
FALLBACK_POLL_SECONDS = 0.5
# A failed registration is retried after this, doubling up to the safety net's period.
REGISTER_RETRY_SECONDS = 0.5


def build_resources(node: inventory.NodeInventory, settings: config_.Config) -> list[server.Resource]:
    """The resources a node advertises; none for a node without GPUs."""
    names = settings.contract
    numa_of_gpu = {g.uuid: g.numa_node for g in node.gpus}
    # a MIG device shared by units (migStrategy single) fails with its own XIDs and its GPU's
    failing_with = {g.uuid: (g.uuid, g.parent_uuid) if g.parent_uuid else (g.uuid,) for g in node.gpus}
    resources = []
    units = allocation.MemoryUnits(node, settings.memory_unit_mib)
    if units.device_ids:

        def allocate_units(
            device_ids: Sequence[str], unhealthy: Collection[str]
        ) -> response.api_pb2.ContainerAllocateResponse:
            return response.memory_response(units.grant(device_ids, unhealthy), settings)

        resources.append(
            server.Resource(
                name=names.gpu_memory_resource,
                device_ids=units.device_ids,
                health_units={d: failing_with[gpu] for d, gpu in units.gpu_of.items()},
                numa_nodes={d: numa_of_gpu[gpu] for d, gpu in units.gpu_of.items()},
                preferred=units.preferred,
                allocate=allocate_units,
            )
        )
    for profile in node.mig_profiles():
        resources.append(
            _mig_resource(allocation.MigSlices(node, profile), names.mig_resource(profile), numa_of_gpu, settings)
        )
    return resources


def _mig_resource(
    slices: allocation.MigSlices, name: str, numa_of_gpu: dict[str, int | None], settings: config_.Config
) -> server.Resource:
    def allocate_slices(
        device_ids: Sequence[str], unhealthy: Collection[str]
    ) -> response.api_pb2.ContainerAllocateResponse:
        return response.mig_response(slices.grant(device_ids, unhealthy), settings)

    return server.Resource(
        name=name,
        device_ids=slices.device_ids,
        # a MIG device fails with its own XIDs and with its parent GPU's
        health_units={uuid: (uuid, mig.parent_uuid) for uuid, mig in slices.devices.items()},
        numa_nodes={uuid: numa_of_gpu[mig.parent_uuid] for uuid, mig in slices.devices.items()},
        preferred=slices.preferred,
        allocate=allocate_slices,
    )


def _identity(path: pathlib.Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_ctime_ns


class PluginManager:
    """Serves every resource and keeps each registered with kubelet across kubelet restarts."""

    def __init__(
        self,
        resources: Sequence[server.Resource],
        *,
        kubelet_dir: str | os.PathLike[str],
        health_state: health.HealthState,
        plugin_metrics: metrics.Metrics,
        poll_interval: float = RESYNC_SECONDS,
    ) -> None:
        self.kubelet_dir = pathlib.Path(kubelet_dir)
        self.kubelet_socket = self.kubelet_dir / KUBELET_SOCKET
        self.poll_interval = poll_interval  # the safety net's period (RESYNC_SECONDS)
        self.servers = [
            server.PluginServer(
                r, socket_dir=self.kubelet_dir, health_state=health_state, plugin_metrics=plugin_metrics
            )
            for r in resources
        ]
        # kubelet.sock identity each server last registered with
        self._registered_with: dict[str, tuple[int, int] | None] = {}
        self._last_error: dict[str, str] = {}
        self._watch_task: asyncio.Task[None] | None = None
        # A threading.Event: the file watch's thread reads it to end its wait.
        self._stopping = threading.Event()
        self._wake = asyncio.Event()  # a watched file changed, or stop() was called
        self.registered_event = asyncio.Event()

    def add_allocation_listener(self, listener: Callable[[str], None]) -> None:
        """`listener(resource)` runs on the event loop after every successful Allocate (e.g. the
        node labeller's notify; health changes: HealthState.add_listener)."""
        for plugin in self.servers:
            plugin.allocation_listeners.append(listener)

    def registration_state(self) -> dict[str, bool]:
        """Resource name -> registered with the kubelet now running (for /readyz)."""
        return {s.resource.name: s.registered for s in self.servers}

    async def start(self) -> None:
        """Serve every resource, try to register, then keep watching the kubelet directory."""
        self._stopping.clear()
        self._wake.clear()
        await self.reconcile()
        self._watch_task = asyncio.create_task(self._watch(), name="deviceplugin-kubelet-watch")

    async def stop(self) -> None:
        """Stop watching, stop every server and remove its socket."""
        # Not task.cancel(): a pass interrupted inside gRPC's server start/stop leaves gRPC's
        # own shutdown task dangling. The watch ends at its next wake-up instead.
        self._stopping.set()
        self._wake.set()
        task, self._watch_task = self._watch_task, None
        if task is not None:
            await task
        await asyncio.gather(*(plugin.stop() for plugin in self.servers))

    async def _watch(self) -> None:
        """A pass on every reported change, on each retry of a failed registration, and every
        `poll_interval` (the safety net; FALLBACK_POLL_SECONDS when the directory is not watched)."""
        events = asyncio.create_task(self._watch_directory(), name="deviceplugin-kubelet-dir-events")
        retry = backoff.Backoff(REGISTER_RETRY_SECONDS, self.poll_interval)
        try:
            while not self._stopping.is_set():
                if all(s.registered for s in self.servers):
                    retry.reset()
                    timeout = self.poll_interval
                else:
                    timeout = retry.next()
                if events.done():  # the watch failed to start or ended: poll
                    timeout = min(timeout, FALLBACK_POLL_SECONDS)
                await timeouts.wait_at_most(self._wake.wait(), timeout)
                if self._stopping.is_set():
                    return
                self._wake.clear()
                try:
                    await self.reconcile()
                except Exception:  # keep watching; the next wake-up retries
                    log.exception("device plugin reconcile failed")
        finally:
            self._stopping.set()  # ends the watch's thread within its step (50 ms)
            await events

    async def _watch_directory(self) -> None:
        """Wake the manager when kubelet.sock or one of our sockets is created or deleted."""
        names = {KUBELET_SOCKET, *(s.socket_path.name for s in self.servers)}

        def ours(change: watchfiles.Change, path: str) -> bool:
            return pathlib.PurePath(path).name in names  # not kubelet's checkpoint writes

        try:
            async for _ in watchfiles.awatch(
                self.kubelet_dir, watch_filter=ours, stop_event=self._stopping, recursive=False
            ):
                self._wake.set()
        except Exception as exc:  # noqa: BLE001 - no watch (e.g. fs.inotify.max_user_watches): poll instead
            log.warning(
                "cannot watch %s (%s): looking every %.1f s instead", self.kubelet_dir, exc, FALLBACK_POLL_SECONDS
            )
            self._wake.set()

    async def reconcile(self) -> None:
        """One pass: re-serve plugins whose socket is gone or whose kubelet changed, register
        those not registered with the current kubelet."""
        kubelet = _identity(self.kubelet_socket)
        for plugin in self.servers:
            name = plugin.resource.name
            socket_gone = plugin.serving and plugin.socket_identity() != plugin.identity
            kubelet_changed = plugin.registered and self._registered_with.get(name) != kubelet
            if not plugin.serving or socket_gone or kubelet_changed:
                if plugin.serving:
                    log.info("%s: kubelet restarted (socket gone or kubelet.sock re-created): re-serving", name)
                await plugin.serve()
            if kubelet is None or (plugin.registered and self._registered_with.get(name) == kubelet):
                continue
            try:
                await plugin.register(self.kubelet_socket)
            except server.RegistrationError as exc:
                if self._last_error.get(name) != str(exc):
                    log.warning("%s (will retry)", exc)
                    self._last_error[name] = str(exc)
                continue
            self._last_error.pop(name, None)
            self._registered_with[name] = kubelet
        if self.servers and all(s.registered for s in self.servers):
            self.registered_event.set()
        else:
            self.registered_event.clear()
