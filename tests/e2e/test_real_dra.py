"""DRA mode on the real control plane and kubelet's real DRA manager.

The real kube-apiserver validates and stores our ResourceSlices, DeviceClasses and claim templates;
the real kube-scheduler's DRA allocator places webhook-built capacity requests on our devices
(shares never exceed a GPU, a share never spans GPUs, a pod that fits nowhere waits). On the node,
draharness runs kubelet's own DRA manager and plugin manager (e2e/k8s/cmd/draharness): our plugin,
a gpuslice-dra-plugin process, registers through the plugins_registry directory and is called over
real gRPC on its unix socket with the claims the real scheduler allocated and reserved for the pod;
the tests check the CDI devices kubelet would hand the runtime, the CDI spec files and the share's
environment, unpreparing, and that a restarted plugin keeps the claims it prepared (its checkpoint).

No container runtime runs: the CDI specs are read by the test, not injected into a container. The
old emulated path (the test calling the Preparer as kubelet would) is gone: everything it covered
is covered through the real manager.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import chartkit
import drakit
import jsonpatch
import k8skit
import kubernetes
import pytest

from gpuslice import config
from gpuslice.dra import cdi, kube, publisher, slices
from gpuslice.node import labels, nodefile
from gpuslice.sim import controlplane
from gpuslice.webhook import claim_templates, dra_claims, mutation
from gpuslice.webhook import cluster as webhook_cluster

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


def share_consumed(result: dict[str, Any]) -> str | None:
    """The memory a share's allocation result consumed; None when it also consumed a tag (the
    allocator records every capacity of the device, a share's tags at 0)."""
    consumed = dict(result["consumedCapacity"])
    memory = consumed.pop(CONTRACT.dra_capacity_memory)
    return memory if set(consumed.values()) == {"0"} else None


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


@dataclasses.dataclass
class DraNode:
    """A Node with kubelet's real DRA manager (draharness) and our DRA plugin registered with it."""

    plane: controlplane.ControlPlane
    name: str
    harness: drakit.DraHarness
    cdi_dir: pathlib.Path
    state_dir: pathlib.Path
    http_port: int
    plugin: Any = None

    def start_plugin(self) -> None:
        self.plugin = drakit.start_dra_plugin(
            self.plane,
            self.harness,
            DEMO_NODE,
            cdi_dir=self.cdi_dir,
            state_dir=self.state_dir,
            http_port=self.http_port,
        )

        # Ready: kubelet's plugin manager has registered it (NotifyRegistrationStatus) and its slices are published.
        def ready() -> bool:
            if self.plugin.popen.poll() is not None:
                raise AssertionError(f"the DRA plugin exited ({self.plugin.popen.returncode}):\n{self.plugin.tail()}")
            return self.metrics_page("/readyz")[0] == 200

        k8skit.wait_for("the DRA plugin to be registered and published", ready, timeout=60)
        assert self.harness.driver_registered(CONTRACT.dra_driver)

    def stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plane.stop_process(self.plugin)
            self.plugin = None

    def metrics_page(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=10) as answer:  # noqa: S310
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def prepared_claims(self) -> float:
        """The plugin's own gauge of the claims it holds prepared (its checkpoint)."""
        status, text = self.metrics_page("/metrics")
        assert status == 200, text
        (line,) = [line for line in text.splitlines() if line.startswith("gpuslice_dra_prepared_claims ")]
        return float(line.split()[1])

    def spec_file(self, claim_uid: str) -> pathlib.Path:
        return self.cdi_dir / cdi.spec_file_name(CONTRACT, claim_uid)


@pytest.fixture
def dra_node(cluster, core, nodes, namespace, scratch) -> Iterator[DraNode]:
    name = f"{namespace}-n"
    core.create_node(k8skit.node_object(name))
    nodes.append(name)
    # The harness first: kubelet wipes the node's ResourceSlices when it starts, before any driver registers.
    harness = drakit.DraHarness(cluster, name).start()
    node = DraNode(cluster, name, harness, scratch / "cdi", scratch / "plugin-state", k8skit.free_port())
    try:
        node.start_plugin()
        yield node
    finally:
        node.stop_plugin()
        harness.close()


