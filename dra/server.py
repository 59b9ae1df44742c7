"""The DRA plugin's gRPC side: kubelet plugin registration and the DRAPlugin service.

Two grpc.aio servers on two unix sockets, as kubelet expects them:
* the DRA socket, `<kubelet plugins dir>/<driver>/dra.sock`, serving
  k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin and ...v1beta1.DRAPlugin (the same calls; kubelet
  1.34-1.37 pick v1, older ones v1beta1);
* the registration socket, `<kubelet plugins_registry dir>/<driver>-reg.sock`, serving
  pluginregistration.Registration: kubelet's plugin watcher finds the socket, calls GetInfo
  (type "DRAPlugin", name = driver, endpoint = the DRA socket's path, supported versions
  "v1.DRAPlugin" and "v1beta1.DRAPlugin"), dials the endpoint and reports with
  NotifyRegistrationStatus.
The DRA socket serves before the registration socket exists (kubelet dials back at once), and
on stop the registration socket goes first. Preparing is the Preparer's job; this module only
decodes, delegates and encodes.

May import the generated dra and pluginregistration stubs, gpuslice.timeouts and gpuslice.dra.preparer.
"""

from __future__ import annotations

import logging
import os
import pathlib
from types import ModuleType
from typing import Any

import grpc

from gpuslice import timeouts
from gpuslice.dra import preparer as preparer_
from gpuslice.proto.dra.v1 import api_pb2 as v1
from gpuslice.proto.dra.v1 import api_pb2_grpc as v1_grpc
from gpuslice.proto.dra.v1beta1 import api_pb2 as v1beta1
from gpuslice.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from gpuslice.proto.pluginregistration.v1 import api_pb2 as registration
from gpuslice.proto.pluginregistration.v1 import api_pb2_grpc as registration_grpc

__all__ = ["PLUGIN_TYPE", "SUPPORTED_VERSIONS", "DraServer"]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
_DIAL_TIMEOUT_S = 5.0
_STOP_GRACE_S = 1.0


def _claims(request: Any) -> list[preparer_.ClaimRef]:
    return [preparer_.ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]


class _DraServicer:
    """DRAPlugin for one message module (v1 or v1beta1): the Preparer does the work."""

    def __init__(self, plugin: DraServer, messages: ModuleType) -> None:
        self.plugin = plugin
        self.messages = messages

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        claims = _claims(request)
        results = await self.plugin.preparer.prepare(claims)
        answer = self.messages.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = answer.claims[uid]
            if result.error:
                entry.error = result.error
                self.plugin.count("prepare", "error")
                continue
            for device in result.devices:
                fields: dict[str, Any] = {
                    "request_names": list(device.requests),
                    "pool_name": device.pool,
                    "device_name": device.device,
                    "cdi_device_ids": list(device.cdi_ids),
                }
                if device.share_id and "share_id" in self.messages.Device.DESCRIPTOR.fields_by_name:
                    fields["share_id"] = device.share_id
                entry.devices.append(self.messages.Device(**fields))
            self.plugin.count("prepare", "ok")
        return answer

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        errors = await self.plugin.preparer.unprepare(_claims(request))
        answer = self.messages.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            answer.claims[uid].error = error
            self.plugin.count("unprepare", "error" if error else "ok")
        return answer


class _V1Servicer(_DraServicer, v1_grpc.DRAPluginServicer):
    pass


class _V1beta1Servicer(_DraServicer, v1beta1_grpc.DRAPluginServicer):
    pass


class _RegistrationServicer(registration_grpc.RegistrationServicer):
    def __init__(self, plugin: DraServer) -> None:
        self.plugin = plugin

    async def GetInfo(
        self, request: registration.InfoRequest, context: grpc.aio.ServicerContext
    ) -> registration.PluginInfo:
        return registration.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.plugin.driver,
            endpoint=str(self.plugin.dra_socket),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self, request: registration.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> registration.RegistrationStatusResponse:
        self.plugin.registered = request.plugin_registered
        self.plugin.registration_error = request.error
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", self.plugin.driver)
        else:
            log.error("kubelet refused DRA driver %s: %s", self.plugin.driver, request.error or "(no reason given)")
        self.plugin.count("registration", "ok" if request.plugin_registered else "refused")
        return registration.RegistrationStatusResponse()


class DraServer:
    """Both sockets of one DRA driver; `start()` then `stop()`."""

    def __init__(
        self,
        preparer: preparer_.Preparer,
        *,
        driver: str,
        plugin_dir: str | os.PathLike[str],
        registry_dir: str | os.PathLike[str],
        counter: Any = None,
    ) -> None:
        self.preparer = preparer
        self.driver = driver
        self.dra_socket = pathlib.Path(plugin_dir) / "dra.sock"
        self.registration_socket = pathlib.Path(registry_dir) / f"{driver}-reg.sock"
        self.registered: bool | None = None  # None until kubelet reports
        self.registration_error = ""
        self._counter = counter  # prometheus Counter labelled (call, result), or None
        self._dra: grpc.aio.Server | None = None
        self._registration: grpc.aio.Server | None = None

    def count(self, call: str, result: str) -> None:
        if self._counter is not None:
            self._counter.labels(call, result).inc()

    async def start(self) -> None:
        self._dra = await self._serve(self.dra_socket, self._add_dra_services)
        self._registration = await self._serve(self.registration_socket, self._add_registration)
        log.info(
            "DRA driver %s: serving %s, registering through %s", self.driver, self.dra_socket, self.registration_socket
        )

    def _add_dra_services(self, server: grpc.aio.Server) -> None:
        v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(self, v1), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1Servicer(self, v1beta1), server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        registration_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)

    async def _serve(self, socket: pathlib.Path, add: Any) -> grpc.aio.Server:
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.unlink(missing_ok=True)  # stale, from a previous run
        server = grpc.aio.server()
        add(server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            if not await timeouts.wait_at_most(channel.channel_ready(), _DIAL_TIMEOUT_S):
                await server.stop(None)
                raise RuntimeError(f"DRA driver {self.driver}: own socket {socket} does not answer") from None
        return server

    async def stop(self) -> None:
        """Registration socket first (kubelet stops calling), then the DRA socket."""
        for attribute, socket in (("_registration", self.registration_socket), ("_dra", self.dra_socket)):
            server = getattr(self, attribute)
            setattr(self, attribute, None)
            if server is not None:
                await server.stop(_STOP_GRACE_S)
                socket.unlink(missing_ok=True)
