"""Our device plugin with kubelet's real device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager,
run by dmharness): registration over kubelet.sock, ListAndWatch into the manager's capacity, and
kubelet's own GetPreferredAllocation + Allocate calls when it admits a pod: best fit on one GPU, whole
GPUs, MIG, the cross-GPU refusal, health changes, a plugin restart and a kubelet restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import fake_nvml
import k8skit
import pytest

from gpuslice import config as config_
from gpuslice import contract as contract_
from gpuslice.deviceplugin import main as plugin_main
from gpuslice.node import nodefile
from gpuslice.sim import controlplane

pytestmark = pytest.mark.e2e

SETTINGS = config_.Config()
CONTRACT = SETTINGS.contract
GPU_MEMORY = CONTRACT.gpu_memory_resource
DEMO_NODE = k8skit.EXAMPLES / "demo-node.yaml"
H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
UNITS_PER_H100 = 81559 // 256  # 318
MIG_1G = CONTRACT.mig_resource("1g.10gb")


def _units(limit: int, name: str = "pod") -> dict[str, Any]:
    pod = k8skit.pod_object(name, limits={GPU_MEMORY: limit})
    pod["metadata"] |= {"uid": str(uuid.uuid4()), "namespace": "e2e"}
    return pod


def _gpus(admitted: dict[str, Any], resource: str = GPU_MEMORY) -> set[str]:
    ids = admitted["containers"]["main"]["devices"][resource]
    return {contract_.parse_unit_device_id(i).gpu_uuid for i in ids}


def _env(admitted: dict[str, Any]) -> dict[str, str]:
    return {e["Name"]: e["Value"] for e in admitted["containers"]["main"]["runOptions"]["Envs"] or []}


def _all_registered(kubelet: k8skit.Harness) -> bool:
    """Each resource registers on its own socket: wait for all of them, not just the first."""
    allocatable = kubelet.capacity()["allocatable"]
    expected = {
        GPU_MEMORY: "636",
        MIG_1G: "2",
        CONTRACT.mig_resource("2g.20gb"): "1",
        CONTRACT.mig_resource("3g.40gb"): "1",
    }
    return all(allocatable.get(name) == count for name, count in expected.items())


@pytest.fixture
def kubelet(cluster: controlplane.ControlPlane, workdir: pathlib.Path) -> Iterator[k8skit.Harness]:
    harness = k8skit.Harness(cluster, workdir, name=f"dmharness-{workdir.name}").start()
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def plugin(
    cluster: controlplane.ControlPlane, kubelet: k8skit.Harness, workdir: pathlib.Path
) -> Iterator[k8skit.DevicePlugin]:
    started = k8skit.start_device_plugin(cluster, kubelet, DEMO_NODE, name=f"device-plugin-{workdir.name}")
    k8skit.wait_for("every resource of the plugin in the device manager", lambda: _all_registered(kubelet))
    try:
        yield started
    finally:
        cluster.stop_process(started.process)


@pytest.mark.usefixtures("plugin")
def test_the_plugin_registers_and_kubelet_counts_every_unit_and_mig_slice(kubelet: k8skit.Harness) -> None:
    capacity = kubelet.capacity()
    assert capacity["capacity"][GPU_MEMORY] == "636"
    assert capacity["allocatable"][MIG_1G] == "2"
    assert capacity["allocatable"][CONTRACT.mig_resource("3g.40gb")] == "1"
    assert capacity["allocatable"][CONTRACT.mig_resource("2g.20gb")] == "1"


@pytest.mark.usefixtures("plugin")
def test_kubelet_admits_shares_best_fit_on_one_gpu(kubelet: k8skit.Harness) -> None:
    status, first = kubelet.admit(_units(100, "first"))
    assert status == 200, first
    (gpu_first,) = _gpus(first)
    env = _env(first)
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu_first
    assert env["GPUSLICE_MEMORY_LIMIT_MIB"] == str(100 * 256)
    # 250 units fit only on the untouched GPU (218 are left on the first).
    status, second = kubelet.admit(_units(250, "second"))
    assert status == 200, second
    (gpu_second,) = _gpus(second)
    assert gpu_second != gpu_first
    # 50 units fit on both (218 and 68 free): best fit takes the tighter block.
    status, third = kubelet.admit(_units(50, "third"))
    assert status == 200, third
    assert _gpus(third) == {gpu_second}
    assert kubelet.allocatable(GPU_MEMORY) == 636  # allocatable counts devices, not what is in use


@pytest.mark.usefixtures("plugin")
def test_a_request_that_fits_only_across_gpus_is_refused_by_allocate_and_nothing_leaks(kubelet: k8skit.Harness) -> None:
    assert kubelet.admit(_units(300, "big-a"))[0] == 200
    assert kubelet.admit(_units(250, "big-b"))[0] == 200
    # 18 + 68 = 86 units are free, on two GPUs: 80 fit the node but no single GPU.
    status, refused = kubelet.admit(_units(80, "spans"))
    assert status == 409, refused
    assert "span" in refused["error"] and H100_A in refused["error"] and H100_B in refused["error"]
    # Kubelet dropped the refused pod's devices: the 68 units of one GPU are all still there.
    status, fits = kubelet.admit(_units(68, "fits"))
    assert status == 200, fits


@pytest.mark.usefixtures("plugin")
def test_whole_gpus_are_granted_whole_and_together(kubelet: k8skit.Harness) -> None:
    status, admitted = kubelet.admit(_units(2 * UNITS_PER_H100, "two-gpus"))
    assert status == 200, admitted
    assert _gpus(admitted) == {H100_A, H100_B}
    assert set(_env(admitted)["NVIDIA_VISIBLE_DEVICES"].split(",")) == {H100_A, H100_B}


@pytest.mark.usefixtures("plugin")
def test_mig_slices_are_granted_one_device_each_until_none_is_left(kubelet: k8skit.Harness) -> None:
    seen = set()
    for i in range(2):
        pod = k8skit.pod_object(f"mig-{i}", limits={MIG_1G: 1})
        pod["metadata"] |= {"uid": str(uuid.uuid4()), "namespace": "e2e"}
        status, admitted = kubelet.admit(pod)
        assert status == 200, admitted
        (device,) = admitted["containers"]["main"]["devices"][MIG_1G]
        assert device.startswith("MIG-") and _env(admitted)["NVIDIA_VISIBLE_DEVICES"] == device
        seen.add(device)
    assert len(seen) == 2
    pod = k8skit.pod_object("mig-none-left", limits={MIG_1G: 1})
    pod["metadata"] |= {"uid": str(uuid.uuid4()), "namespace": "e2e"}
    status, refused = kubelet.admit(pod)
    assert status == 409 and "unavailable" in refused["error"], refused


def test_a_restarted_plugin_registers_again_and_allocations_survive(
    cluster: controlplane.ControlPlane, kubelet: k8skit.Harness, plugin: k8skit.DevicePlugin, workdir: pathlib.Path
) -> None:
    status, kept = kubelet.admit(_units(100, "kept"))
    assert status == 200
    cluster.stop_process(plugin.process)
    again = k8skit.start_device_plugin(cluster, kubelet, DEMO_NODE, name=f"device-plugin-again-{workdir.name}")
    try:
        k8skit.wait_for("re-registration", lambda: _all_registered(kubelet))
        status, after = kubelet.admit(_units(300, "after-restart"))
        assert status == 200, after
        # The 300 units cannot share the GPU holding the 100 kept ones.
        assert _gpus(after) != _gpus(kept)
    finally:
        cluster.stop_process(again.process)


@pytest.mark.usefixtures("plugin")
def test_a_restarted_kubelet_keeps_its_pods_devices_and_the_plugin_registers_again(kubelet: k8skit.Harness) -> None:
    pod = _units(150, "survivor")
    status, before = kubelet.admit(pod)
    assert status == 200
    kubelet.restart()  # deletes every plugin socket, re-creates kubelet.sock, reads its checkpoint
    k8skit.wait_for("re-registration after the kubelet restart", lambda: _all_registered(kubelet))
    status, now = kubelet._get(f"/pod?uid={pod['metadata']['uid']}")
    assert status == 200
    assert now["containers"]["main"]["devices"] == before["containers"]["main"]["devices"]
    # The checkpointed units are not handed out again: 318 - 150 = 168 left on that GPU.
    status, refused = kubelet.admit(_units(2 * UNITS_PER_H100, "both-whole"))
    assert status == 409, refused


@pytest.fixture
async def in_process_plugin(kubelet: k8skit.Harness) -> AsyncIterator[fake_nvml.FakeNvml]:
    """The plugin in this process with the fake NVML, so a test can raise an XID on a GPU."""
    node = nodefile.load(DEMO_NODE)
    nvml = fake_nvml.FakeNvml(node)
    nvml.nvmlInit()  # as main's discovery leaves it
    options = plugin_main.Options(
        kubelet_dir=str(kubelet.socket_dir), pod_resources_socket=str(kubelet.pod_resources_socket), http_port=0
    )
    settings = dataclasses.replace(SETTINGS, health=config_.HealthConfig(recovery_interval_seconds=0.5))
    stop = asyncio.Event()
    task = asyncio.create_task(plugin_main.run(settings, options, node, nvml=nvml, stop=stop), name="e2e-plugin")

    def registered() -> bool:
        if task.done():
            task.result()  # raises what stopped the plugin
        return _all_registered(kubelet)

    await asyncio.to_thread(k8skit.wait_for, "registration", registered)
    try:
        yield nvml
    finally:
        stop.set()
        await task


async def test_an_unhealthy_gpu_leaves_kubelets_allocatable_and_comes_back(
    kubelet: k8skit.Harness, in_process_plugin: fake_nvml.FakeNvml
) -> None:
    nvml = in_process_plugin
    nvml.fail_gpu(H100_A)
    nvml.inject_xid(H100_A, 79)  # fell off the bus
    await asyncio.to_thread(
        k8skit.wait_for,
        "the GPU's units to leave allocatable",
        lambda: kubelet.allocatable(GPU_MEMORY) == UNITS_PER_H100,
    )
    status, admitted = await asyncio.to_thread(kubelet.admit, _units(200, "while-a-is-down"))
    assert status == 200 and _gpus(admitted) == {H100_B}
    nvml.recover_gpu(H100_A)
    await asyncio.to_thread(k8skit.wait_for, "the GPU to come back", lambda: kubelet.allocatable(GPU_MEMORY) == 636)
