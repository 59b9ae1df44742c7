"""One kubelet device plugin for one resource: a thin grpc.aio DevicePlugin servicer on its own
unix socket. Allocation policy, container responses and health live elsewhere; this module
only speaks v1beta1.

Life of a `PluginServer`: `serve()` removes a stale socket, starts gRPC and dials itself to
confirm it answers; `register()` then calls kubelet's Registration service (never before
serving: kubelet dials back at once); `stop()` stops gRPC and removes the socket.
ListAndWatch streams the full device list and re-sends it on every health change.

May import gpuslice.{config,contract,timeouts}, the generated v1beta1 stubs and
gpuslice.deviceplugin.{allocation,health,metrics}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence

import grpc

from gpuslice import timeouts
from gpuslice.node import allocation, health, metrics
from gpuslice.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

__all__ = ["API_VERSION", "HEALTHY", "UNHEALTHY", "PluginServer", "RegistrationError", "Resource"]

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# How long to wait for our own socket, and for kubelet's Register answer.
_DIAL_TIMEOUT_S = 5.0
_STOP_GRACE_S = 0.5


class RegistrationError(RuntimeError):
    """Kubelet refused or could not be reached for Register."""


@dataclasses.dataclass(frozen=True)
class Resource:
    """One extended resource: its devices and how to allocate them (built by manager.py).

    `health_units[d]` lists the GPU/MIG UUIDs whose failure makes device `d` unhealthy.
    `preferred(available, must_include, size)` answers GetPreferredAllocation;
    `allocate(device_ids, unhealthy_device_ids)` answers one container of Allocate or raises
    allocation.AllocationError.
    """

    name: str
    device_ids: tuple[str, ...]
    health_units: Mapping[str, tuple[str, ...]]
    numa_nodes: Mapping[str, int | None]
    preferred: Callable[[Sequence[str], Sequence[str], int], list[str]]
    allocate: Callable[[Sequence[str], Collection[str]], api_pb2.ContainerAllocateResponse]

    @property
    def socket_name(self) -> str:
        """'gpuslice.io/mig-1g.10gb' -> 'gpuslice.io-mig-1g.10gb.sock'."""
        return self.name.replace("/", "-") + ".sock"


class PluginServer:
    """The DevicePlugin gRPC service of one resource, on `<socket_dir>/<resource socket name>`."""

    def __init__(
        self,
        resource: Resource,
        *,
        socket_dir: str | os.PathLike[str],
        health_state: health.HealthState,
        plugin_metrics: metrics.Metrics,
    ) -> None:
        self.resource = resource
        self.socket_path = pathlib.Path(socket_dir) / resource.socket_name
        self.health_state = health_state
        self.metrics = plugin_metrics
        self.registered = False
        self.identity: tuple[int, int] | None = None  # of the socket we made
        self.closing = asyncio.Event()  # set by stop(): ends ListAndWatch streams at once
        # called with the resource name after every successful Allocate (node labels refresh)
        self.allocation_listeners: list[Callable[[str], None]] = []
        self._server: grpc.aio.Server | None = None
        self._snapshot_generation = -1
        self._snapshot: tuple[api_pb2.ListAndWatchResponse, frozenset[str]] | None = None
        # device IDs by the GPU/MIG UUID that decides their health
        self._devices_of_unit: dict[str, list[str]] = {}
        for device_id, units in resource.health_units.items():
            for unit in units:
                self._devices_of_unit.setdefault(unit, []).append(device_id)

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self._server is not None

    def socket_identity(self) -> tuple[int, int] | None:
        """(inode, ctime) of our socket file, or None if it is gone (kubelet deleted it)."""
        try:
            stat = self.socket_path.stat()
        except FileNotFoundError:
            return None
        return stat.st_ino, stat.st_ctime_ns

    async def serve(self) -> None:
        """Start gRPC on a fresh socket and confirm it answers."""
        if self._server is not None:
            await self.stop()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # stale, from a previous run
        self.closing = asyncio.Event()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self.identity = self.socket_identity()
        self.snapshot()  # device gauges from the start, not from kubelet's first call
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}") as channel:
            if not await timeouts.wait_at_most(channel.channel_ready(), _DIAL_TIMEOUT_S):
                await self.stop()
                raise RuntimeError(f"{self.resource.name}: own socket {self.socket_path} does not answer") from None
        log.info("%s: serving on %s", self.resource.name, self.socket_path)

    async def register(self, kubelet_socket: str | os.PathLike[str]) -> None:
        """Register with kubelet; RegistrationError says why it failed."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource.name,
            options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        self.registered = False
        try:
            async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
                await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=_DIAL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.metrics.registrations.labels(self.resource.name, "failed").inc()
            raise RegistrationError(
                f"{self.resource.name}: kubelet at {kubelet_socket} refused registration: {exc.details()}"
            ) from None
        self.registered = True
        self.metrics.registrations.labels(self.resource.name, "ok").inc()
        log.info("%s: registered with kubelet (%d devices)", self.resource.name, len(self.resource.device_ids))

    async def stop(self) -> None:
        """Stop serving (open streams end) and remove the socket."""
        server, self._server = self._server, None
        self.registered = False
        self.closing.set()
        if server is not None:
            await server.stop(_STOP_GRACE_S)
            # gRPC may already have unlinked it; never remove a socket a newer server made
            if self.socket_identity() == self.identity:
                self.socket_path.unlink(missing_ok=True)

    # --- device list --------------------------------------------------------------------

    def unhealthy_devices(self) -> frozenset[str]:
        return self.snapshot()[1]

    def snapshot(self) -> tuple[api_pb2.ListAndWatchResponse, frozenset[str]]:
        """The current ListAndWatch message and unhealthy device set, rebuilt only when health
        changes (4,500 devices take a few ms to build; Allocate needs them on every call)."""
        state = self.health_state
        if self._snapshot is None or self._snapshot_generation != state.generation:
            unhealthy_units = state.unhealthy
            if health.ALL in unhealthy_units:
                unhealthy = frozenset(self.resource.device_ids)
            else:
                unhealthy = frozenset(d for unit in unhealthy_units for d in self._devices_of_unit.get(unit, ()))
            message = api_pb2.ListAndWatchResponse()
            for device_id in self.resource.device_ids:
                device = message.devices.add(ID=device_id, health=UNHEALTHY if device_id in unhealthy else HEALTHY)
                numa = self.resource.numa_nodes.get(device_id)
                if numa is not None:
                    device.topology.nodes.add(ID=numa)
            self._snapshot = (message, unhealthy)
            self._snapshot_generation = state.generation
            self.metrics.set_devices(self.resource.name, len(self.resource.device_ids) - len(unhealthy), len(unhealthy))
        return self._snapshot


