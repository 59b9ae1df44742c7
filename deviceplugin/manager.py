"""The set of device plugins of one node: one PluginServer per resource, kept registered.

`build_resources` turns a NodeInventory (the `migStrategy` view of deviceplugin/migstrategy.py)
and the Config into the resources we advertise: `<prefix>/gpu-memory` (memory units of every GPU
not in MIG mode) and one `<prefix>/mig-<profile>` per MIG profile present.

`PluginManager` serves and registers them all, then watches kubelet's device-plugin
directory. Kubelet, when it restarts, deletes every plugin socket there and re-creates
kubelet.sock; the manager notices either (polling the two files' identities every
`poll_interval` seconds: no inotify dependency, and it also catches the case where kubelet.sock
came back before we looked) and re-serves and re-registers the affected plugins. A failed
registration (kubelet not up yet) is retried on the next poll.

May import gpuslice.config and gpuslice.deviceplugin.{allocation,health,metrics,response,server}.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections.abc import Callable, Collection, Sequence

from gpuslice import config as config_
from gpuslice.deviceplugin import allocation, health, inventory, metrics, response, server

__all__ = ["KUBELET_SOCKET", "PluginManager", "build_resources"]

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"


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
        poll_interval: float = 0.5,
    ) -> None:
        self.kubelet_dir = pathlib.Path(kubelet_dir)
        self.kubelet_socket = self.kubelet_dir / KUBELET_SOCKET
        self.poll_interval = poll_interval
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
        self._stopping = asyncio.Event()
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
        await self.reconcile()
        self._watch_task = asyncio.create_task(self._watch(), name="deviceplugin-kubelet-watch")

    async def stop(self) -> None:
        """Stop watching, stop every server and remove its socket."""
        # Not task.cancel(): a pass interrupted inside gRPC's server start/stop leaves gRPC's
        # own shutdown task dangling. The watch ends at its next wake-up instead.
        self._stopping.set()
        task, self._watch_task = self._watch_task, None
        if task is not None:
            await task
        await asyncio.gather(*(plugin.stop() for plugin in self.servers))

    async def _watch(self) -> None:
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), self.poll_interval)
                return
            except TimeoutError:
                pass
            try:
                await self.reconcile()
            except Exception:  # keep watching; the next poll retries
                log.exception("device plugin reconcile failed")

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
