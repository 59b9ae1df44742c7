"""The usage monitor end to end against real local servers: kubelet's PodResources v1 on a unix
socket (grpc.aio), a fake API server on loopback (aiohttp) reached through the official kubernetes
client (pod list, Events, the Eviction API), the fake NVML with processes, and a fake /proc tree.
Covers the metrics, the over-use Event, each policy (warn, evict with a PodDisruptionBudget in the
way, kill of a real process), a process whose pod is gone, a reused PID, NVML errors and a GPU
that falls off the bus."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator

import grpc
import prometheus_client
import pytest
from devicepluginkit import NODE, FakeApiServer, api_server_fixture, pod_json, victim_fixture  # noqa: F401 - fixtures
from fake_nvml import FakeNvml
from fake_proc import FakeProc
from prometheus_client.parser import text_string_to_metric_families

from gpuslice import config, contract
from gpuslice.deviceplugin import monitor, overuse, podapi
from gpuslice.node import podresources
from gpuslice.proto.podresources.v1 import api_pb2, api_pb2_grpc

H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
MIG_1G = "MIG-1ccf2998-6a5b-590c-8152-c9dc5eb13434"
NAMES = contract.Contract()
UID_A = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
UID_B = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
CID_A, CID_B = "1" * 64, "2" * 64


# --- kubelet's PodResources ---------------------------------------------------------------


class FakePodResources(api_pb2_grpc.PodResourcesListerServicer):
    """List answers from `holdings`: (namespace, pod) -> container -> resource -> device IDs."""

    def __init__(self) -> None:
        self.holdings: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self.fail = False

    async def List(self, request, context):
        if self.fail:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        response = api_pb2.ListPodResourcesResponse()
        for (namespace, name), containers in sorted(self.holdings.items()):
            pod = response.pod_resources.add(name=name, namespace=namespace)
            for container_name, resources in containers.items():
                container = pod.containers.add(name=container_name)
                for resource, ids in resources.items():
                    container.devices.add(resource_name=resource, device_ids=ids)
        return response


@dataclasses.dataclass
class Kubelet:
    servicer: FakePodResources
    socket: str


@pytest.fixture
async def kubelet() -> AsyncIterator[Kubelet]:
    directory = tempfile.mkdtemp(prefix="gs-mon-", dir="/tmp")  # unix socket paths must stay short
    servicer = FakePodResources()
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    socket = f"{directory}/kubelet.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield Kubelet(servicer, socket)
    finally:
        await server.stop(0)
        shutil.rmtree(directory, ignore_errors=True)


# --- the node -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Node:
    nvml: FakeNvml
    proc: FakeProc
    kubelet: Kubelet
    api: FakeApiServer
    pod_api: podapi.KubernetesPodApi
    clock: Clock
    registry: prometheus_client.CollectorRegistry
    inventory: object

    def monitor(self, **monitor_settings) -> monitor.UsageMonitor:
        settings = config.load(
            environ={},
            overrides={
                "monitor.overuseSeconds": 30,
                "monitor.overuseToleranceMiB": 256,
                **{f"monitor.{k}": v for k, v in monitor_settings.items()},
            },
        )
        self.registry = prometheus_client.CollectorRegistry()
        return monitor.UsageMonitor(
            nvml=self.nvml,
            node=self.inventory,
            settings=settings,
            node_name=NODE,
            pod_resources_socket=self.kubelet.socket,
            proc_root=self.proc.path,
            api=self.pod_api,
            registry=self.registry,
            clock=self.clock,
        )

    def metric(self, name: str, **labels: str) -> float | None:
        text = prometheus_client.generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return sample.value
        return None


@pytest.fixture
async def node(demo_node, kubelet, api_server, tmp_path) -> Node:
    fake_api, pod_api = api_server
    nvml = FakeNvml(demo_node)
    nvml.nvmlInit()
    proc = FakeProc(tmp_path / "proc")
    # pod-a/main holds 16 units (4096 MiB) of H100_A, pod-b/main 32 units of H100_A
    units = [contract.unit_device_id(H100_A, i, contract.DEFAULT_UNIT_MIB) for i in range(48)]
    kubelet.servicer.holdings = {
        ("team", "pod-a"): {"main": {NAMES.gpu_memory_resource: units[:16]}},
        ("team", "pod-b"): {"main": {NAMES.gpu_memory_resource: units[16:]}},
    }
    fake_api.pods = [pod_json(UID_A, "pod-a", {"main": CID_A}), pod_json(UID_B, "pod-b", {"main": CID_B})]
    return Node(nvml, proc, kubelet, fake_api, pod_api, Clock(), prometheus_client.CollectorRegistry(), demo_node)


async def round_(node: Node, usage_monitor: monitor.UsageMonitor, *, after: float = 0.0):
    node.clock.now += after
    async with podresources.Client(node.kubelet.socket) as client:
        return await usage_monitor.sample_once(client)


# --- metrics ------------------------------------------------------------------------------


async def test_metrics_show_each_containers_use_grant_and_utilisation_and_what_no_grant_covers(node):
    node.proc.add_container_process(101, UID_A, CID_A)
    node.proc.add_container_process(201, UID_B, CID_B, layout=("v1", "cri-o", "cgroupfs"))
    node.proc.add(301, "0::/system.slice/some-daemon.service\n")
    node.nvml.add_process(H100_A, 101, 3000)
    node.nvml.add_process(H100_A, 201, 5000)
    node.nvml.add_process(H100_A, 301, 700)
    node.nvml.set_process_utilization(H100_A, 101, 40)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    mib = 1 << 20
    a = {"namespace": "team", "pod": "pod-a", "container": "main", "gpu": H100_A}
    assert node.metric("gpuslice_container_gpu_memory_used_bytes", **a) == 3000 * mib
    assert node.metric("gpuslice_container_gpu_memory_granted_bytes", **a) == 4096 * mib
    assert node.metric("gpuslice_container_gpu_utilization_ratio", **a) == pytest.approx(0.4)
    assert node.metric("gpuslice_container_gpu_memory_over_grant", **a) == 0
    b = {**a, "pod": "pod-b"}
    assert node.metric("gpuslice_container_gpu_memory_used_bytes", **b) == 5000 * mib
    assert node.metric("gpuslice_gpu_memory_unattributed_bytes", gpu=H100_A, reason="outside-pods") == 700 * mib
    assert node.metric("gpuslice_gpu_memory_used_bytes", gpu=H100_A) == 8700 * mib
    assert node.metric("gpuslice_gpu_memory_granted_bytes", gpu=H100_A) == 12288 * mib
    assert node.metric("gpuslice_gpu_monitor_up", gpu=H100_B) == 1
    assert node.metric("gpuslice_gpu_memory_pressure", gpu=H100_A) == 1  # 700 MiB no grant covers > 256
    assert node.metric("gpuslice_gpu_monitor_rounds_total", result="ok") == 1
    assert usage_monitor.pressured() == {H100_A}
    assert node.api.pod_list_selectors == [f"spec.nodeName={NODE}"]


async def test_a_pod_that_ended_leaves_no_series_behind(node):
    node.proc.add_container_process(101, UID_A, CID_A)
    node.nvml.add_process(H100_A, 101, 3000)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    assert node.metric("gpuslice_container_gpu_memory_used_bytes", pod="pod-a") == 3000 * (1 << 20)
    del node.kubelet.servicer.holdings[("team", "pod-a")]
    node.nvml.remove_process(H100_A, 101)
    await round_(node, usage_monitor, after=10)
    assert node.metric("gpuslice_container_gpu_memory_used_bytes", pod="pod-a") is None


# --- over-use and the policies ------------------------------------------------------------


def over_use_pod_a(node: Node, used_mib: int = 5000) -> None:
    node.proc.add_container_process(101, UID_A, CID_A)
    node.nvml.add_process(H100_A, 101, used_mib)


async def test_warn_sends_one_event_naming_the_gpu_use_and_grant_once_the_over_use_lasts(node):
    over_use_pod_a(node)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=20)
    assert node.api.events == []  # over, but not for 30 s yet
    assert node.metric("gpuslice_container_gpu_memory_over_grant", pod="pod-a") == 1
    await round_(node, usage_monitor, after=10)
    (event,) = node.api.events
    assert event["reason"] == overuse.REASON and event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team",
        "name": "pod-a",
        "uid": UID_A,
        "fieldPath": "spec.containers{main}",
    }
    message = event["message"]
    assert H100_A in message and "NVIDIA H100 80GB HBM3" in message and "index 0" in message
    assert "uses 5000 MiB" in message and "grant of 4096 MiB" in message and "policy warn" in message
    assert event["source"] == {"component": "gpuslice-device-plugin", "host": NODE}
    for _ in range(3):
        await round_(node, usage_monitor, after=30)
    assert len(node.api.events) == 1  # one Event per episode
    assert node.metric("gpuslice_gpu_overuse_actions_total", policy="warn", action="event", result="ok") == 1
    # back within the grant, then over again: a new episode, a new Event after 30 s
    node.nvml.add_process(H100_A, 101, 4000)
    await round_(node, usage_monitor, after=10)
    node.nvml.add_process(H100_A, 101, 6000)
    await round_(node, usage_monitor, after=10)
    await round_(node, usage_monitor, after=30)
    assert len(node.api.events) == 2 and "uses 6000 MiB" in node.api.events[1]["message"]


async def test_use_within_the_tolerance_is_not_an_over_use(node):
    over_use_pod_a(node, used_mib=4096 + 256)
    usage_monitor = node.monitor()
    for _ in range(4):
        await round_(node, usage_monitor, after=30)
    assert node.api.events == [] and node.metric("gpuslice_container_gpu_memory_over_grant", pod="pod-a") == 0


async def test_evict_goes_through_the_eviction_api_with_the_pods_uid(node):
    over_use_pod_a(node)
    usage_monitor = node.monitor(overusePolicy="evict")
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    ((namespace, name, body),) = node.api.evictions
    assert (namespace, name) == ("team", "pod-a")
    assert body["apiVersion"] == "policy/v1" and body["kind"] == "Eviction"
    assert body["deleteOptions"]["preconditions"] == {"uid": UID_A}  # never a re-created pod of that name
    (event,) = node.api.events
    assert "policy evict: the pod is being evicted" in event["message"]


async def test_an_eviction_a_disruption_budget_refuses_is_said_once_and_retried(node):
    node.api.eviction_status = 429
    over_use_pod_a(node)
    usage_monitor = node.monitor(overusePolicy="evict")
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    await round_(node, usage_monitor, after=10)  # not yet: retried every 30 s
    assert len(node.api.evictions) == 1
    await round_(node, usage_monitor, after=20)
    assert len(node.api.evictions) == 2
    (event,) = node.api.events
    assert "PodDisruptionBudget refuses the eviction" in event["message"]
    assert node.metric("gpuslice_gpu_overuse_actions_total", policy="evict", action="evict", result="blocked") == 2
    node.api.eviction_status = 201
    await round_(node, usage_monitor, after=30)
    assert len(node.api.evictions) == 3 and "being evicted" in node.api.events[-1]["message"]


async def test_kill_kills_the_largest_process_of_the_container_and_says_which(node, victim):
    node.proc.link_self()  # the monitor sees the PID namespace it lives in (hostPID)
    node.proc.add_container_process(victim.pid, UID_A, CID_A)
    node.proc.add_container_process(102, UID_A, CID_A)
    node.nvml.add_process(H100_A, victim.pid, 4000)
    node.nvml.add_process(H100_A, 102, 1000)
    usage_monitor = node.monitor(overusePolicy="kill")
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    assert await asyncio.wait_for(victim.wait(), 10) == -signal.SIGKILL
    (event,) = node.api.events
    assert f"process {victim.pid} (4000 MiB on this GPU) was killed" in event["message"]
    assert node.metric("gpuslice_gpu_overuse_actions_total", policy="kill", action="kill", result="killed") == 1


async def test_kill_falls_back_to_warn_outside_the_hosts_pid_namespace(node):
    # no `self` link naming this process: the PIDs NVML gives are not ours to signal
    over_use_pod_a(node)
    usage_monitor = node.monitor(overusePolicy="kill")
    assert usage_monitor.enforcer.policy == "warn"
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    (event,) = node.api.events
    assert "policy warn" in event["message"]


# --- what cannot be attributed or read ----------------------------------------------------


async def test_a_process_whose_pod_is_gone_is_memory_no_grant_covers_and_never_an_over_use(node):
    gone = "dddddddd-dddd-4ddd-8ddd-dddddddddddd"
    node.proc.add_container_process(501, gone, "5" * 64)
    node.nvml.add_process(H100_A, 501, 9000)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    assert node.metric("gpuslice_gpu_memory_unattributed_bytes", gpu=H100_A, reason="unknown-pod") == 9000 * (1 << 20)
    assert node.api.events == []
    # the unknown pod makes the monitor list the node's pods again, at most every 30 s
    await round_(node, usage_monitor, after=5)
    assert len(node.api.pod_list_selectors) == 2


async def test_a_pid_reused_after_nvml_listed_it_is_not_blamed_on_the_new_process(node):
    # NVML still lists PID 101 (pod-a's process, which just exited); /proc shows a process of
    # pod-b that started after NVML answered.
    node.proc.add_container_process(101, UID_B, CID_B, started=node.proc.uptime + 1)
    node.nvml.add_process(H100_A, 101, 20000)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    assert node.metric("gpuslice_container_gpu_memory_used_bytes", pod="pod-b") == 0
    assert node.metric("gpuslice_gpu_memory_unattributed_bytes", gpu=H100_A, reason="exited") == 20000 * (1 << 20)
    assert node.api.events == []


async def test_nvml_errors_leave_the_gpu_unknown_and_stop_the_over_use_episode(node):
    over_use_pod_a(node)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    node.nvml.fail_process_queries(H100_A)
    await round_(node, usage_monitor, after=30)
    assert node.metric("gpuslice_gpu_monitor_up", gpu=H100_A) == 0
    assert node.metric("gpuslice_container_gpu_memory_used_bytes", pod="pod-a") is None
    assert node.api.events == []
    node.nvml.fail_process_queries(H100_A, None)
    await round_(node, usage_monitor, after=1)
    await round_(node, usage_monitor, after=20)
    assert node.api.events == []  # a new episode: 30 s from when the GPU answered again
    await round_(node, usage_monitor, after=10)
    assert len(node.api.events) == 1


async def test_a_gpu_that_falls_off_the_bus_is_reported_down_and_nothing_is_done_to_its_pods(node):
    over_use_pod_a(node)
    usage_monitor = node.monitor(overusePolicy="evict")
    await round_(node, usage_monitor)
    node.nvml.fail_gpu(H100_A)
    for _ in range(3):
        await round_(node, usage_monitor, after=30)
    assert node.api.evictions == [] and node.api.events == []
    assert node.metric("gpuslice_gpu_monitor_up", gpu=H100_A) == 0
    assert node.metric("gpuslice_gpu_monitor_up", gpu=H100_B) == 1
    assert usage_monitor.pressured() == frozenset()


async def test_an_unreadable_podresources_keeps_the_last_snapshot_and_is_counted(node):
    over_use_pod_a(node)
    usage_monitor = node.monitor()
    first = await round_(node, usage_monitor)
    node.kubelet.servicer.fail = True
    assert await round_(node, usage_monitor, after=30) is None
    assert usage_monitor.snapshot is first
    assert node.metric("gpuslice_gpu_monitor_rounds_total", result="error") == 1
    assert node.api.events == []


async def test_an_event_the_api_server_refuses_is_counted_and_tried_again(node):
    node.api.event_status = 500
    over_use_pod_a(node)
    usage_monitor = node.monitor()
    await round_(node, usage_monitor)
    await round_(node, usage_monitor, after=30)
    assert node.metric("gpuslice_gpu_overuse_actions_total", policy="warn", action="event", result="failed") == 1
    node.api.event_status = 201
    await round_(node, usage_monitor, after=10)
    assert len(node.api.events) == 1
