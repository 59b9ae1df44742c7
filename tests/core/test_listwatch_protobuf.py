"""The compact pod watches ask the API server for protobuf, else JSON, and read whichever comes into
the same pods: a streamed list, a paged one, watch events and a 410; a server whose protobuf they
cannot read is read as JSON from then on, and nothing of the list is lost. Against an HTTP server
in this process that answers as the API server does (tests/e2e/test_real_control_plane.py: the
real one)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import kubernetes
import podwirekit
import pytest
from aiohttp import web

from gpuslice import config, listwatch, podwire
from gpuslice.controller import requeue
from gpuslice.node import nodepods
from gpuslice.pacer import controller
from gpuslice.webhook import cluster, nodewatch, waiting

PROTOBUF = "application/vnd.kubernetes.protobuf"


def pod(name: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {"gpuslice.io/gpu-memory": "4"}}}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


class FakePodServer:
    """GET /api/v1/pods as the API server answers it: JSON, or protobuf where the Accept header asks
    for it first and `protobuf` is on; lists paged or streamed; then watch events from `events`."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.protobuf = True
        self.stream = True  # answer sendInitialEvents (else 422, as without the WatchList feature)
        self.broken = 0  # send this many protobuf answers that cannot be read first
        self.events: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        self.accepts: list[tuple[str, str]] = []  # (list or watch, Accept) of every request

    def _protobuf(self, request: web.Request) -> bool:
        return self.protobuf and request.headers.get("Accept", "").startswith(PROTOBUF)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") == "true"
        self.accepts.append(("watch" if watch else "list", request.headers.get("Accept", "")))
        protobuf = self._protobuf(request)
        if not watch:
            start = int(request.query.get("continue") or 0)
            page, more = self.pods[start : start + 2], start + 2 < len(self.pods)
            token = str(start + 2) if more else ""
            if protobuf:
                body = podwirekit.pod_list(page, "50", token)
                if self.broken:
                    self.broken -= 1
                    body = body[:-3]
                return web.Response(body=body, content_type=PROTOBUF)
            metadata = {"resourceVersion": "50", **({"continue": token} if token else {})}
            return web.json_response({"kind": "PodList", "metadata": metadata, "items": page})
        initial = request.query.get("sendInitialEvents") == "true"
        if initial and not self.stream:
            return web.json_response({"kind": "Status", "code": 422, "message": "no WatchList"}, status=422)
        response = web.StreamResponse()
        response.content_type = PROTOBUF if protobuf else "application/json"
        if protobuf:
            response.headers["Content-Type"] = f"{PROTOBUF};stream=watch"
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            if not protobuf:
                await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            elif kind == "ERROR":
                status = podwirekit.pb.Status(code=obj["code"], reason=obj["reason"], status="Failure")
                await response.write(podwirekit.frame("ERROR", "Status", status.SerializeToString()))
            else:
                data = podwirekit.frame(kind, "Pod", podwirekit.encode_pod(obj))
                if self.broken:
                    self.broken -= 1
                    data = data[:4] + b"\xff" * (len(data) - 4)
                await response.write(data)

        if initial:
            for item in self.pods:
                await send("ADDED", item)
            if protobuf:
                await response.write(podwirekit.bookmark("50"))
            else:
                end = {"resourceVersion": "50", "annotations": {"k8s.io/initial-events-end": "true"}}
                await send("BOOKMARK", {"kind": "Pod", "metadata": end})
        while (event := await self.events.get()) is not None:
            await send(*event)
        await response.write_eof()
        return response


class Recorded(listwatch.PodWatch):
    def __init__(self, api: kubernetes.client.CoreV1Api, **options: Any) -> None:
        super().__init__(lambda: api, "pods", "status.phase=Pending", compact=True, **options)
        self.items: list[dict[str, Any]] = []
        self.applied: list[tuple[str, Any]] = []
        self.starts = 0  # lists begun

    def list_started(self) -> None:
        self.starts += 1

    def replace(self, items: Any) -> None:
        self.items = [dict(i) for i in items]

    def apply(self, kind: str, obj: Any) -> None:
        self.applied.append((kind, obj))


