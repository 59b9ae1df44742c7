"""A kubelet emulator that speaks kubelet's real gRPC protocols over real unix sockets, for the
tests and the demo (no cluster needed). It plays exactly kubelet's side, as
../shared/reference/deviceplugin-api.md and podresources-api.md describe it:

* on start it cleans the device-plugin directory (every non-directory file except
  kubelet_internal_checkpoint) and serves v1beta1.Registration on `<dir>/kubelet.sock`;
* Register checks the API version and that the resource is an extended resource name, dials
  the plugin's endpoint, calls GetDevicePluginOptions (a failure fails Register), then consumes
  ListAndWatch into a `devicemanager.ResourceDevices` in the background;
  a plugin that goes away has its devices treated as unhealthy;
* `allocate(resource, size, owner)` is kubelet's devicesToAllocate + Allocate:
  GetPreferredAllocation only if the plugin said so, keep the preferred IDs that are available,
  fill from arbitrary available ones when short, call Allocate, record the result; a gRPC error
  becomes an AdmissionError carrying the plugin's message;
* `restart()` emulates a kubelet restart: stop, clean the directory, serve a new kubelet.sock;
  allocations survive (kubelet's checkpoint), devices count 0 until the plugin re-registers;
* a PodResources v1 server (List, GetAllocatableResources, Get) on its own socket answers
  from what was allocated, with device IDs exactly as advertised and, as kubelet does, one
  ContainerDevices entry per device (with its NUMA node when the plugin reported one).

Owner keys are "namespace/pod/container" ("pod/container" means namespace "default").
May import gpuslice.sim.devicemanager and the generated stubs; nothing from deviceplugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Self

import grpc

from gpuslice.proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gpuslice.proto.podresources.v1 import api_pb2 as pr_pb2
from gpuslice.proto.podresources.v1 import api_pb2_grpc as pr_grpc
from gpuslice.sim import devicemanager

__all__ = ["AdmissionError", "Kubelet", "is_extended_resource_name", "owner_parts"]

AdmissionError = devicemanager.AdmissionError

SUPPORTED_VERSIONS = ("v1beta1",)
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
_DIAL_TIMEOUT_S = 10.0

_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName: a qualified `domain/name`, not in kubernetes.io, not
    prefixed `requests.`."""
    domain, sep, short = name.partition("/")
    if not sep or name.startswith("requests.") or domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return bool(_DNS_SUBDOMAIN.match(domain) and _QUALIFIED_NAME.match(short))


def owner_parts(owner: str) -> tuple[str, str, str]:
    """'ns/pod/ctr' -> (ns, pod, ctr); 'pod/ctr' -> ('default', pod, ctr); 'pod' -> ('default', pod, pod)."""
    parts = owner.split("/")
    if len(parts) >= 3:
        return parts[0], parts[1], "/".join(parts[2:])
    if len(parts) == 2:
        return "default", parts[0], parts[1]
    return "default", owner, owner


class _Endpoint:
    """Kubelet's connection to one registered plugin."""

    def __init__(self, resource: str, socket: pathlib.Path, channel: grpc.aio.Channel) -> None:
        self.resource = resource
        self.socket = socket
        self.channel = channel
        self.stub = api_pb2_grpc.DevicePluginStub(channel)
        self.options = api_pb2.DevicePluginOptions()
        self.task: asyncio.Task[None] | None = None
        self.connected = True

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.channel.close()


