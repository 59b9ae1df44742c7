"""A fake API server for the steering labeller (node/labeller.py): the node it patches, and the
node's pods, served as kube-apiserver serves them (merge patches, list + watch JSON); and `pod`, a
pod with its requests and phase. The labeller's and the node pod watch's tests and the device
plugin's shutdown test use it."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from aiohttp import web

from gpuslice import contract

NODE = "gpu-node-1"
OPERATOR_LABEL = contract.Contract().label_node_enabled


@dataclasses.dataclass
class FakeApiServer:
    labels: dict[str, str] = dataclasses.field(default_factory=lambda: {OPERATOR_LABEL: "true"})
    patches: list[dict[str, str | None]] = dataclasses.field(default_factory=list)
    fail_next: int = 0  # answer this many PATCHes with 500
    hang_next: int = 0  # leave this many PATCHes unanswered past the client's timeout
    content_types: list[str] = dataclasses.field(default_factory=list)
    allocatable: dict[str, str] | None = None  # None: GET of the node and its pods is not served
    pods: list[dict] = dataclasses.field(default_factory=list)
    pod_queries: list[str] = dataclasses.field(default_factory=list)  # field selectors of lists and watches
    pod_lists: int = 0
    pod_watches: int = 0
    pod_events: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)  # sent to open watches

    async def get_node(self, request: web.Request) -> web.Response:
        if self.allocatable is None or request.match_info["name"] != NODE:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": self.labels}}
        return web.json_response({**node, "status": {"allocatable": self.allocatable}})

    async def list_pods(self, request: web.Request) -> web.Response:
        if self.allocatable is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        self.pod_queries.append(request.query.get("fieldSelector", ""))
        if request.query.get("watch") in ("true", "1"):
            self.pod_watches += 1
            stream = web.StreamResponse()
            await stream.prepare(request)
            while request.transport is not None and not request.transport.is_closing():
                try:
                    event = await asyncio.wait_for(self.pod_events.get(), 0.05)
                except TimeoutError:
                    continue
                await stream.write(json.dumps(event).encode() + b"\n")
            return stream
        self.pod_lists += 1
        metadata = {"resourceVersion": "1"}
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": metadata, "items": self.pods})

    async def patch_node(self, request: web.Request) -> web.Response:
        if request.match_info["name"] != NODE:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        self.content_types.append(request.content_type)
        body = await request.json()
        if self.hang_next:
            self.hang_next -= 1
            await asyncio.sleep(3)
        if self.fail_next:
            self.fail_next -= 1
            return web.json_response(
                {"kind": "Status", "code": 500, "message": "etcdserver: timeout"},
                status=500,
            )
        patch = body["metadata"]["labels"]
        self.patches.append(patch)
        for key, value in patch.items():  # JSON merge patch: null deletes
            if value is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = value
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": self.labels},
        }
        return web.json_response(node)


def pod(phase: str, cpu: str, memory: str, *, init_cpu: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "a", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if init_cpu is not None:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": init_cpu}}}]
    return {"spec": spec, "status": {"phase": phase}}