@pytest.fixture
async def served(aiohttp_server: Callable[..., Any]) -> AsyncIterator[tuple[FakePodServer, Any]]:
    fake = FakePodServer([pod(f"p{i}", node="n1" if i % 2 else "") for i in range(5)])
    app = web.Application()
    app.router.add_get("/api/v1/pods", fake.handle)
    running = await aiohttp_server(app)
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{running.port}"))
    try:
        yield fake, kubernetes.client.CoreV1Api(client)
    finally:
        fake.events.put_nowait(None)
        client.close()


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


async def read(fake: FakePodServer, api: Any, **options: Any) -> Recorded:
    """A watch run until it has listed and seen one event after the list."""
    while not fake.events.empty():  # what an earlier watch left
        fake.events.get_nowait()
    watch = Recorded(api, backoff_initial_seconds=0.01, **options)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.synced.wait(), 10)
        changed = copy.deepcopy(fake.pods[0])
        changed["spec"]["nodeName"] = "n9"
        fake.events.put_nowait(("MODIFIED", changed))
        await until(lambda: bool(watch.applied))
    finally:
        watch.stop()
        fake.events.put_nowait(None)
        await asyncio.wait_for(task, 10)
    return watch


def test_the_compact_pod_watches_ask_for_protobuf_first_and_the_others_for_json() -> None:
    settings = config.Config()
    view = cluster.ClusterView(settings.contract, default_gpu_memory_mib=81920)
    pacer = controller.Pacer(None, settings, registry=None)  # type: ignore[arg-type]
    protobuf = [
        pacer.pods,
        waiting.WaitingPods(None, view),
        waiting.RefusedPods(None, waiting.WaitingPods(None, view)),
    ]
    json_only = [
        pacer.nodes,
        nodewatch.NodeWatcher(None, view),
        nodepods.NodePods(lambda: None, "n1"),
        requeue.Requeuer(None, settings).failed,  # whole pods: it recreates them from their spec
    ]
    assert all(w._accept(True) and w._accept(False) for w in protobuf)
    assert not any(w._accept(True) or w._accept(False) for w in json_only)
    assert pacer.pods._accept(True) == podwire.ACCEPT_WATCH and pacer.pods._accept(False) == podwire.ACCEPT_LIST
    assert podwire.ACCEPT_LIST.endswith("application/json")  # JSON from a server without protobuf


@pytest.mark.parametrize("stream", [True, False], ids=["streamed-list", "paged-list"])
async def test_protobuf_and_json_give_the_watch_the_same_pods(served: Any, stream: bool) -> None:
    fake, api = served
    fake.stream = stream
    seen = await read(fake, api, stream_lists=True)
    assert all(accept.startswith(PROTOBUF) for _, accept in fake.accepts)
    fake.protobuf = False
    as_json = await read(fake, api, stream_lists=True)
    assert seen.items == as_json.items and len(seen.items) == 5
    assert seen.applied == as_json.applied and seen.applied[0][1]["spec"]["nodeName"] == "n9"


async def test_a_410_in_protobuf_makes_the_watch_list_again(served: Any) -> None:
    fake, api = served
    watch = Recorded(api, stream_lists=True, backoff_initial_seconds=0.01)
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.wait_for(watch.synced.wait(), 10)
        fake.pods.append(pod("late"))
        fake.events.put_nowait(("ERROR", {"code": 410, "reason": "Expired"}))
        await until(lambda: watch.lists == 2)
        assert {p["metadata"]["name"] for p in watch.items} == {"p0", "p1", "p2", "p3", "p4", "late"}
    finally:
        watch.stop()
        fake.events.put_nowait(None)
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed-list", "paged-list"])
async def test_protobuf_the_watch_cannot_read_is_read_as_json_from_then_on(served: Any, stream: bool) -> None:
    fake, api = served
    fake.stream = stream
    fake.broken = 1
    watch = await read(fake, api, stream_lists=True)
    assert not watch.protobuf and watch.failures == 1
    # the failed list and its retry (and the pages after a refused stream): the subclass heard of each
    assert watch.starts == (2 if stream else 3)
    assert len(watch.items) == 5  # the whole list, read again as JSON
    assert fake.accepts[-1][1] == "application/json"  # the client's own Accept
