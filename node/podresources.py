"""Client of kubelet's PodResources v1 API (grpc.aio over its unix socket): which device IDs
of our resources kubelet has assigned to running pods, and which it can still allocate.

Kubelet never tells a device plugin that a pod ended; this record is the only place releases
show up, so the labeller reads it after every allocation and on a timer. Facts used:
../shared/reference/podresources-api.md (List, GetAllocatableResources; device_ids are
exactly the IDs the plugin advertised; the socket is re-created when kubelet restarts, so we
dial the path, never a file descriptor).

May import the generated stubs in gpuslice.proto.podresources.v1; nothing else of gpuslice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Self

import grpc

from gpuslice.proto.podresources.v1 import api_pb2, api_pb2_grpc

__all__ = ["DEFAULT_SOCKET", "Client", "ContainerDevices", "PodResourcesError"]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# kubelet answers List for every pod of the node; big nodes exceed gRPC's 4 MiB default.
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodResourcesError(RuntimeError):
    """Kubelet's PodResources API could not be read (socket missing, kubelet restarting, timeout)."""


@dataclasses.dataclass(frozen=True)
class ContainerDevices:
    """The devices of one resource that kubelet has assigned to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class Client:
    """One channel to kubelet's PodResources socket; use as an async context manager."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_seconds: float = 5.0) -> None:
        self.socket_path = socket_path
        self._timeout = timeout_seconds
        self._channel = grpc.aio.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _list(self) -> api_pb2.ListPodResourcesResponse:
        try:
            return await self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise PodResourcesError(
                f"PodResources List on {self.socket_path}: {exc.code().name}: {exc.details()}"
            ) from None

    async def container_devices(self, wanted: Callable[[str], bool]) -> list[ContainerDevices]:
        """Every (container, resource) holding devices of a resource `wanted` accepts, with the
        device IDs: who holds which units (the usage monitor joins this with NVML's processes)."""
        response = await self._list()
        return [
            ContainerDevices(pod.namespace, pod.name, container.name, entry.resource_name, tuple(entry.device_ids))
            for pod in response.pod_resources
            for container in pod.containers
            for entry in container.devices
            if wanted(entry.resource_name) and entry.device_ids
        ]

    async def devices_in_use(self, wanted: Callable[[str], bool]) -> dict[str, set[str]]:
        """Resource name -> device IDs kubelet has assigned to some container, for the resources
        `wanted` accepts (init containers included: kubelet lists them too while they hold devices)."""
        response = await self._list()
        in_use: dict[str, set[str]] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                _collect(container.devices, wanted, in_use)
        return in_use

    async def allocatable_devices(self, wanted: Callable[[str], bool]) -> dict[str, set[str]] | None:
        """Resource name -> device IDs kubelet may allocate (healthy ones), or None where kubelet
        does not offer GetAllocatableResources (before 1.21, or disabled)."""
        try:
            response = await self._stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (
                grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.PERMISSION_DENIED,
            ):
                return None
            raise PodResourcesError(
                f"PodResources GetAllocatableResources on {self.socket_path}: {exc.code().name}: {exc.details()}"
            ) from None
        allocatable: dict[str, set[str]] = {}
        _collect(response.devices, wanted, allocatable)
        return allocatable


def _collect(
    devices: Iterable[api_pb2.ContainerDevices],
    wanted: Callable[[str], bool],
    into: dict[str, set[str]],
) -> None:
    for entry in devices:
        if wanted(entry.resource_name):
            into.setdefault(entry.resource_name, set()).update(entry.device_ids)