def read_json(resource_api: Any, core: Any, kind: str, namespace: str, name: str) -> dict[str, Any]:
    if kind == "pod":
        raw = core.read_namespaced_pod(name, namespace, _preload_content=False)
    else:
        raw = resource_api.read_namespaced_resource_claim(name, namespace, _preload_content=False)
    return dict(json.loads(raw.data))


def create_shares(admin, core, resource_api, namespace: str, node_name: str, count: int) -> None:
    """`count` pods, each with a claim made from the webhook's template for 20 GiB shares."""
    need = dra_claims.Need(kind="gpu-memory", containers=(dra_claims.ContainerNeed("containers", 0, memory_mib=20480),))
    template = dra_claims.build(k8skit.pod_object("x"), need, SETTINGS).template
    templates = claim_templates.ClaimTemplates(claim_templates.KubernetesTemplateApi(admin))
    asyncio.run(templates.ensure(namespace, template))
    assert resource_api.read_namespaced_resource_claim_template(template["metadata"]["name"], namespace)
    for i in range(count):
        resource_api.create_namespaced_resource_claim(namespace, claim_from(template, f"share-{i}"))
        core.create_namespaced_pod(namespace, pod_with_claim(f"share-{i}", f"share-{i}", node_name))


def six_of_seven_bound(core: Any, namespace: str, node_name: str) -> tuple[list[str], str]:
    """The names of the six share pods the scheduler bound (all to `node_name`) and of the one left waiting."""
    names = [f"share-{i}" for i in range(7)]

    def probe() -> dict[str, str | None] | None:
        nodes = {name: core.read_namespaced_pod(name, namespace).spec.node_name for name in names}
        return nodes if sum(node is not None for node in nodes.values()) >= 6 else None

    nodes = k8skit.wait_for("six of the seven share pods to be bound", probe, timeout=90)
    placed = [name for name, node in nodes.items() if node is not None]
    assert len(placed) == 6 and {nodes[name] for name in placed} == {node_name}, nodes
    (waiting,) = set(names) - set(placed)
    return placed, waiting


def test_the_real_allocator_packs_webhook_shares_per_gpu_and_kubelets_dra_manager_prepares_them(
    admin, core, namespace, resource_api, device_classes, dra_node
):
    node_name = dra_node.name
    # 81408 MiB of whole units per H100: three 20 GiB shares each, six on the node, the seventh waits.
    create_shares(admin, core, resource_api, namespace, node_name, 7)
    # Any six: the scheduler's queue need not follow creation order (a pod seen before its claim is retried
    # after backoff, and a later one takes its place).
    placed, waiting = six_of_seven_bound(core, namespace, node_name)
    k8skit.scheduling_failure(core, namespace, waiting, timeout=90, containing="cannot allocate all claims")

    per_gpu: dict[str, int] = {}
    claims = []
    for name in placed:
        claim = read_json(resource_api, core, "claim", namespace, name)
        (result,) = claim["status"]["allocation"]["devices"]["results"]  # one device: a share never spans GPUs
        assert result["driver"] == CONTRACT.dra_driver and result["pool"] == node_name
        assert share_consumed(result) == "20Gi" and result.get("shareID")
        per_gpu[result["device"]] = per_gpu.get(result["device"], 0) + 20480
        claims.append(claim)
    assert per_gpu == {"gpu-0": 61440, "gpu-1": 61440}

    # Kubelet's DRA manager prepares each bound pod: it reads the claim, checks it is reserved for the pod and
    # calls our NodePrepareResources over gRPC on the socket our plugin registered.
    pods = [read_json(resource_api, core, "pod", namespace, name) for name in placed]
    for pod, claim in zip(pods, claims, strict=True):
        status, body = dra_node.harness.prepare(pod)
        assert status == 200, body
        uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        cdi_id = f"{CONTRACT.dra_cdi_kind}={cdi.device_name(uid, result['request'])}"
        assert body["containers"]["main"] == [cdi_id]  # what kubelet hands the container runtime
        (prepared,) = body["claims"][claim["metadata"]["name"]]
        assert (prepared["driver"], prepared["pool"], prepared["device"]) == (
            CONTRACT.dra_driver,
            node_name,
            result["device"],
        )
        assert prepared["shareID"] == result["shareID"] and prepared["requests"] == [result["request"]]
        # The runtime would read this file: the share's device with the environment of a 20 GiB share.
        spec = json.loads(dra_node.spec_file(uid).read_text())
        (device,) = spec["devices"]
        assert f"{spec['kind']}={device['name']}" == cdi_id
        env = device["containerEdits"]["env"]
        assert "GPUSLICE_MEMORY_LIMIT_MIB=20480" in env
        gpu = next(g for g in nodefile.load(DEMO_NODE).gpus if g.index == int(result["device"].split("-")[1]))
        assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in env
    assert dra_node.prepared_claims() == 6

    # The pod the scheduler could not place has no allocated claim: kubelet's manager refuses it, our plugin is
    # never asked.
    status, body = dra_node.harness.prepare(read_json(resource_api, core, "pod", namespace, waiting))
    assert status == 409 and waiting in body["error"], body
    assert dra_node.prepared_claims() == 6

    # The first pod terminates: kubelet unprepares its claim, our plugin removes its CDI spec; the rest stay.
    status, body = dra_node.harness.unprepare(pods[0])
    assert status == 204, body
    assert not dra_node.spec_file(claims[0]["metadata"]["uid"]).exists()
    assert all(dra_node.spec_file(c["metadata"]["uid"]).exists() for c in claims[1:])
    assert dra_node.prepared_claims() == 5