class Kubelet:
    """Use as `async with Kubelet(dir) as kubelet:`; every task and socket is gone on exit."""

    def __init__(
        self, plugin_dir: str | os.PathLike[str], pod_resources_socket: str | os.PathLike[str] | None = None
    ) -> None:
        self.plugin_dir = pathlib.Path(plugin_dir)
        self.socket = self.plugin_dir / KUBELET_SOCKET
        self.pod_resources_socket = pathlib.Path(
            pod_resources_socket or self.plugin_dir.parent / "pod-resources" / KUBELET_SOCKET
        )
        self.resources: dict[str, devicemanager.ResourceDevices] = {}  # survives restarts (checkpoint)
        self.topology: dict[str, dict[str, tuple[int, ...]]] = {}  # resource -> device -> NUMA nodes
        self.endpoints: dict[str, _Endpoint] = {}
        self.registrations: list[api_pb2.RegisterRequest] = []  # every accepted Register, in order
        self.rejected_registrations: list[tuple[api_pb2.RegisterRequest, str]] = []
        self.list_and_watch_messages: dict[str, int] = {}  # resource -> messages received
        self._server: grpc.aio.Server | None = None
        self._pod_resources_server: grpc.aio.Server | None = None
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- lifecycle ----------------------------------------------------------------------

    def clean_plugin_dir(self) -> list[str]:
        """What kubelet does at start: remove every non-directory file except the checkpoint."""
        removed = []
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.plugin_dir.iterdir():
            if entry.name != CHECKPOINT and not entry.is_dir():
                entry.unlink(missing_ok=True)
                removed.append(entry.name)
        return sorted(removed)

    async def start(self) -> None:
        self.clean_plugin_dir()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.unlink(missing_ok=True)
        pod_resources = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), pod_resources)
        pod_resources.add_insecure_port(f"unix://{self.pod_resources_socket}")
        await pod_resources.start()
        self._pod_resources_server = pod_resources

    async def stop(self) -> None:
        """Kubelet goes away: servers stop, plugin connections close."""
        for server in (self._server, self._pod_resources_server):
            if server is not None:
                await server.stop(0)
        self._server = self._pod_resources_server = None
        endpoints, self.endpoints = self.endpoints, {}
        for endpoint in endpoints.values():
            await endpoint.close()
        self.socket.unlink(missing_ok=True)
        self.pod_resources_socket.unlink(missing_ok=True)

    async def restart(self) -> None:
        """A kubelet restart: plugin sockets deleted, kubelet.sock re-created, allocations kept,
        every resource at 0 devices until its plugin registers again."""
        await self.stop()
        for devices in self.resources.values():
            devices.update({})
        await self.start()
        await self._notify()

    # --- waiting ------------------------------------------------------------------------

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until `predicate()` holds (checked after every registration and ListAndWatch
        message); TimeoutError if it does not within `timeout` seconds."""

        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        async with asyncio.timeout(timeout):
            await wait()

    async def wait_for_resource(self, resource: str, devices: int | None = None, timeout: float = 10.0) -> None:
        """Wait until `resource` is registered and (optionally) has `devices` healthy devices."""

        def ready() -> bool:
            known = self.resources.get(resource)
            if resource not in self.endpoints or known is None or not self.list_and_watch_messages.get(resource):
                return False
            return devices is None or known.allocatable == devices

        await self.wait_until(ready, timeout)

    # --- registration -------------------------------------------------------------------

    async def _register(self, request: api_pb2.RegisterRequest) -> str | None:
        """Kubelet's Register; returns an error message, or None when accepted."""
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported versions are {list(SUPPORTED_VERSIONS)}"
            )
        if not is_extended_resource_name(request.resource_name):
            return f"the ResourceName {request.resource_name!r} is invalid"
        if not request.endpoint or "/" in request.endpoint:
            return f"invalid endpoint {request.endpoint!r}: a socket file name in {self.plugin_dir}"
        socket = self.plugin_dir / request.endpoint
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        endpoint = _Endpoint(request.resource_name, socket, channel)
        try:
            async with asyncio.timeout(_DIAL_TIMEOUT_S):
                await channel.channel_ready()
            endpoint.options = await endpoint.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=_DIAL_TIMEOUT_S)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            await channel.close()
            return f"failed to dial device plugin {socket}: {exc}"
        old = self.endpoints.pop(request.resource_name, None)
        if old is not None:
            await old.close()
        self.resources.setdefault(request.resource_name, devicemanager.ResourceDevices(request.resource_name))
        self.endpoints[request.resource_name] = endpoint
        self.registrations.append(request)
        endpoint.task = asyncio.create_task(
            self._list_and_watch(endpoint), name=f"kubelet-listandwatch-{request.resource_name}"
        )
        await self._notify()
        return None

    async def _list_and_watch(self, endpoint: _Endpoint) -> None:
        devices = self.resources[endpoint.resource]
        try:
            async for message in endpoint.stub.ListAndWatch(api_pb2.Empty()):
                devices.update({d.ID: d.health == "Healthy" for d in message.devices})
                self.topology[endpoint.resource] = {
                    d.ID: tuple(n.ID for n in d.topology.nodes) for d in message.devices
                }
                self.list_and_watch_messages[endpoint.resource] = (
                    self.list_and_watch_messages.get(endpoint.resource, 0) + 1
                )
                await self._notify()
        except grpc.aio.AioRpcError:
            pass
        # the stream ended: the plugin is gone, its devices count as unhealthy
        endpoint.connected = False
        devices.mark_all_unhealthy()
        await self._notify()

    # --- allocation ---------------------------------------------------------------------

    async def allocate(
        self, resource: str, size: int, owner: str, reusable: Sequence[str] = ()
    ) -> api_pb2.AllocateResponse:
        """Allocate `size` devices of `resource` to container `owner`, as kubelet does at
        container creation. AdmissionError when kubelet would fail the pod."""
        async with self._lock:
            endpoint = self.endpoints.get(resource)
            if endpoint is None or not endpoint.connected:
                raise AdmissionError(f"cannot allocate unregistered device {resource}")
            devices = self.resources[resource]
            available, must_include = devices.preferred_request(size, reusable)
            preferred: list[str] = []
            if endpoint.options.get_preferred_allocation_available:
                request = api_pb2.PreferredAllocationRequest()
                request.container_requests.add(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
                try:
                    answer = await endpoint.stub.GetPreferredAllocation(request)
                    preferred = list(answer.container_responses[0].deviceIDs)
                except grpc.aio.AioRpcError:
                    preferred = []  # kubelet logs it and falls back to arbitrary devices
            chosen = devices.choose(size, preferred, reusable)
            request_allocate = api_pb2.AllocateRequest()
            request_allocate.container_requests.add(devices_ids=chosen)
            try:
                response = await endpoint.stub.Allocate(request_allocate)
            except grpc.aio.AioRpcError as exc:
                raise AdmissionError(
                    f"Allocate failed due to rpc error: code = {exc.code().name} desc = {exc.details()}, "
                    "which is unexpected"
                ) from None
            devices.commit(owner, chosen)
            return response

    def release(self, owner: str) -> dict[str, list[str]]:
        """The owner's container ended: its devices return, by resource."""
        freed = {}
        for name, devices in self.resources.items():
            ids = devices.release(owner)
            if ids:
                freed[name] = ids
        return freed

    def allocated(self, owner: str) -> dict[str, tuple[str, ...]]:
        return {name: d.allocated[owner] for name, d in self.resources.items() if owner in d.allocated}

    # --- PodResources -------------------------------------------------------------------

    def _container_devices(self, resource: str, device_ids: Iterable[str]) -> list[pr_pb2.ContainerDevices]:
        topology = self.topology.get(resource, {})
        entries = []
        for device_id in sorted(device_ids):
            nodes = topology.get(device_id, ())
            if not nodes:
                entries.append(pr_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id]))
            for node in nodes:
                entries.append(
                    pr_pb2.ContainerDevices(
                        resource_name=resource,
                        device_ids=[device_id],
                        topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=node)]),
                    )
                )
        return entries

    def pod_resources(self) -> list[pr_pb2.PodResources]:
        pods: dict[tuple[str, str], dict[str, list[pr_pb2.ContainerDevices]]] = {}
        for name in sorted(self.resources):
            for owner, ids in self.resources[name].allocated.items():
                namespace, pod, container = owner_parts(owner)
                containers = pods.setdefault((namespace, pod), {})
                containers.setdefault(container, []).extend(self._container_devices(name, ids))
        return [
            pr_pb2.PodResources(
                name=pod,
                namespace=namespace,
                containers=[pr_pb2.ContainerResources(name=c, devices=d) for c, d in sorted(containers.items())],
            )
            for (namespace, pod), containers in sorted(pods.items())
        ]

    def allocatable_devices(self) -> list[pr_pb2.ContainerDevices]:
        entries = []
        for name in sorted(self.resources):
            entries.extend(self._container_devices(name, self.resources[name].healthy))
        return entries


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext) -> api_pb2.Empty:
        problem = await self.kubelet._register(request)
        if problem is not None:
            self.kubelet.rejected_registrations.append((request, problem))
            await self.kubelet._notify()
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        return api_pb2.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    async def List(
        self, request: pr_pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr_pb2.ListPodResourcesResponse:
        return pr_pb2.ListPodResourcesResponse(pod_resources=self.kubelet.pod_resources())

    async def GetAllocatableResources(
        self, request: pr_pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr_pb2.AllocatableResourcesResponse:
        return pr_pb2.AllocatableResourcesResponse(devices=self.kubelet.allocatable_devices())

    async def Get(
        self, request: pr_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr_pb2.GetPodResourcesResponse:
        for pod in self.kubelet.pod_resources():
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr_pb2.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )
        raise AssertionError("unreachable")
