"""DRA mode on the real control plane: the real kube-apiserver validates and stores our ResourceSlices,
DeviceClasses and claim templates; the real kube-scheduler's DRA allocator places webhook-built capacity
requests on our devices (shares never exceed a GPU, a share never spans GPUs, a pod that fits nowhere
waits); and the DRA plugin prepares the claims as the real scheduler allocated them, read through the
real API. No kubelet runs: NodePrepareResources is called by the test as kubelet's DRA manager would.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import chartkit
import k8skit
import kubernetes
import pytest

from gpuslice import config
from gpuslice.deviceplugin import nodefile
from gpuslice.dra import checkpoint, kube, preparer, publisher, slices
from gpuslice.webhook import claim_templates, dra_claims

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

SETTINGS = config.load(overrides={"dra.enabled": True}, environ={})
CONTRACT = SETTINGS.contract
DEMO_NODE = k8skit.EXAMPLES / "demo-node.yaml"


@pytest.fixture
def resource_api(admin: kubernetes.client.ApiClient) -> kubernetes.client.ResourceV1Api:
    return kubernetes.client.ResourceV1Api(admin)


@pytest.fixture
def device_classes(resource_api: kubernetes.client.ResourceV1Api) -> Iterator[list[str]]:
    """The chart's DeviceClasses (mode dra), created in the cluster and deleted afterwards."""
    created = []
    for device_class in chartkit.render({"mode": "dra"}, "1.37.0").all("DeviceClass"):
        resource_api.create_device_class(device_class)
        created.append(device_class["metadata"]["name"])
    yield created
    for name in created:
        resource_api.delete_device_class(name)


@pytest.fixture
def scratch() -> Iterator[pathlib.Path]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="gsd-e2e-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def publish(admin: kubernetes.client.ApiClient, node_name: str) -> None:
    slice_publisher = publisher.SlicePublisher(
        node=nodefile.load(DEMO_NODE), settings=SETTINGS, node_name=node_name, api=kube.KubernetesApi(admin)
    )
    assert asyncio.run(slice_publisher.sync()) is True
    assert asyncio.run(slice_publisher.sync()) is False, "the API server changed our slices: a field was dropped"


def claim_from(template: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": template["spec"]["spec"],
    }


def pod_with_claim(name: str, claim_name: str, node_name: str) -> dict[str, Any]:
    pod = k8skit.pod_object(name, nodeSelector={"kubernetes.io/hostname": node_name})
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpuslice"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpuslice", "resourceClaimName": claim_name}]
    return pod


def test_the_api_server_stores_our_slices_unchanged(admin, core, nodes, namespace, resource_api):
    name = f"{namespace}-n"
    core.create_node(k8skit.node_object(name))
    nodes.append(name)
    publish(admin, name)
    stored = json.loads(
        resource_api.list_resource_slice(field_selector=f"spec.nodeName={name}", _preload_content=False).data
    )["items"]
    assert slices.comparable(stored) == slices.comparable(slices.build_slices(nodefile.load(DEMO_NODE), CONTRACT, name))
    assert stored[0]["metadata"]["ownerReferences"][0]["name"] == name


def test_the_real_allocator_packs_webhook_shares_per_gpu_and_the_plugin_prepares_them(
    admin, core, nodes, namespace, resource_api, device_classes, scratch
):
    node_name = f"{namespace}-n"
    core.create_node(k8skit.node_object(node_name))
    nodes.append(node_name)
    publish(admin, node_name)

    # The webhook's template for 20 GiB shares, created as the webhook creates it.
    need = dra_claims.Need(kind="gpu-memory", containers=(dra_claims.ContainerNeed("containers", 0, memory_mib=20480),))
    template = dra_claims.build(k8skit.pod_object("x"), need, SETTINGS).template
    templates = claim_templates.ClaimTemplates(claim_templates.KubernetesTemplateApi(admin))
    asyncio.run(templates.ensure(namespace, template))
    assert resource_api.read_namespaced_resource_claim_template(template["metadata"]["name"], namespace)

    # 81408 MiB of whole units per H100: three 20 GiB shares each, six on the node, the seventh waits.
    for i in range(7):
        resource_api.create_namespaced_resource_claim(namespace, claim_from(template, f"share-{i}"))
        core.create_namespaced_pod(namespace, pod_with_claim(f"share-{i}", f"share-{i}", node_name))
    bound = [k8skit.bound_node(core, namespace, f"share-{i}", timeout=90) for i in range(6)]
    assert set(bound) == {node_name}
    assert "cannot allocate all claims" in k8skit.scheduling_failure(core, namespace, "share-6", timeout=90)

    per_gpu: dict[str, int] = {}
    claims = []
    for i in range(6):
        claim = json.loads(
            resource_api.read_namespaced_resource_claim(f"share-{i}", namespace, _preload_content=False).data
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]  # one device: a share never spans GPUs
        assert result["driver"] == CONTRACT.dra_driver and result["pool"] == node_name
        assert result["consumedCapacity"] == {"memory": "20Gi"} and result.get("shareID")
        per_gpu[result["device"]] = per_gpu.get(result["device"], 0) + 20480
        claims.append(claim)
    assert per_gpu == {"gpu-0": 61440, "gpu-1": 61440}

    # NodePrepareResources for every claim, as kubelet's DRA manager names them.
    plugin = preparer.Preparer(
        node=nodefile.load(DEMO_NODE),
        settings=SETTINGS,
        pool=node_name,
        api=kube.KubernetesApi(admin),
        state=checkpoint.Checkpoint(scratch / "checkpoint.json", CONTRACT.dra_driver),
        cdi_dir=scratch / "cdi",
    )
    plugin.recover()
    refs = [preparer.ClaimRef(c["metadata"]["namespace"], c["metadata"]["uid"], c["metadata"]["name"]) for c in claims]
    results = asyncio.run(plugin.prepare(refs))
    assert all(r.error == "" for r in results.values()), results
    spec = json.loads(next((scratch / "cdi").glob("*.json")).read_text())
    assert "GPUSLICE_MEMORY_LIMIT_MIB=20480" in spec["devices"][0]["containerEdits"]["env"]


def test_the_real_allocator_gives_mig_requests_a_device_of_their_profile(
    admin, core, nodes, namespace, resource_api, device_classes
):
    node_name = f"{namespace}-n"
    core.create_node(k8skit.node_object(node_name))
    nodes.append(node_name)
    publish(admin, node_name)
    need = dra_claims.Need(kind="mig", containers=(dra_claims.ContainerNeed("containers", 0, mig_profile="1g.10gb"),))
    template = dra_claims.build(k8skit.pod_object("x"), need, SETTINGS).template
    for i in range(3):
        resource_api.create_namespaced_resource_claim(namespace, claim_from(template, f"mig-{i}"))
        core.create_namespaced_pod(namespace, pod_with_claim(f"mig-{i}", f"mig-{i}", node_name))
    for i in range(2):
        k8skit.bound_node(core, namespace, f"mig-{i}", timeout=90)
    k8skit.scheduling_failure(core, namespace, "mig-2", timeout=90)
    devices = sorted(
        json.loads(resource_api.read_namespaced_resource_claim(f"mig-{i}", namespace, _preload_content=False).data)[
            "status"
        ]["allocation"]["devices"]["results"][0]["device"]
        for i in range(2)
    )
    assert devices == ["gpu-2-mig-2", "gpu-2-mig-3"]
