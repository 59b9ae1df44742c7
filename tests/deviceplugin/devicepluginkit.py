"""Helpers shared by the device plugin's tests: the resources of the demo node as kubelet sees
them, a free loopback port for the plugin's HTTP server, a fake API server for the usage monitor's
calls (its node's pods, Events, the Eviction API) reached through the official client, and a real
process the kill policy may kill."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
from collections.abc import AsyncIterator

import kubernetes
import pytest
from aiohttp import web

from gpuslice.deviceplugin import podapi

NODE = "gpu-node-1"


DEMO_RESOURCES = {
    "gpuslice.io/gpu-memory": "gpuslice.io-gpu-memory.sock",
    "gpuslice.io/mig-1g.10gb": "gpuslice.io-mig-1g.10gb.sock",
    "gpuslice.io/mig-2g.20gb": "gpuslice.io-mig-2g.20gb.sock",
    "gpuslice.io/mig-3g.40gb": "gpuslice.io-mig-3g.40gb.sock",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_json(uid: str, name: str, containers: dict[str, str], namespace: str = "team") -> dict:
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name},
        "spec": {"nodeName": NODE},
        "status": {
            "containerStatuses": [{"name": n, "containerID": f"containerd://{cid}"} for n, cid in containers.items()]
        },
    }


@dataclasses.dataclass
class FakeApiServer:
    pods: list[dict] = dataclasses.field(default_factory=list)
    events: list[dict] = dataclasses.field(default_factory=list)
    evictions: list[tuple[str, str, dict]] = dataclasses.field(default_factory=list)
    pod_list_selectors: list[str] = dataclasses.field(default_factory=list)
    eviction_status: int = 201  # 429: a PodDisruptionBudget refuses
    event_status: int = 201

    async def list_pods(self, request: web.Request) -> web.Response:
        self.pod_list_selectors.append(request.query.get("fieldSelector", ""))
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": self.pods})

    async def create_event(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.event_status != 201:
            return web.json_response({"kind": "Status", "code": self.event_status}, status=self.event_status)
        assert body["metadata"]["namespace"] == request.match_info["namespace"]
        self.events.append(body)
        return web.json_response(body, status=201)

    async def evict(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.evictions.append((request.match_info["namespace"], request.match_info["name"], body))
        if self.eviction_status != 201:
            message = "Cannot evict pod as it would violate the pod's disruption budget."
            return web.json_response(
                {"kind": "Status", "code": self.eviction_status, "reason": "TooManyRequests", "message": message},
                status=self.eviction_status,
            )
        return web.json_response({"kind": "Status", "code": 201, "status": "Success"}, status=201)


@pytest.fixture(name="api_server")
async def api_server_fixture(aiohttp_server) -> AsyncIterator[tuple[FakeApiServer, podapi.KubernetesPodApi]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/pods", fake.list_pods)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", fake.create_event)
    app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/eviction", fake.evict)
    server = await aiohttp_server(app, host="127.0.0.1")
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}"
    api_client = kubernetes.client.ApiClient(configuration)
    yield fake, podapi.KubernetesPodApi(api_client, timeout_seconds=2)
    api_client.close()


@pytest.fixture(name="victim")
async def victim_fixture() -> AsyncIterator[asyncio.subprocess.Process]:
    """A real process the kill policy may kill."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
