"""The node labeller against real local servers: kubelet's PodResources v1 API served by grpc.aio
on a unix socket (kubelet's side emulated from the reference: List, GetAllocatableResources), and
a fake API server (aiohttp on loopback) speaking PATCH /api/v1/nodes/<name> with a JSON merge
patch, reached through the official kubernetes client. The API server can fail on demand."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable

import grpc
import kubernetes
import prometheus_client
import pytest
from aiohttp import web
from labellerkit import NODE, OPERATOR_LABEL, FakeApiServer, pod

from gpuslice import config, contract
from gpuslice.node import allocation, health, labeller, labels, migstrategy, nodefile
from gpuslice.proto.podresources.v1 import api_pb2, api_pb2_grpc

CONTRACT = contract.Contract()


# --- kubelet's side: PodResources v1 ------------------------------------------------------


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List from `pods` (pod name -> resource -> device IDs), like kubelet does."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, list[str]]] = {}
        self.allocatable: dict[str, list[str]] | None = None  # None: UNIMPLEMENTED (old kubelet)
        self.lists = 0

    async def List(self, request, context):
        self.lists += 1
        response = api_pb2.ListPodResourcesResponse()
        for name, resources in sorted(self.pods.items()):
            pod = response.pod_resources.add(name=name, namespace="default")
            container = pod.containers.add(name="main")
            for resource, ids in resources.items():
                container.devices.add(resource_name=resource, device_ids=ids)
        return response

    async def GetAllocatableResources(self, request, context):
        if self.allocatable is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not offered")
        response = api_pb2.AllocatableResourcesResponse()
        for resource, ids in self.allocatable.items():
            response.devices.add(resource_name=resource, device_ids=ids)
        return response


@dataclasses.dataclass
class KubeletSocket:
    path: str
    kubelet: FakeKubelet
    server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self.kubelet, self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None


@pytest.fixture
async def kubelet_socket() -> AsyncIterator[KubeletSocket]:
    directory = tempfile.mkdtemp(prefix="gs-pr-", dir="/tmp")  # unix socket paths must stay short
    socket = KubeletSocket(path=f"{directory}/kubelet.sock", kubelet=FakeKubelet())
    await socket.start()
    try:
        yield socket
    finally:
        await socket.stop()
        shutil.rmtree(directory, ignore_errors=True)


# --- the API server's side: PATCH /api/v1/nodes/<name> ------------------------------------


@pytest.fixture
async def api_server(
    aiohttp_server,
) -> tuple[FakeApiServer, labeller.KubernetesNodeApi]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_patch("/api/v1/nodes/{name}", fake.patch_node)
    app.router.add_get("/api/v1/nodes/{name}", fake.get_node)
    app.router.add_get("/api/v1/pods", fake.list_pods)
    server = await aiohttp_server(app, host="127.0.0.1")
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}"
    api_client = kubernetes.client.ApiClient(configuration)
    yield fake, labeller.KubernetesNodeApi(api_client, timeout_seconds=0.5)
    api_client.close()


# --- helpers ------------------------------------------------------------------------------


def steering_settings(*, min_interval: float = 0.01, poll: float = 60.0) -> config.Config:
    return config.load(
        overrides={
            "steering.labelMinIntervalSeconds": min_interval,
            "steering.podResourcesPollSeconds": poll,
        },
        environ={},
    )


async def eventually(condition: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Wait for `condition` (a bound on failure, not a speed check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.01)


class Running:
    """A labeller task that is always cancelled and awaited."""

    def __init__(self, instance: labeller.NodeLabeller) -> None:
        self.labeller = instance
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> labeller.NodeLabeller:
        self.task = asyncio.create_task(self.labeller.run(), name="test-node-labeller")
        return self.labeller

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def units_of(node, gpu_index: int, count: int, start: int = 0) -> list[str]:
    gpu = node.memory_gpus[gpu_index].uuid
    return [contract.unit_device_id(gpu, i, contract.DEFAULT_UNIT_MIB) for i in range(start, start + count)]


def per_gpu(node) -> int:
    return CONTRACT.units_per_gpu(node.memory_gpus[0].memory_mib)


def make(node, socket, api, **options) -> labeller.NodeLabeller:
    settings = options.pop("settings", steering_settings())
    return labeller.NodeLabeller(
        node=node,
        settings=settings,
        node_name=NODE,
        pod_resources_socket=socket.path,
        api=api,
        **options,
    )


# --- behaviour ----------------------------------------------------------------------------


async def test_labels_reflect_kubelets_record_and_leave_operator_labels_alone(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    mig = next(m for m in demo_node.mig_devices())
    kubelet_socket.kubelet.pods = {
        "half": {CONTRACT.gpu_memory_resource: units_of(demo_node, 0, 160)},
        "slice": {CONTRACT.mig_resource(mig.profile): [mig.uuid]},
        "cpu-thing": {"example.com/other": ["x"]},
    }
    async with Running(make(demo_node, kubelet_socket, api)):
        await eventually(lambda: CONTRACT.label_free_block_units in fake.labels, "first label write")
    expected = labels.node_labels(
        demo_node,
        CONTRACT,
        allocated={demo_node.memory_gpus[0].uuid: 160},
        allocated_mig={mig.uuid},
    )
    assert {k: v for k, v in fake.labels.items() if k != OPERATOR_LABEL} == expected
    assert fake.labels[OPERATOR_LABEL] == "true"
    assert fake.labels[CONTRACT.label_free_partial_block_units] == str(per_gpu(demo_node) - 160)
    assert fake.labels[CONTRACT.label_free_gpus] == "1"
    assert set(fake.content_types) == {"application/merge-patch+json"}


async def test_an_allocation_is_published_on_notify_without_waiting_for_the_poll(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    async with Running(make(demo_node, kubelet_socket, api, settings=steering_settings(poll=3600))) as running:
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "initial labels")
        kubelet_socket.kubelet.pods["whole"] = {
            CONTRACT.gpu_memory_resource: units_of(demo_node, 1, per_gpu(demo_node))
        }
        running.notify()
        await eventually(
            lambda: fake.labels.get(CONTRACT.label_free_gpus) == "1",
            "allocation after notify",
        )
    # Only changed labels travel, with the totals the free counts are read against.
    assert CONTRACT.label_gpu_product not in fake.patches[-1]
    assert fake.patches[-1][CONTRACT.label_free_units] == str(per_gpu(demo_node))
    assert fake.patches[-1][CONTRACT.label_gpu_count] == "2"


async def test_a_release_is_published_by_the_poll_alone(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    kubelet_socket.kubelet.pods["whole"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 0, per_gpu(demo_node))}
    async with Running(make(demo_node, kubelet_socket, api, settings=steering_settings(poll=0.02))):
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "1", "allocated")
        del kubelet_socket.kubelet.pods["whole"]  # kubelet never tells the plugin
        await eventually(
            lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2",
            "release seen by polling",
        )


async def test_a_burst_of_releases_is_coalesced_and_the_last_state_is_written(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    for i in range(20):
        kubelet_socket.kubelet.pods[f"pod-{i}"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 0, 4, 4 * i)}
    settings = steering_settings(min_interval=1.0, poll=0.01)
    async with Running(make(demo_node, kubelet_socket, api, settings=settings)):
        full = str(per_gpu(demo_node) - 80)
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_partial_block_units) == full, "first write")
        for i in range(20):  # releases: only the poll sees them, and they only under-promise
            del kubelet_socket.kubelet.pods[f"pod-{i}"]
            await asyncio.sleep(0.02)
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "last state")
    assert len(fake.patches) <= 3, fake.patches  # 20 changes inside one interval: one or two writes after the first


async def test_every_allocation_in_a_burst_is_written_at_once(demo_node, kubelet_socket, api_server):
    # Each share taken lowers the free total and the partly used block, which steer the next
    # pods' preferences: no allocation waits for the rate limit, however many come in its interval.
    fake, api = api_server
    settings = steering_settings(min_interval=3600, poll=3600)
    async with Running(make(demo_node, kubelet_socket, api, settings=settings)) as running:
        await eventually(lambda: len(fake.patches) == 1, "first write")
        for i in range(5):
            kubelet_socket.kubelet.pods[f"pod-{i}"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 0, 4, 4 * i)}
            running.notify()
            left = str(per_gpu(demo_node) - 4 * (i + 1))
            await eventually(
                lambda left=left: fake.labels.get(CONTRACT.label_free_partial_block_units) == left, f"share {i}"
            )
    assert len(fake.patches) == 6


async def test_labels_that_over_promise_are_corrected_at_once_and_releases_wait_for_the_rate_limit(
    demo_node, kubelet_socket, api_server
):
    fake, api = api_server
    settings = steering_settings(min_interval=3600, poll=0.02)
    async with Running(make(demo_node, kubelet_socket, api, settings=settings)) as running:
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "first write")
        # A whole H100 taken: the node's labels still offer two free GPUs, which the scheduler would
        # act on for an hour. Written at once, inside the rate limit.
        kubelet_socket.kubelet.pods["whole"] = {
            CONTRACT.gpu_memory_resource: units_of(demo_node, 1, per_gpu(demo_node))
        }
        running.notify()
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "1", "tightening write")
        # A MIG slice taken: its free count drops, also at once.
        mig = next(m for m in demo_node.mig_devices() if m.profile == "3g.40gb")
        kubelet_socket.kubelet.pods["mig"] = {CONTRACT.mig_resource("3g.40gb"): [mig.uuid]}
        running.notify()
        await eventually(lambda: fake.labels.get(CONTRACT.label_mig_free("3g.40gb")) == "0", "MIG write")
        writes = len(fake.patches)
        # Releases only under-promise: they wait for the rate limit's slot.
        del kubelet_socket.kubelet.pods["whole"]
        await asyncio.sleep(0.3)
        assert fake.labels.get(CONTRACT.label_free_gpus) == "1" and len(fake.patches) == writes


async def test_api_server_errors_are_retried_with_backoff_until_written(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    fake.fail_next = 3
    registry = prometheus_client.CollectorRegistry()
    kubelet_socket.kubelet.pods["a"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 1, 100)}
    async with Running(make(demo_node, kubelet_socket, api, registry=registry)) as running:
        # The fake API server holds the labels before the labeller has read its answer: wait for both.
        await eventually(
            lambda: CONTRACT.label_free_block_units in fake.labels and running.writes > 0,
            "written after failures",
        )
        assert running.write_errors == 3 and running.writes == 1
        assert registry.get_sample_value("gpuslice_node_label_writes_total", {"result": "error"}) == 3
        assert registry.get_sample_value("gpuslice_node_label_writes_total", {"result": "ok"}) == 1
        assert fake.labels[CONTRACT.label_free_partial_block_units] == str(per_gpu(demo_node) - 100)
        # Writes succeed again and the labeller keeps following kubelet.
        kubelet_socket.kubelet.pods.clear()
        running.notify()
        await eventually(
            lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2",
            "follows after recovery",
        )


async def test_a_clean_exit_removes_every_published_label_in_one_patch(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    fake.labels["example.com/other"] = "kept"
    kubelet_socket.kubelet.pods["a"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 1, 100)}
    instance = make(demo_node, kubelet_socket, api, usage=lambda: 70)
    async with Running(instance):
        await eventually(lambda: CONTRACT.label_placement_score in fake.labels, "labels written")
    patches = len(fake.patches)
    assert await instance.shutdown() is True
    assert len(fake.patches) == patches + 1
    assert set(fake.patches[-1].values()) == {None}
    assert fake.labels == {OPERATOR_LABEL: "true", "example.com/other": "kept"}


async def test_a_failed_removal_at_exit_is_reported_not_raised(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    instance = make(demo_node, kubelet_socket, api)
    async with Running(instance):
        await eventually(lambda: CONTRACT.label_free_units in fake.labels, "labels written")
    fake.fail_next = 1
    assert await instance.shutdown() is False
    assert CONTRACT.label_free_units in fake.labels


async def test_totals_removed_by_another_writer_come_back_with_the_next_free_count(
    demo_node, kubelet_socket, api_server
):
    fake, api = api_server
    async with Running(make(demo_node, kubelet_socket, api, settings=steering_settings(poll=3600))) as running:
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "initial labels")
        # e.g. an old plugin pod's exit during a rolling update, after the new one wrote
        del fake.labels[CONTRACT.label_gpu_count], fake.labels[CONTRACT.label_gpu_memory_mib]
        kubelet_socket.kubelet.pods["a"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 0, 10)}
        running.notify()
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "1", "allocation written")
    assert fake.labels[CONTRACT.label_gpu_count] == "2"
    assert fake.labels[CONTRACT.label_gpu_memory_mib] == str(demo_node.memory_gpus[0].memory_mib)


async def test_a_hung_api_server_times_out_and_the_write_is_retried(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    fake.hang_next = 1
    async with Running(make(demo_node, kubelet_socket, api)) as running:
        await eventually(lambda: running.writes == 1, "written after a timeout", limit=20)
        assert running.write_errors == 1
    assert fake.labels[CONTRACT.label_free_gpus] == "2"


async def test_nothing_is_written_until_kubelet_answers_then_labels_appear(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    await kubelet_socket.stop()  # kubelet restarting: the socket is gone
    pathlib.Path(kubelet_socket.path).unlink(missing_ok=True)
    async with Running(make(demo_node, kubelet_socket, api, settings=steering_settings(poll=0.02))) as running:
        await eventually(lambda: running.read_errors >= 2, "read errors while kubelet is away")
        assert fake.patches == []  # never publish "all free" on a guess
        kubelet_socket.kubelet.pods["a"] = {CONTRACT.gpu_memory_resource: units_of(demo_node, 0, 10)}
        await kubelet_socket.start()
        await eventually(
            lambda: fake.labels.get(CONTRACT.label_free_partial_block_units) == str(per_gpu(demo_node) - 10),
            "labels after",
        )


async def test_a_cancel_that_meets_a_notification_still_stops_the_labeller(demo_node, kubelet_socket, api_server):
    # asyncio.wait_for on Python 3.11 lost a cancellation that came as the event it waited on was
    # set: the labeller then ran on, and whoever awaited it (the plugin's shutdown) waited forever.
    fake, api = api_server
    instance = make(demo_node, kubelet_socket, api)
    task = asyncio.create_task(instance.run(), name="test-node-labeller")
    try:
        await eventually(lambda: CONTRACT.label_free_gpus in fake.labels, "labels")
        await asyncio.sleep(0.2)  # back in its wait for the next change
        instance.notify()
        await asyncio.sleep(0)  # the wait it was in has just ended ...
        task.cancel()  # ... when it is cancelled
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(10):
                await task
    finally:
        task.cancel()


async def test_a_placement_score_that_goes_away_is_removed_from_the_node(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    scores = iter([80, 80, None])
    last: list[int | None] = []

    def usage() -> int | None:
        last.append(next(scores, None))
        return last[-1]

    async with Running(make(demo_node, kubelet_socket, api, usage=usage)) as running:
        await eventually(
            lambda: fake.labels.get(CONTRACT.label_placement_score) == "80",
            "score published",
        )
        running.notify()
        await eventually(lambda: len(last) >= 2, "second refresh")
        running.notify()
        await eventually(
            lambda: CONTRACT.label_placement_score not in fake.labels,
            "stale score removed",
        )
    assert fake.patches[-1] == {CONTRACT.label_placement_score: None}


async def test_a_failing_usage_reader_only_drops_the_score(demo_node, kubelet_socket, api_server):
    fake, api = api_server

    def broken() -> int | None:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    async with Running(make(demo_node, kubelet_socket, api, usage=broken)):
        await eventually(lambda: CONTRACT.label_free_gpus in fake.labels, "labels without a score")
    assert CONTRACT.label_placement_score not in fake.labels


async def test_devices_kubelet_no_longer_offers_are_not_advertised_as_free(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    units = allocation.MemoryUnits(demo_node, CONTRACT.unit_mib)
    lost_gpu = demo_node.memory_gpus[1].uuid
    kubelet_socket.kubelet.allocatable = {
        CONTRACT.gpu_memory_resource: [d for d in units.device_ids if units.gpu_of[d] != lost_gpu]
    }
    async with Running(make(demo_node, kubelet_socket, api)):
        await eventually(lambda: CONTRACT.label_free_gpus in fake.labels, "labels")
    assert fake.labels[CONTRACT.label_free_gpus] == "1"
    assert fake.labels[CONTRACT.label_free_units] == str(per_gpu(demo_node))


async def test_device_ids_of_another_layout_are_ignored(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    kubelet_socket.kubelet.pods["stale"] = {CONTRACT.gpu_memory_resource: ["GPU-not-here::3", "garbage"]}
    async with Running(make(demo_node, kubelet_socket, api)):
        await eventually(lambda: CONTRACT.label_free_gpus in fake.labels, "labels")
    assert fake.labels[CONTRACT.label_free_gpus] == "2"


def test_a_labeller_needs_a_node_name(demo_node, settings):
    with pytest.raises(ValueError, match="node's name"):
        labeller.NodeLabeller(
            node=demo_node,
            settings=settings,
            node_name="",
            pod_resources_socket="/x",
            api=None,
        )


async def test_missing_credentials_are_a_clear_write_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    api = labeller.KubernetesNodeApi()
    with pytest.raises(labeller.NodeApiError, match="credentials") as raised:
        await api.patch_labels(NODE, {"a": "b"})
    api.close()
    assert f"no kubeconfig at {tmp_path / 'missing'} ($KUBECONFIG)" in str(raised.value)  # the path it tried


def test_the_fake_api_server_speaks_json(api_server):
    fake, _ = api_server
    assert json.loads(json.dumps(fake.labels)) == {OPERATOR_LABEL: "true"}


async def test_an_unhealthy_gpu_offers_no_free_block(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    sick: set[str] = set()
    mig = next(demo_node.mig_devices())
    settings = steering_settings(poll=3600)
    async with Running(make(demo_node, kubelet_socket, api, settings=settings, unhealthy=lambda: sick)) as running:
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "healthy labels")
        sick.update({demo_node.memory_gpus[0].uuid, mig.uuid})
        running.notify()
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "1", "sick GPU withdrawn")
        assert fake.labels[CONTRACT.label_free_units] == str(per_gpu(demo_node))
        free_before = sum(1 for m in demo_node.mig_devices() if m.profile == mig.profile)
        assert fake.labels[CONTRACT.label_mig_free(mig.profile)] == str(free_before - 1)
        sick.clear()
        sick.add(health.ALL)  # NVML itself failing: nothing is free
        running.notify()
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_block_units) == "0", "everything withdrawn")


async def test_under_mig_strategy_single_a_sick_gpu_withdraws_the_units_of_its_mig_devices(kubelet_socket, api_server):
    fake, api = api_server
    mig = {"profile": "3g.40gb", "memoryMiB": 40192}
    gpus = [
        {
            "uuid": f"GPU-{i}",
            "model": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "index": i,
            "mig": [dict(mig, uuid=f"MIG-{i}-{j}") for j in range(2)],
        }
        for i in range(2)
    ]
    view = migstrategy.advertised(nodefile.parse({"gpus": gpus}), "single")
    sick: set[str] = set()
    settings = steering_settings(poll=3600)
    async with Running(make(view, kubelet_socket, api, settings=settings, unhealthy=lambda: sick)) as running:
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "4", "every MIG device free")
        assert fake.labels[CONTRACT.label_gpu_memory_mib] == "40192"
        sick.add("GPU-1")  # the physical GPU: both its MIG devices go with it
        running.notify()
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "sick GPU's MIG devices withdrawn")


async def test_notify_from_another_thread_wakes_the_labeller(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    async with Running(make(demo_node, kubelet_socket, api, settings=steering_settings(poll=3600))) as running:
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "2", "initial labels")
        kubelet_socket.kubelet.pods["whole"] = {
            CONTRACT.gpu_memory_resource: units_of(demo_node, 0, per_gpu(demo_node))
        }
        await asyncio.to_thread(running.notify)
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_gpus) == "1", "woken from a thread")


def test_headroom_counts_requests_as_the_scheduler_does():
    pods = [
        pod("Running", "1500m", "2Gi"),
        pod("Pending", "500m", "1Gi", init_cpu="4"),  # init container larger: 4 CPUs count
        pod("Succeeded", "16", "64Gi"),  # finished pods hold nothing
    ]
    assert labeller.headroom_from({"cpu": "16", "memory": "64Gi"}, pods) == (16000 - 1500 - 4000, 65536 - 3072)
    assert labeller.headroom_from({"cpu": "1"}, [pod("Running", "2", "1Gi")]) == (0, 0)


def test_headroom_counts_sidecars_pod_level_requests_and_overhead_as_the_scheduler_does():
    sidecar = {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    with_sidecar = pod("Running", "2", "4Gi")
    with_sidecar["spec"]["initContainers"] = [sidecar]
    with_sidecar["spec"]["overhead"] = {"cpu": "250m", "memory": "128Mi"}
    pod_level = pod("Running", "1", "1Gi")
    pod_level["spec"]["resources"] = {"requests": {"cpu": "3"}}  # replaces the containers' CPU, not memory
    assert labeller.headroom_from({"cpu": "16", "memory": "64Gi"}, [with_sidecar, pod_level]) == (
        16000 - 2750 - 3000,
        65536 - 5248 - 1024,
    )


async def test_cpu_and_memory_headroom_of_the_node_are_published(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    fake.allocatable = {"cpu": "32", "memory": "128Gi"}
    fake.pods = [pod("Running", "6", "16Gi")]
    async with Running(make(demo_node, kubelet_socket, api)):
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_cpu_milli) == "26000", "headroom published")
    assert fake.labels[CONTRACT.label_free_memory_mib] == str(112 * 1024)
    assert fake.pod_queries[-1] == f"spec.nodeName={NODE}"


async def test_the_nodes_pods_are_listed_once_then_followed_by_a_watch(demo_node, kubelet_socket, api_server):
    fake, api = api_server
    fake.allocatable = {"cpu": "32", "memory": "128Gi"}
    fake.pods = [pod("Running", "6", "16Gi")]
    async with Running(make(demo_node, kubelet_socket, api, settings=steering_settings(poll=0.02))):
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_cpu_milli) == "26000", "headroom published")
        started = pod("Running", "10", "16Gi")
        started["metadata"] = {"uid": "new-pod", "namespace": "ns", "name": "new"}
        await fake.pod_events.put({"type": "ADDED", "object": started})
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_cpu_milli) == "16000", "new pod seen")
        await fake.pod_events.put({"type": "DELETED", "object": started})
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_cpu_milli) == "26000", "ended pod seen")
    assert fake.pod_lists == 1  # many refreshes (a 20 ms poll), one list
    assert fake.pod_watches >= 1
    assert set(fake.pod_queries) == {f"spec.nodeName={NODE}"}


async def test_a_pod_without_devices_is_published_at_once_by_the_pod_watch(demo_node, kubelet_socket, api_server):
    # A CPU-only pod never reaches the plugin's Allocate (no notify()): the node's pod watch
    # wakes the labeller, and the lower headroom is written inside the rate limit, not at the poll.
    fake, api = api_server
    fake.allocatable = {"cpu": "32", "memory": "128Gi"}
    settings = steering_settings(min_interval=3600, poll=3600)
    async with Running(make(demo_node, kubelet_socket, api, settings=settings)):
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_cpu_milli) == "32000", "headroom published")
        started = pod("Pending", "10", "16Gi")
        started["metadata"] = {"uid": "cpu-pod", "namespace": "ns", "name": "cpu"}
        await fake.pod_events.put({"type": "ADDED", "object": started})
        await eventually(lambda: fake.labels.get(CONTRACT.label_free_cpu_milli) == "22000", "pod start written")
        writes = len(fake.patches)
        running = {**started, "status": {"phase": "Running"}}
        await fake.pod_events.put({"type": "MODIFIED", "object": running})  # a status write: nothing to do
        await asyncio.sleep(0.2)
        assert len(fake.patches) == writes


async def test_without_a_readable_headroom_no_headroom_labels_are_published(demo_node, kubelet_socket, api_server):
    fake, api = api_server  # GET node / pods answer 404
    async with Running(make(demo_node, kubelet_socket, api)):
        await eventually(lambda: CONTRACT.label_free_block_units in fake.labels, "steering labels written")
    assert CONTRACT.label_free_cpu_milli not in fake.labels