def test_a_restarted_plugin_keeps_the_claims_kubelet_prepared(
    admin, core, namespace, resource_api, device_classes, dra_node
):
    create_shares(admin, core, resource_api, namespace, dra_node.name, 3)
    for i in range(3):
        k8skit.bound_node(core, namespace, f"share-{i}", timeout=90)
    pods = [read_json(resource_api, core, "pod", namespace, f"share-{i}") for i in range(3)]
    uids = [read_json(resource_api, core, "claim", namespace, f"share-{i}")["metadata"]["uid"] for i in range(3)]
    for pod in pods[:2]:
        status, body = dra_node.harness.prepare(pod)
        assert status == 200, body

    # The plugin restarts (an upgrade, a crash): kubelet's plugin manager sees the registration socket go and come
    # back, and registers the new process; the claims it prepared before are still its own (the checkpoint).
    dra_node.stop_plugin()
    dra_node.start_plugin()
    assert dra_node.prepared_claims() == 2

    # Kubelet goes on with the new process: a new pod is prepared, and unpreparing a claim prepared before the
    # restart removes its CDI spec, which only a plugin that remembers the claim can do.
    status, body = dra_node.harness.prepare(pods[2])
    assert status == 200, body
    assert dra_node.spec_file(uids[2]).exists()
    status, body = dra_node.harness.unprepare(pods[0])
    assert status == 204, body
    assert not dra_node.spec_file(uids[0]).exists()
    assert dra_node.spec_file(uids[1]).exists()
    assert dra_node.prepared_claims() == 2


def test_after_a_kubelet_restart_the_plugin_is_registered_again_and_republishes_its_slices(
    admin, core, namespace, resource_api, device_classes, dra_node
):
    create_shares(admin, core, resource_api, namespace, dra_node.name, 2)
    for i in range(2):
        k8skit.bound_node(core, namespace, f"share-{i}", timeout=90)
    pods = [read_json(resource_api, core, "pod", namespace, f"share-{i}") for i in range(2)]
    uids = [read_json(resource_api, core, "claim", namespace, f"share-{i}")["metadata"]["uid"] for i in range(2)]
    prepared = []
    for pod in pods:
        status, body = dra_node.harness.prepare(pod)
        assert status == 200, body
        prepared.append(body["containers"])

    # Kubelet restarts; the plugin keeps running. The new kubelet deletes the node's ResourceSlices (none of its
    # drivers has registered yet), finds our registration socket and registers the plugin again.
    dra_node.harness.restart()
    assert dra_node.harness.driver_registered(CONTRACT.dra_driver)
    wanted = slices.comparable(slices.build_slices(nodefile.load(DEMO_NODE), CONTRACT, dra_node.name))

    def republished() -> bool:
        stored = json.loads(
            resource_api.list_resource_slice(
                field_selector=f"spec.nodeName={dra_node.name}", _preload_content=False
            ).data
        )["items"]
        return bool(stored) and slices.comparable(stored) == wanted

    k8skit.wait_for("the plugin to publish its slices again", republished, timeout=30)

    # The restarted manager still knows what it prepared (its own checkpoint) and goes on calling our plugin.
    status, body = dra_node.harness.prepare(pods[1])
    assert status == 200 and body["containers"] == prepared[1], body
    status, body = dra_node.harness.unprepare(pods[0])
    assert status == 204, body
    assert not dra_node.spec_file(uids[0]).exists() and dra_node.spec_file(uids[1]).exists()
    assert dra_node.prepared_claims() == 1


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