class _Servicer(api_pb2_grpc.DevicePluginServicer):
    """v1beta1.DevicePlugin for one PluginServer: decodes, delegates, maps errors."""

    def __init__(self, plugin: PluginServer) -> None:
        self.plugin = plugin

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        state = self.plugin.health_state
        closing = self.plugin.closing
        while not closing.is_set():
            generation = state.generation
            message, _ = self.plugin.snapshot()
            yield message
            changed = asyncio.ensure_future(state.wait_changed(generation))
            closed = asyncio.ensure_future(closing.wait())
            try:
                await asyncio.wait([changed, closed], return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                closed.cancel()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        resource = self.plugin.resource
        response = api_pb2.PreferredAllocationResponse()
        for container in request.container_requests:
            self.plugin.metrics.preferred.labels(resource.name).inc()
            chosen = resource.preferred(
                container.available_deviceIDs, container.must_include_deviceIDs, container.allocation_size
            )
            response.container_responses.add(deviceIDs=chosen)
        return response

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        resource = self.plugin.resource
        unhealthy = self.plugin.unhealthy_devices()
        response = api_pb2.AllocateResponse()
        try:
            # every container first: a rejected request leaves nothing half-answered
            answers = [resource.allocate(c.devices_ids, unhealthy) for c in request.container_requests]
        except allocation.AllocationError as exc:
            self.plugin.metrics.allocations.labels(resource.name, "rejected").inc()
            log.warning("%s: Allocate rejected: %s", resource.name, exc)
            # A refusal means the scheduler acted on labels that over-promised: refresh them now.
            for listener in self.plugin.allocation_listeners:
                listener(resource.name)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{resource.name}: {exc}")
        self.plugin.metrics.allocations.labels(resource.name, "ok").inc(len(answers))
        response.container_responses.extend(answers)
        for listener in self.plugin.allocation_listeners:
            listener(resource.name)
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
