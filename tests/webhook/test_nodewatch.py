"""The node watch against a local fake API server that speaks list + watch JSON as kube-apiserver
does (paged lists with continue tokens, chunked watch streams, 410 Gone, bookmarks)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import kubernetes
import pytest
from aiohttp import web

from gpuslice import config, kubeclient, listwatch
from gpuslice.webhook import cluster, nodewatch
from gpuslice.webhook import metrics as metrics_

CONTRACT = config.Config().contract


def node(name: str, memory_mib: int, gpus: int, *, free_units: int | None = None, version: int = 1) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        CONTRACT.label_gpu_product: f"GPU-{memory_mib}",
        CONTRACT.label_gpu_memory_mib: str(memory_mib),
        CONTRACT.label_gpu_count: str(gpus),
    }
    if free_units is not None:
        labels[CONTRACT.label_free_units] = str(free_units)
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": labels, "resourceVersion": str(version)},
    }


class FakeApiServer:
    """GET /api/v1/nodes: a paged list, or with ?watch=true a stream fed from `events`."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.list_failures = 0  # answer this many lists with 500 first
        self.lists = 0
        self.watches: list[str] = []  # resourceVersion of every watch
        self.page_size = 1
        # a watch with sendInitialEvents: "stream" (every node, then the end bookmark) or "refuse" (422,
        # as a server without the WatchList feature answers)
        self.initial_events = "stream"
        self.queries: list[dict[str, str]] = []  # every request's query
        self.on_request: Callable[[web.Request], None] = lambda _: None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        self.on_request(request)
        if request.query.get("watch") in ("true", "1", "True"):
            return await self._watch(request)
        if self.list_failures:
            self.list_failures -= 1
            return web.json_response({"kind": "Status", "code": 500, "message": "etcd hiccup"}, status=500)
        names = sorted(self.nodes)
        start = int(request.query.get("continue") or 0)
        if start == 0:
            self.lists += 1
        page = names[start : start + self.page_size]
        metadata: dict[str, Any] = {"resourceVersion": str(self.version)}
        if start + self.page_size < len(names):
            metadata["continue"] = str(start + self.page_size)
        return web.json_response(
            {"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": [self.nodes[n] for n in page]}
        )

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        self.watches.append(request.query.get("resourceVersion", ""))
        initial = request.query.get("sendInitialEvents") == "true"
        if initial and self.initial_events == "refuse":
            message = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
            return web.json_response({"kind": "Status", "code": 422, "message": message}, status=422)
        response = web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(request)
        if initial:
            for name in sorted(self.nodes):
                await response.write(json.dumps({"type": "ADDED", "object": self.nodes[name]}).encode() + b"\n")
            end = {"resourceVersion": str(self.version), "annotations": {"k8s.io/initial-events-end": "true"}}
            bookmark = {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": end}}
            await response.write(json.dumps(bookmark).encode() + b"\n")
        while True:
            event = await self.events.get()
            if event is None:  # end this watch (as the server's timeoutSeconds would)
                break
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    def change(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        if kind == "DELETED":
            self.nodes.pop(obj["metadata"]["name"], None)
        else:
            self.nodes[obj["metadata"]["name"]] = obj
        self.events.put_nowait({"type": kind, "object": obj})


@pytest.fixture
async def apiserver(
    aiohttp_server: Callable[..., Any],
) -> AsyncIterator[tuple[FakeApiServer, kubernetes.client.CoreV1Api]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get("/api/v1/nodes", fake.handle)
    running = await aiohttp_server(app)
    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{running.port}")
    api_client = kubernetes.client.ApiClient(configuration)
    try:
        yield fake, kubernetes.client.CoreV1Api(api_client)
    finally:
        fake.events.put_nowait(None)
        api_client.close()


@pytest.fixture
def view() -> cluster.ClusterView:
    return cluster.ClusterView(CONTRACT, default_gpu_memory_mib=81920)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


async def run_watcher(watcher: nodewatch.NodeWatcher) -> asyncio.Task[None]:
    return asyncio.create_task(watcher.run(), name="test-node-watch")


async def stop_watcher(watcher: nodewatch.NodeWatcher, task: asyncio.Task[None], fake: FakeApiServer) -> None:
    watcher.stop()
    async with asyncio.timeout(10):
        await task  # returns by itself: the open watch stream is shut down


def memory_of(view: cluster.ClusterView) -> dict[int, tuple[int, int]]:
    return {c.memory_mib: (c.gpus, c.free_units) for c in view.classes()}


async def test_a_paged_list_then_watch_events_keep_the_view_current(apiserver: Any, view: cluster.ClusterView) -> None:
    fake, api = apiserver
    for name in ("a", "b", "c"):
        fake.nodes[name] = node(name, 81920, 2)
    fake.nodes["cpu"] = {"kind": "Node", "metadata": {"name": "cpu", "labels": {"kubernetes.io/os": "linux"}}}
    watcher = nodewatch.NodeWatcher(api, view)
    task = await run_watcher(watcher)
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        assert memory_of(view) == {81920: (6, 6 * 320)}
        await until(lambda: len(fake.watches) == 1)
        assert fake.watches == ["100"]  # the list's resourceVersion
        fake.change("MODIFIED", node("a", 81920, 2, free_units=100))
        fake.change("ADDED", node("big", 143771, 8))
        fake.change("DELETED", node("c", 81920, 2))
        fake.events.put_nowait({"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "200"}}})
        await until(lambda: len(view.classes()) == 2 and memory_of(view)[81920][0] == 4)
        assert memory_of(view) == {81920: (4, 100 + 2 * 320), 143771: (8, 8 * 561)}
        fake.events.put_nowait(None)  # the server ends the watch: the watcher resumes from the bookmark
        await until(lambda: len(fake.watches) == 2)
        assert fake.watches[1] == "200" and fake.lists == 1
    finally:
        await stop_watcher(watcher, task, fake)


async def test_410_gone_on_the_watch_makes_the_watcher_relist(apiserver: Any, view: cluster.ClusterView) -> None:
    fake, api = apiserver
    fake.nodes["a"] = node("a", 81920, 2)
    watcher = nodewatch.NodeWatcher(api, view)
    task = await run_watcher(watcher)
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        await until(lambda: len(fake.watches) == 1)
        # Changes the watcher never sees as events, then the watch expires.
        fake.nodes = {"b": node("b", 40960, 4)}
        fake.events.put_nowait({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}})
        await until(lambda: watcher.lists == 2)
        assert memory_of(view) == {40960: (4, 4 * 160)}  # "a" is gone, "b" is known
    finally:
        await stop_watcher(watcher, task, fake)


async def test_list_errors_are_retried_with_backoff_and_the_view_syncs_afterwards(
    apiserver: Any, view: cluster.ClusterView
) -> None:
    fake, api = apiserver
    fake.nodes["a"] = node("a", 81920, 2)
    fake.list_failures = 2
    watcher = nodewatch.NodeWatcher(api, view, backoff_initial_seconds=0.01)
    task = await run_watcher(watcher)
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        assert fake.list_failures == 0 and view.known
    finally:
        await stop_watcher(watcher, task, fake)


async def test_stop_ends_the_watcher_while_a_watch_stream_is_open(apiserver: Any, view: cluster.ClusterView) -> None:
    fake, api = apiserver
    watcher = nodewatch.NodeWatcher(api, view)
    task = await run_watcher(watcher)
    await asyncio.wait_for(watcher.synced.wait(), 10)
    await until(lambda: len(fake.watches) == 1)
    await stop_watcher(watcher, task, fake)
    assert task.done() and task.exception() is None
    assert not view.known  # no GPU nodes: the webhook falls back to defaultGpuMemoryMiB


def test_without_a_cluster_or_kubeconfig_there_is_no_api(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kubeclient.core_api_from_flag(None) is None


def test_a_kubeconfig_file_gives_an_api_for_its_server(tmp_path: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    api = kubeclient.core_api_from_flag(str(kubeconfig))
    assert api is not None and api.api_client.configuration.host == "https://10.0.0.1:6443"
    api.api_client.close()


async def test_a_node_with_unbelievable_labels_is_left_out_logged_and_counted(
    apiserver: Any, view: cluster.ClusterView, caplog: pytest.LogCaptureFixture
) -> None:
    fake, api = apiserver
    fake.nodes["good"] = node("good", 81920, 2)
    fake.nodes["good"]["status"] = {"capacity": {CONTRACT.gpu_memory_resource: "640"}, "allocatable": {}}
    fake.nodes["good"]["status"]["allocatable"] = dict(fake.nodes["good"]["status"]["capacity"])
    fake.nodes["huge"] = node("huge", 81920, 2)
    fake.nodes["huge"]["metadata"]["labels"][CONTRACT.label_gpu_memory_mib] = "9" * 20
    metrics = metrics_.Metrics()
    metrics.track_untrusted_nodes(lambda: view.untrusted)
    watcher = nodewatch.NodeWatcher(api, view)
    task = await run_watcher(watcher)
    try:
        with caplog.at_level(logging.WARNING, logger="gpuslice.webhook.nodewatch"):
            await asyncio.wait_for(watcher.synced.wait(), 10)
        assert memory_of(view) == {81920: (2, 640)}
        assert any("node huge" in r.getMessage() and "malformed-label" in r.getMessage() for r in caplog.records)
        body = metrics.exposition()[0].decode()
        assert 'gpuslice_webhook_untrusted_nodes{node="huge",reason="malformed-label"} 1.0' in body
        # The plugin on "good" dies: kubelet's allocatable drops to 0 while the labels still say free.
        dead = node("good", 81920, 2)
        dead["status"] = {"capacity": {CONTRACT.gpu_memory_resource: "640"}, "allocatable": {"cpu": "8"}}
        fake.change("MODIFIED", dead)
        fake.change("DELETED", node("huge", 81920, 2))
        await until(lambda: memory_of(view) == {81920: (2, 0)} and "huge" not in view.untrusted)
        assert view.untrusted["good"][0] == "device-plugin-down"
    finally:
        await stop_watcher(watcher, task, fake)


class RecordingNodes(nodewatch.NodeWatcher):
    """A node watch that records what reached it, to see what `keep` handed on."""

    def __init__(self, api: Any, view: cluster.ClusterView) -> None:
        super().__init__(api, view)
        self.replaced: list[Any] = []
        self.applied: list[Any] = []

    def replace(self, items: Any) -> None:
        self.replaced = list(items)
        super().replace(items)

    def apply(self, kind: str, obj: Any) -> None:
        self.applied.append(obj)
        super().apply(kind, obj)


def kubelet_node(name: str) -> dict[str, Any]:
    """A node as kubelet writes it: images, conditions and managed fields beside our labels."""
    obj = node(name, 81920, 2)
    obj["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    obj["status"] = {
        "allocatable": {CONTRACT.gpu_memory_resource: "640", "cpu": "32"},
        "capacity": {CONTRACT.gpu_memory_resource: "640", "cpu": "32"},
        "images": [{"names": [f"registry.example/image-{i}:v1"], "sizeBytes": 10**9} for i in range(50)],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return obj


async def test_lists_are_paged_consistent_reads_and_only_what_is_kept_is_handed_on(
    apiserver: Any, view: cluster.ClusterView
) -> None:
    fake, api = apiserver
    for name in ("a", "b", "c"):
        fake.nodes[name] = kubelet_node(name)
    watcher = RecordingNodes(api, view)
    task = await run_watcher(watcher)
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        lists = [q for q in fake.queries if "watch" not in q]
        # three pages of one, never a whole list from the watch cache (resourceVersion "0")
        assert [q.get("continue", "") for q in lists] == ["", "1", "2"]
        assert all(q["limit"] == "500" and "resourceVersion" not in q for q in lists)
        assert [n["metadata"]["name"] for n in watcher.replaced] == ["a", "b", "c"]
        assert all(set(n["status"]) == {"allocatable", "capacity"} for n in watcher.replaced)
        assert all("managedFields" not in n["metadata"] for n in watcher.replaced)
        assert memory_of(view) == {81920: (6, 6 * 320)}
        fake.change("MODIFIED", kubelet_node("d"))
        await until(lambda: len(watcher.applied) == 1)
        assert set(watcher.applied[0]["status"]) == {"allocatable", "capacity"}
        assert memory_of(view) == {81920: (8, 8 * 320)}
    finally:
        await stop_watcher(watcher, task, fake)


async def test_stop_during_a_list_ends_the_watch_without_reading_the_rest(
    apiserver: Any, view: cluster.ClusterView
) -> None:
    fake, api = apiserver
    for name in ("a", "b", "c"):
        fake.nodes[name] = node(name, 81920, 2)
    watcher = RecordingNodes(api, view)
    fake.on_request = lambda _: watcher.stop()  # the first page is read, then nothing more
    async with asyncio.timeout(10):
        await watcher.run()
    assert [q.get("continue", "") for q in fake.queries] == [""]
    assert not watcher.synced.is_set() and watcher.failures == 0


class StreamedNodes(RecordingNodes):
    """A node watch that reads its lists as a stream and records the pages handed to `listed`."""

    def __init__(self, api: Any, view: cluster.ClusterView) -> None:
        super().__init__(api, view)
        self.stream_lists = True
        self.pages: list[int] = []

    def listed(self, page: Any) -> None:
        self.pages.append(len(page))
        super().listed(page)


async def test_a_list_read_as_a_stream_is_handed_on_a_page_at_a_time_then_watched_from_its_bookmark(
    apiserver: Any, view: cluster.ClusterView, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, api = apiserver
    monkeypatch.setattr(listwatch, "_LIST_PAGE", 2)
    for name in ("a", "b", "c"):
        fake.nodes[name] = kubelet_node(name)
    watcher = StreamedNodes(api, view)
    task = await run_watcher(watcher)
    try:
        await asyncio.wait_for(watcher.synced.wait(), 10)
        first = fake.queries[0]
        assert first["watch"] == "true" and first["sendInitialEvents"] == "true"
        assert first["resourceVersionMatch"] == "NotOlderThan" and "resourceVersion" not in first
        assert first["allowWatchBookmarks"] == "true"
        assert watcher.pages == [2, 1]  # a page at a time, the last one at the bookmark
        assert [n["metadata"]["name"] for n in watcher.replaced] == ["a", "b", "c"]
        assert all(set(n["status"]) == {"allocatable", "capacity"} for n in watcher.replaced)
        assert memory_of(view) == {81920: (6, 6 * 320)}
        await until(lambda: fake.watches == ["", "100"])  # the watch goes on from the bookmark's version
        fake.change("MODIFIED", kubelet_node("d"))
        await until(lambda: len(watcher.applied) == 1)
        assert memory_of(view) == {81920: (8, 8 * 320)} and watcher.stream_lists
    finally:
        await stop_watcher(watcher, task, fake)


async def test_a_server_that_does_not_stream_lists_is_read_in_pages_from_then_on(
    apiserver: Any, view: cluster.ClusterView, caplog: pytest.LogCaptureFixture
) -> None:
    fake, api = apiserver
    fake.initial_events = "refuse"
    for name in ("a", "b"):
        fake.nodes[name] = node(name, 81920, 2)
    watcher = StreamedNodes(api, view)
    with caplog.at_level(logging.INFO, logger="gpuslice.listwatch"):
        task = await run_watcher(watcher)
        try:
            await asyncio.wait_for(watcher.synced.wait(), 10)
            assert not watcher.stream_lists and watcher.failures == 0
            assert [q.get("continue", "") for q in fake.queries if "watch" not in q] == ["", "1"]
            assert memory_of(view) == {81920: (4, 4 * 320)}
            assert "does not stream lists (HTTP 422" in caplog.text
        finally:
            await stop_watcher(watcher, task, fake)


async def test_stop_during_a_streamed_list_ends_the_watch_without_a_list(
    apiserver: Any, view: cluster.ClusterView
) -> None:
    fake, api = apiserver
    fake.nodes["a"] = node("a", 81920, 2)
    watcher = StreamedNodes(api, view)
    fake.on_request = lambda _: watcher.stop()
    async with asyncio.timeout(10):
        await watcher.run()
    assert not watcher.synced.is_set() and watcher.failures == 0 and watcher.lists == 0
