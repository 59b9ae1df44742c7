"""The usage monitor inside the real plugin (`main.run`): a pod allocated through the kubelet
emulator's real Allocate, its process in the fake NVML and /proc, /metrics over HTTP, an over-use
Event through a local fake API server; and no monitor without NVML or with it turned off. Memory
pressure lowering the placement score: tests/deviceplugin/test_placement.py."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from devicepluginkit import api_server_fixture, free_port, pod_json  # noqa: F401 - fixture
from fake_nvml import FakeNvml
from fake_proc import FakeProc
from kubelet_emulator import kubelet_fixture, socket_dir_fixture  # noqa: F401 - fixtures
from prometheus_client.parser import text_string_to_metric_families

from gpuslice import config
from gpuslice.deviceplugin import main

pytestmark = pytest.mark.usefixtures("no_leftover_tasks")

UID = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
CID = "1" * 64


async def test_the_plugin_reports_a_pods_gpu_use_and_its_over_use(kubelet, socket_dir, demo_node, api_server, tmp_path):
    fake_api, pod_api = api_server
    nvml = FakeNvml(demo_node)
    nvml.nvmlInit()
    proc = FakeProc(tmp_path / "proc")
    settings = config.load(
        environ={},
        overrides={"monitor.intervalSeconds": 0.05, "monitor.overuseSeconds": 0.1, "steering.enabled": False},
    )
    port = free_port()
    options = main.Options(
        kubelet_dir=str(socket_dir),
        http_port=port,
        poll_interval=0.05,
        node_name="gpu-node-1",
        pod_resources_socket=str(kubelet.pod_resources_socket),
        proc_root=proc.path,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(
        main.run(settings, options, demo_node, nvml=nvml, stop=stop, pod_api=pod_api), name="plugin-under-test"
    )
    try:
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)
        answer = await kubelet.allocate("gpuslice.io/gpu-memory", 16, "team/pod-a/main")  # 4096 MiB
        gpu = answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
        fake_api.pods = [pod_json(UID, "pod-a", {"main": CID})]
        proc.add_container_process(7001, UID, CID, layout=("v2", "cri-o", "systemd"))
        nvml.add_process(gpu, 7001, 5000)
        async with aiohttp.ClientSession() as http:
            for _ in range(200):
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    text = await r.text()
                if fake_api.events and "gpuslice_container_gpu_memory_used_bytes{" in text:
                    break
                await asyncio.sleep(0.05)
        samples = {
            (s.name, s.labels.get("pod"), s.labels.get("gpu")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert samples[("gpuslice_container_gpu_memory_used_bytes", "pod-a", gpu)] == 5000 * 2**20
        assert samples[("gpuslice_container_gpu_memory_granted_bytes", "pod-a", gpu)] == 4096 * 2**20
        (event,) = fake_api.events[:1]
        assert event["involvedObject"]["uid"] == UID and "grant of 4096 MiB" in event["message"]
    finally:
        stop.set()
        assert await task == 0


async def test_without_nvml_or_with_the_monitor_off_no_monitor_runs(kubelet, socket_dir, demo_node):
    for nvml, enabled in ((None, True), (FakeNvml(demo_node), False)):
        if nvml is not None:
            nvml.nvmlInit()
        settings = config.load(environ={}, overrides={"monitor.enabled": enabled, "steering.enabled": False})
        options = main.Options(
            kubelet_dir=str(socket_dir),
            pod_resources_socket=str(kubelet.pod_resources_socket),
            http_port=0,
            poll_interval=0.05,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(main.run(settings, options, demo_node, nvml=nvml, stop=stop), name="plugin")
        await kubelet.wait_for_resource("gpuslice.io/gpu-memory", 636)
        assert "deviceplugin-usage-monitor" not in {t.get_name() for t in asyncio.all_tasks()}
        stop.set()
        assert await task == 0