def h100_and_h200_nodes(admin, core, nodes, namespace: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Two nodes of two GPU classes, their slices published: the demo node's H100s and 8 x H200."""
    h100, h200 = f"{namespace}-h100", f"{namespace}-h200"
    for name, file in ((h100, DEMO_NODE), (h200, k8skit.EXAMPLES / "h200x8-node.yaml")):
        core.create_node(k8skit.node_object(name))
        nodes.append(name)
        slice_publisher = publisher.SlicePublisher(
            node=nodefile.load(file), settings=SETTINGS, node_name=name, api=kube.KubernetesApi(admin)
        )
        assert asyncio.run(slice_publisher.sync()) is True
    return h100, h200


def test_whole_gpus_take_another_class_when_the_one_the_webhook_preferred_is_full(
    admin, core, nodes, namespace, resource_api, device_classes
):
    """The webhook prefers a class from its labels, which may lag: the claim lists every class in
    that order (DRA's prioritized list), so the real allocator takes the next class that has the
    GPUs instead of leaving the pod waiting on the full one; the GPUs of one pod alike in memory."""
    h100, h200 = h100_and_h200_nodes(admin, core, nodes, namespace)
    need = dra_claims.Need(
        kind="whole-gpus",
        containers=(dra_claims.ContainerNeed("containers", 0, gpus=2),),
        gpu_memory_mib=(81559, 143771),  # the H100s first, as a webhook whose labels lag would have it
    )
    template = dra_claims.build(k8skit.pod_object("x"), need, SETTINGS).template
    for i in range(2):
        resource_api.create_namespaced_resource_claim(namespace, claim_from(template, f"whole-{i}"))
        pod = k8skit.pod_object(f"whole-{i}")
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpuslice"}]}
        pod["spec"]["resourceClaims"] = [{"name": "gpuslice", "resourceClaimName": f"whole-{i}"}]
        core.create_namespaced_pod(namespace, pod)
        k8skit.bound_node(core, namespace, f"whole-{i}", timeout=90)

    def allocation(name: str) -> dict[str, Any]:
        claim = resource_api.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        return json.loads(claim.data)["status"]["allocation"]

    first, second = allocation("whole-0"), allocation("whole-1")
    assert {r["pool"] for r in first["devices"]["results"]} == {h100}  # both H100s: the preferred class
    assert [r["request"] for r in first["devices"]["results"]] == ["gpu/m81559", "gpu/m81559"]
    assert {r["pool"] for r in second["devices"]["results"]} == {h200}  # the H100s are taken: the H200s
    assert [r["request"] for r in second["devices"]["results"]] == ["gpu/m143771", "gpu/m143771"]


def test_a_fraction_takes_the_same_fraction_of_another_class_when_its_own_is_full(
    admin, core, nodes, namespace, resource_api, device_classes
):
    """A bare pod's gpu-fraction 0.5 lists the class the webhook chose (the H100s), then the H200s,
    each alternative asking its class's tag at 0 beside half its GPU: the real allocator keeps each
    on its class by the tag and, once the H100s hold two halves each, takes half of an H200; the
    tag is recorded as consumed at 0."""
    h100, h200 = h100_and_h200_nodes(admin, core, nodes, namespace)
    half = dra_claims.ContainerNeed("containers", 0, memory_mib=40704, classes=((81559, 40704), (143771, 71680)))
    template = dra_claims.build(
        k8skit.pod_object("x"), dra_claims.Need(kind="gpu-fraction", containers=(half,)), SETTINGS
    )
    spec = template.template

    def place(name: str, node_name: str | None) -> None:
        resource_api.create_namespaced_resource_claim(namespace, claim_from(spec, name))
        pod = pod_with_claim(name, name, node_name or "")
        if node_name is None:
            del pod["spec"]["nodeSelector"]
        core.create_namespaced_pod(namespace, pod)

    def result(name: str) -> dict[str, Any]:
        claim = resource_api.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        (only,) = json.loads(claim.data)["status"]["allocation"]["devices"]["results"]
        return only

    for i in range(4):  # the H100 node's two H100s, two halves each (its third GPU is in MIG mode)
        place(f"h100-{i}", h100)
        assert k8skit.bound_node(core, namespace, f"h100-{i}", timeout=90) == h100
    assert sorted(result(f"h100-{i}")["device"] for i in range(4)) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    assert {result(f"h100-{i}")["request"] for i in range(4)} == {"gpu/m81559"}
    place("h100-full", h100)
    k8skit.scheduling_failure(core, namespace, "h100-full", timeout=90, containing="cannot allocate all claims")

    place("any", None)
    assert k8skit.bound_node(core, namespace, "any", timeout=90) == h200
    taken = result("any")
    assert taken["request"] == "gpu/m143771" and taken["pool"] == h200
    assert taken["consumedCapacity"][CONTRACT.dra_capacity_memory] == "70Gi"  # 71680Mi, as the API server writes it
    assert taken["consumedCapacity"][CONTRACT.dra_tag_memory(143771)] == "0"


def test_a_whole_gpu_by_its_tag_takes_only_a_shared_gpu_that_holds_nothing(
    admin, core, nodes, namespace, resource_api, device_classes
):
    """A whole GPU asks the share class (no selector) for a tag and no memory: the real allocator
    keeps it off MIG devices (no tag) and off a GPU holding a share (the memory's default, the whole
    GPU, no longer fits), and records the whole memory and the tag as consumed."""
    node_name = f"{namespace}-n"
    core.create_node(k8skit.node_object(node_name))
    nodes.append(node_name)
    publish(admin, node_name)
    share = dra_claims.Need(kind="gpu-memory", containers=(dra_claims.ContainerNeed("containers", 0, memory_mib=256),))
    whole = dra_claims.Need(kind="whole-gpus", containers=(dra_claims.ContainerNeed("containers", 0, gpus=1),))
    names = ["share", "whole-0", "whole-1"]
    for name, need in zip(names, (share, whole, whole), strict=True):
        template = dra_claims.build(k8skit.pod_object("x"), need, SETTINGS).template
        resource_api.create_namespaced_resource_claim(namespace, claim_from(template, name))
        core.create_namespaced_pod(namespace, pod_with_claim(name, name, node_name))
        if name != "whole-1":
            k8skit.bound_node(core, namespace, name, timeout=90)
    k8skit.scheduling_failure(core, namespace, "whole-1", timeout=90)  # gpu-0 holds the share; gpu-2 is MIG

    def result(name: str) -> dict[str, Any]:
        claim = resource_api.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        (only,) = json.loads(claim.data)["status"]["allocation"]["devices"]["results"]
        return only

    shared, taken = result("share"), result("whole-0")
    assert shared["device"] == "gpu-0" and taken["device"] == "gpu-1"
    assert taken["consumedCapacity"] == {
        CONTRACT.dra_capacity_memory: "81408Mi",
        CONTRACT.dra_tag_whole: "1",
        CONTRACT.dra_tag_memory(81559): "0",
    }
    assert share_consumed(shared) == "256Mi"


def webhook_pod(name: str, annotations: dict[str, str], **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A KAI-annotated pod converted by the webhook's mutation in DRA mode (cluster view: the demo node,
    labelled as the DRA plugin labels it): (the patched pod, its claim template)."""
    view = webhook_cluster.ClusterView(CONTRACT, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    view.update_node("demo", labels.node_labels(nodefile.load(DEMO_NODE), CONTRACT))
    original = k8skit.pod_object(name, annotations=annotations, limits={"nvidia.com/gpu": "1"}, **spec)
    outcome = mutation.mutate(original, settings=SETTINGS, cluster=view)
    assert outcome.allowed, outcome.message
    (template,) = outcome.objects
    return jsonpatch.apply_patch(original, outcome.patch), template


def create_from_webhook(
    admin, core, resource_api, namespace: str, name: str, annotations: dict[str, str], **spec: Any
) -> dict[str, Any]:
    """The webhook's pod and template in the cluster; its claim made from the template under the pod's
    name (no resource-claim controller runs here). Returns the template. The pod is created without
    the KAI annotations it was converted from: the session's release (tests/e2e/conftest.py) runs a
    device-plugin-mode webhook for every annotated pod of the cluster, which would refuse it."""
    pod, template = webhook_pod(name, annotations, **spec)
    for key in annotations:
        pod["metadata"]["annotations"].pop(key, None)
    asyncio.run(
        claim_templates.ClaimTemplates(claim_templates.KubernetesTemplateApi(admin)).ensure(namespace, template)
    )
    resource_api.create_namespaced_resource_claim(namespace, claim_from(template, name))
    pod["spec"]["resourceClaims"] = [{"name": dra_claims.CLAIM_NAME, "resourceClaimName": name}]
    core.create_namespaced_pod(namespace, pod)
    return template


def test_a_fraction_of_two_gpus_gets_two_distinct_gpus_of_one_node_and_both_are_prepared(
    admin, core, nodes, namespace, resource_api, device_classes, dra_node
):
    """gpu-fraction 0.5 with gpu-fraction-num-devices 2: one request of two devices with a capacity each,
    kept on distinct GPUs. A node with one H100 taken whole does not take the pod, although its other
    H100 could hold both halves; a node with two H100s free does, one half on each, and kubelet's DRA
    manager and our plugin prepare both GPUs for the container."""
    pair = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}
    busy = f"{namespace}-busy"
    # Labelled as its plugin labels it before the whole GPU is prepared (labels that lag the allocation):
    # the pod's required terms let it through, and the allocator, not a label, keeps it off.
    free = labels.node_labels(nodefile.load(DEMO_NODE), CONTRACT)
    core.create_node(k8skit.node_object(busy, labels=free))
    nodes.append(busy)
    publish(admin, busy)
    whole = dra_claims.Need(kind="whole-gpus", containers=(dra_claims.ContainerNeed("containers", 0, gpus=1),))
    template = dra_claims.build(k8skit.pod_object("x"), whole, SETTINGS).template
    resource_api.create_namespaced_resource_claim(namespace, claim_from(template, "whole"))
    core.create_namespaced_pod(namespace, pod_with_claim("whole", "whole", busy))
    assert k8skit.bound_node(core, namespace, "whole", timeout=90) == busy

    # The template the webhook made: one request of two devices, 159 units of an H100 each, on distinct GPUs.
    template = create_from_webhook(
        admin, core, resource_api, namespace, "pinned", pair, nodeSelector={"kubernetes.io/hostname": busy}
    )
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"]["count"] == 2 and request["exactly"]["capacity"] == {
        "requests": {CONTRACT.dra_capacity_memory: "40704Mi"}
    }
    assert devices["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.gpuslice.io/uuid"}]
    k8skit.scheduling_failure(core, namespace, "pinned", timeout=90, containing="cannot allocate all claims")

    # Unpinned, the pods go to the node with two free H100s: one half on each, twice (each GPU then full).
    uuids = {slices.device_name(g): g.uuid for g in nodefile.load(DEMO_NODE).gpus if not g.mig_enabled}
    for name in ("pair-0", "pair-1"):
        create_from_webhook(admin, core, resource_api, namespace, name, pair)
        assert k8skit.bound_node(core, namespace, name, timeout=90) == dra_node.name
        claim = read_json(resource_api, core, "claim", namespace, name)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"], results
        assert all(r["request"] == "gpu" and share_consumed(r) == "40704Mi" for r in results)
        assert all(r["pool"] == dra_node.name and r.get("shareID") for r in results)

        # Kubelet prepares the pod: one CDI device for the request, carrying both GPUs and a half of each.
        status, body = dra_node.harness.prepare(read_json(resource_api, core, "pod", namespace, name))
        assert status == 200, body
        uid = claim["metadata"]["uid"]
        cdi_id = f"{CONTRACT.dra_cdi_kind}={cdi.device_name(uid, 'gpu')}"
        assert body["containers"]["main"] == [cdi_id]
        prepared = body["claims"][name]
        assert sorted((p["device"], p["shareID"]) for p in prepared) == sorted(
            (r["device"], r["shareID"]) for r in results
        )
        assert all(p["requests"] == ["gpu"] and p["pool"] == dra_node.name for p in prepared)
        spec = json.loads(dra_node.spec_file(uid).read_text())
        (device,) = spec["devices"]
        env = device["containerEdits"]["env"]
        visible = {r["device"]: uuids[r["device"]] for r in results}
        assert f"NVIDIA_VISIBLE_DEVICES={','.join(visible[r['device']] for r in results)}" in env, env
        assert "GPUSLICE_MEMORY_LIMIT_MIB=40704" in env and "GPUSLICE_GPU_COUNT=2" in env, env
        assert "GPUSLICE_GPU_FRACTION=0.5" in env, env
        if SETTINGS.mps.enabled:
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40704M,1=40704M" in env, env
    assert dra_node.prepared_claims() == 2

    # Both H100s are full now: a third pair waits.
    create_from_webhook(admin, core, resource_api, namespace, "pair-2", pair)
    k8skit.scheduling_failure(core, namespace, "pair-2", timeout=90, containing="cannot allocate all claims")


def test_mig_or_share_takes_a_free_mig_slice_and_else_a_share_of_its_memory(
    admin, core, namespace, resource_api, device_classes, dra_node
):
    """gpu-memory 9000 with gpuslice.io/isolation: mig and gpuslice.io/mig-or-share: "true": one request
    listing the 1g.10gb slice, else a share of its 9728 MiB. While the node has a 1g.10gb slice free the
    real allocator gives the pod one (the H100s are free too: the slice comes first); once both are taken,
    the next pod gets a share of an H100 where a pod asking for the slice alone waits. Kubelet's DRA
    manager and our plugin prepare each under the request the container references, with a MIG device's
    environment or a share's."""
    either = {"gpu-memory": "9000", "gpuslice.io/isolation": "mig", "gpuslice.io/mig-or-share": "true"}
    names = [f"either-{i}" for i in range(3)]
    template: dict[str, Any] = {}
    for name in names:  # one at a time: which pod finds the slices taken is then known
        template = create_from_webhook(admin, core, resource_api, namespace, name, either)
        assert k8skit.bound_node(core, namespace, name, timeout=90) == dra_node.name
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert [a["name"] for a in request["firstAvailable"]] == ["mig", "share"]
    claims = [read_json(resource_api, core, "claim", namespace, name) for name in names]
    results = [claim["status"]["allocation"]["devices"]["results"] for claim in claims]
    assert sorted((r["request"], r["device"]) for (r,) in results[:2]) == [
        ("gpu/mig", "gpu-2-mig-2"),
        ("gpu/mig", "gpu-2-mig-3"),
    ]
    (share,) = results[2]
    assert share["request"] == "gpu/share" and share["device"] in ("gpu-0", "gpu-1"), share
    assert share_consumed(share) == "9728Mi" and share.get("shareID")

    # Without mig-or-share the same pod waits: both 1g.10gb slices are taken.
    plain = {"gpu-memory": "9000", "gpuslice.io/isolation": "mig"}
    create_from_webhook(admin, core, resource_api, namespace, "mig-only", plain)
    k8skit.scheduling_failure(core, namespace, "mig-only", timeout=90, containing="cannot allocate all claims")

    # Prepared under the request "gpu" whichever alternative was taken: the container's one CDI device.
    node = nodefile.load(DEMO_NODE)
    uuids = {slices.device_name(g): g.uuid for g in node.gpus if not g.mig_enabled}
    uuids.update(
        {slices.mig_device_name(g, i): m.uuid for g in node.gpus if g.mig_enabled for i, m in enumerate(g.mig)}
    )
    for name, claim, (result,) in zip(names, claims, results, strict=True):
        status, body = dra_node.harness.prepare(read_json(resource_api, core, "pod", namespace, name))
        assert status == 200, body
        uid = claim["metadata"]["uid"]
        assert body["containers"]["main"] == [f"{CONTRACT.dra_cdi_kind}={cdi.device_name(uid, 'gpu')}"]
        (prepared,) = body["claims"][name]
        assert prepared["requests"] == ["gpu"] and prepared["device"] == result["device"]
        assert prepared.get("shareID") == result.get("shareID")
        (device,) = json.loads(dra_node.spec_file(uid).read_text())["devices"]
        env = device["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={uuids[result['device']]}" in env, env
        assert "GPUSLICE_MEMORY_LIMIT_MIB=9728" in env, env
        # A share says its fraction of the GPU (38 of an H100's 318 units); a MIG device is all the container's.
        assert any(e.startswith("GPUSLICE_GPU_FRACTION=") for e in env) is (result is share), env
    assert dra_node.prepared_claims() == 3


def test_a_fraction_falls_back_only_to_nodes_whose_free_gpus_have_the_cpu_it_asks_per_gpu(
    admin, core, nodes, namespace, resource_api, device_classes
):
    """A bare pod's half asking 2 cores (4 per GPU), chosen for the H200s, may take half an H100
    instead, but only on a node whose free GPUs have 4 cores each: the real scheduler keeps it off
    the H100 node while its label says 3, and binds it there, to the H100 alternative, at 8."""
    h100, h200 = h100_and_h200_nodes(admin, core, nodes, namespace)
    view = webhook_cluster.ClusterView(CONTRACT, default_gpu_memory_mib=SETTINGS.default_gpu_memory_mib)
    for name, file, free_cpu in ((h100, DEMO_NODE, 16000), (h200, k8skit.EXAMPLES / "h200x8-node.yaml", 256000)):
        view.update_node(
            name, {**labels.node_labels(nodefile.load(file), CONTRACT), CONTRACT.label_free_cpu_milli: str(free_cpu)}
        )
    original = k8skit.pod_object(
        "fallback", annotations={"gpu-fraction": "0.5"}, limits={"nvidia.com/gpu": "1"}, requests={"cpu": "2"}
    )
    outcome = mutation.mutate(original, settings=SETTINGS, cluster=view)
    assert outcome.allowed and outcome.decision["classMemoryMiB"] == 143771, outcome.message
    assert outcome.decision["otherClassesMiB"] == [81559]
    pod = jsonpatch.apply_patch(original, outcome.patch)
    pod["metadata"]["annotations"].pop("gpu-fraction")  # the session's device-plugin-mode webhook would refuse it
    (template,) = outcome.objects
    asyncio.run(
        claim_templates.ClaimTemplates(claim_templates.KubernetesTemplateApi(admin)).ensure(namespace, template)
    )
    resource_api.create_namespaced_resource_claim(namespace, claim_from(template, "fallback"))
    pod["spec"]["resourceClaims"] = [{"name": dra_claims.CLAIM_NAME, "resourceClaimName": "fallback"}]

    # The H200 node is full by its labels; the H100 node has room for half an H100 and 3 cores per free GPU.
    memory, block, per_gpu = (
        CONTRACT.label_gpu_memory_mib,
        CONTRACT.label_free_block_units,
        CONTRACT.label_cpu_per_free_gpu_milli,
    )
    core.patch_node(h200, {"metadata": {"labels": {memory: "143771", block: "0"}}})
    core.patch_node(h100, {"metadata": {"labels": {memory: "81559", block: "318", per_gpu: "3000"}}})
    core.create_namespaced_pod(namespace, pod)
    message = k8skit.scheduling_failure(core, namespace, "fallback", timeout=90)
    assert "didn't match Pod's node affinity/selector" in message, message

    core.patch_node(h100, {"metadata": {"labels": {per_gpu: "8000"}}})
    assert k8skit.bound_node(core, namespace, "fallback", timeout=90) == h100
    claim = read_json(resource_api, core, "claim", namespace, "fallback")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/m81559" and result["pool"] == h100 and share_consumed(result) == "40704Mi"
