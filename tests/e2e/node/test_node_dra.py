"""The chart in DRA mode on the real node: the DRA plugin DaemonSet pod (our image, NVML from the
node's driver root: the NVML built on go-nvml's mock DGX A100) registers with the real kubelet's
plugin manager and publishes its ResourceSlice; a KAI pod becomes a claim (the webhook, as the
chart's pods, writes the claim template), the real scheduler allocates it, kubelet's DRA manager
has our plugin prepare it, containerd applies the CDI spec the plugin wrote, and deleting the pod
unprepares it and removes the spec. Restarts of kubelet and of the plugin keep what is prepared."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import nodepods
import pytest
import realnode
from nodepods import CONTRACT

CDI_DIR = pathlib.Path("/var/run/cdi")
DRIVER = f"gpu.{CONTRACT.prefix}"


def chart_values(image: dict[str, str], driver: realnode.MockDriver) -> dict[str, Any]:
    """No runtime class here: NVML from the driver root the chart mounts (the GPU Operator's driver
    container layout), the other way the chart supports."""
    return {
        "mode": "dra",
        "image": image,
        "devicePlugin": {"runtimeClassName": "", "driverRoot": str(driver.root), "extraEnv": driver.env()},
    }


def claim_specs() -> list[pathlib.Path]:
    return sorted(CDI_DIR.glob(f"k8s.{DRIVER}-claim_*.json")) if CDI_DIR.is_dir() else []


@pytest.fixture(scope="module")
def release(
    real_node: realnode.RealNode, node_core: kubernetes.client.CoreV1Api, mock_driver: realnode.MockDriver, image
) -> Iterator[nodepods.Release]:
    mock_driver.set_state({})
    labels = {CONTRACT.label_node_enabled: "true", CONTRACT.label_node_dra: "true"}
    node_core.patch_node(realnode.NODE_NAME, {"metadata": {"labels": labels}})
    installed = nodepods.Release(real_node, node_core, "gpd", "gpuslice-dra")
    installed.install(chart_values(image, mock_driver))
    try:
        installed.wait_ready("dra-plugin")
        installed.wait_ready("webhook", count=2)
        yield installed
    finally:
        installed.uninstall()
        node_core.patch_node(realnode.NODE_NAME, {"metadata": {"labels": dict.fromkeys(labels)}})


@pytest.fixture(scope="module")
def resource(node_api: kubernetes.client.ApiClient) -> kubernetes.client.ResourceV1Api:
    return kubernetes.client.ResourceV1Api(node_api)


def our_slices(resource: kubernetes.client.ResourceV1Api) -> list[Any]:
    return [s for s in resource.list_resource_slice().items if s.spec.driver == DRIVER]


def test_the_dra_plugin_pod_registers_with_kubelet_and_publishes_the_nodes_gpus(release, resource, mock_driver):
    slices = k8skit.wait_for("our ResourceSlice", lambda: our_slices(resource), 60)
    assert {s.spec.node_name for s in slices} == {realnode.NODE_NAME}
    published = {d.name for s in slices for d in s.spec.devices}
    assert len(published) == 8, published  # the mock's 8 A100s, none in MIG mode here
    (plugin,) = release.wait_ready("dra-plugin")
    log = release.core.read_namespaced_pod_log(plugin.metadata.name, release.namespace)
    assert "registered" in log.lower(), log[-2000:]


def test_a_kai_pod_becomes_a_claim_that_kubelet_prepares_and_containerd_applies(
    node_core, node_namespace, release, resource, mock_driver
):
    uuids = {g["uuid"] for g in mock_driver.gpus()}
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("share", {"gpu-fraction": "0.5"}))
    pod = nodepods.running(node_core, node_namespace, "share")
    assert pod.spec.resource_claims, "the webhook did not turn the pod into a claim"
    (claim,) = resource.list_namespaced_resource_claim(node_namespace).items
    assert claim.status.allocation.devices.results[0].driver == DRIVER
    assert [r.uid for r in claim.status.reserved_for] == [pod.metadata.uid]
    seen = nodepods.report(node_core, node_namespace, "share")
    assert seen["GPUSLICE_MEMORY_LIMIT_MIB"] == "20480", seen
    assert seen["NVIDIA_VISIBLE_DEVICES"] in uuids
    assert any(claim.metadata.uid in p.name for p in claim_specs())
    node_core.delete_namespaced_pod("share", node_namespace, grace_period_seconds=0)
    k8skit.wait_for(
        "the claim's CDI spec removed (unprepared)",
        lambda: not any(claim.metadata.uid in p.name for p in claim_specs()),
        60,
    )


def test_kubelet_and_plugin_restarts_keep_the_prepared_claim_and_serve_new_ones(
    node_core, node_namespace, release, real_node
):
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("kept", {"gpu-memory": "8192"}))
    kept = nodepods.running(node_core, node_namespace, "kept")
    specs = claim_specs()
    assert len(specs) == 1
    real_node.stop_kubelet()
    real_node.start_kubelet()
    release.wait_ready("dra-plugin")
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("after-kubelet", {"gpu-memory": "8192"}))
    nodepods.running(node_core, node_namespace, "after-kubelet")
    (plugin,) = release.wait_ready("dra-plugin")
    node_core.delete_namespaced_pod(plugin.metadata.name, release.namespace)
    release.rolled("dra-plugin", {plugin.metadata.name})
    node_core.create_namespaced_pod(node_namespace, nodepods.kai_pod("after-plugin", {"gpu-memory": "8192"}))
    nodepods.running(node_core, node_namespace, "after-plugin")
    still = node_core.read_namespaced_pod("kept", node_namespace)
    assert still.metadata.uid == kept.metadata.uid and still.status.container_statuses[0].restart_count == 0
    assert specs[0] in claim_specs()  # the first claim's spec survived both restarts
    assert len(claim_specs()) == 3
    for name in ("kept", "after-kubelet", "after-plugin"):
        node_core.delete_namespaced_pod(name, node_namespace, grace_period_seconds=0)
    k8skit.wait_for("every claim unprepared", lambda: not claim_specs(), 90)
