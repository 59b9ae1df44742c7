"""Steering on the real kube-scheduler: our labeller writes a node's labels to the real API server (as
the plugin's ServiceAccount, through the chart's node-write policy), and the real scheduler places
webhook-mutated pods by them: the required terms keep a pod off a node where no single GPU has room
(even when the node's total allocatable would), the preferred terms pack shares, and the chart's
bin-packing profile runs in a real kube-scheduler with the chart's own configuration and identity.
The CPU headroom the labeller publishes is what the scheduler counts, and the CPU-pod terms place
a pod that asks for no device where the scheduler is meant to put it.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import pytest
import yaml

from gpuslice import config as config_
from gpuslice.node import nodefile
from gpuslice.sim import controlplane
from gpuslice.webhook import steering

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CONTRACT = config_.Config().contract
GPU_MEMORY = CONTRACT.gpu_memory_resource
NVIDIA_GPU = "nvidia.com/gpu"
DEMO_NODE = k8skit.EXAMPLES / "demo-node.yaml"
H100_A = "GPU-21302f2a-76fb-5940-b684-dae50f92c162"
H100_B = "GPU-eeca949e-f642-56d1-9ca3-6efaa80acfb1"
GROUP = "e2e.gpuslice.io/group"


def _share(name: str, group: str, annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    return k8skit.pod_object(name, annotations=annotations, limits={NVIDIA_GPU: 1}, nodeSelector={GROUP: group}, **spec)


@pytest.fixture
def labelled_node(
    release: Any,
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    nodes: list[str],
    namespace: str,
    workdir: pathlib.Path,
) -> Iterator[tuple[str, k8skit.Harness]]:
    """Node A registered as a kubelet would (no labels of ours yet), kubelet's device manager for it, and
    our device plugin on it with its pod-bound ServiceAccount token: the labeller publishes A's labels."""
    name = f"{namespace}-a"
    node = nodefile.load(DEMO_NODE)
    bare = k8skit.gpu_node_object(name, node, extra_labels={GROUP: namespace})
    bare["metadata"]["labels"] = {
        k: v for k, v in bare["metadata"]["labels"].items() if not k.startswith(CONTRACT.prefix + "/gpu")
    }
    core.create_node(bare)
    nodes.append(name)
    account = f"{release.fullname}-device-plugin"
    plugin_pod = core.create_namespaced_pod(
        release.namespace, k8skit.pod_object(f"plugin-{namespace}", serviceAccountName=account, nodeName=name)
    )
    harness = k8skit.Harness(cluster, workdir, name=f"dmharness-{namespace}").start()
    plugin = k8skit.start_device_plugin(
        cluster,
        harness,
        DEMO_NODE,
        name=f"device-plugin-{namespace}",
        node_name=name,
        kubeconfig=release.kubeconfig_of(account, bound_pod=plugin_pod),
        extra_args=["--steering-label-min-interval-seconds=0.2", "--steering-pod-resources-poll-seconds=0.5"],
    )
    try:
        yield name, harness
    finally:
        cluster.stop_process(plugin.process)
        harness.close()


def _labels(core: kubernetes.client.CoreV1Api, node: str) -> dict[str, str]:
    return dict(core.read_node(node).metadata.labels or {})


def test_the_labeller_publishes_and_updates_the_nodes_labels_on_the_real_api_server(
    labelled_node: tuple[str, k8skit.Harness], core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    name, harness = labelled_node
    free_units = CONTRACT.label_free_units
    published = k8skit.wait_for("the labeller's first write", lambda: _labels(core, name).get(free_units), timeout=60)
    assert published == "636"  # 2 x H100 of 318 units
    labels = _labels(core, name)
    assert labels[CONTRACT.label_gpu_memory_mib] == "81559"
    assert labels[CONTRACT.label_free_gpus] == "2"
    assert labels[CONTRACT.label_mig_free("1g.10gb")] == "2"

    # The real scheduler binds a share to A; kubelet's device manager admits it through our plugin.
    core.create_namespaced_pod(namespace, _share("share", namespace, {"gpu-fraction": "0.5"}))
    assert k8skit.bound_node(core, namespace, "share") == name
    bound = core.read_namespaced_pod("share", namespace)
    status, admitted = harness.admit(kubernetes.client.ApiClient().sanitize_for_serialization(bound))
    assert status == 200, admitted
    units = len(admitted["containers"]["main"]["devices"][GPU_MEMORY])
    assert units == 159  # floor(0.5 x 318)
    k8skit.wait_for(
        "the labels to follow the allocation",
        lambda: _labels(core, name).get(free_units) == str(636 - units) or None,
        timeout=30,
    )
    labels = _labels(core, name)
    assert labels[CONTRACT.label_free_gpus] == "1"
    assert labels[CONTRACT.label_free_block_units] == "318"
    assert labels[CONTRACT.label_free_partial_block_units] == str(318 - units)


def test_a_pod_goes_where_one_gpu_has_room_not_where_the_node_total_does(
    release: Any, core: kubernetes.client.CoreV1Api, nodes: list[str], namespace: str
) -> None:
    node = nodefile.load(DEMO_NODE)
    roomy, crowded = f"{namespace}-roomy", f"{namespace}-crowded"
    # crowded: 10 units free on each H100 per its labels, while the scheduler, counting only bound
    # pods (none), sees all 636 units allocatable: only the label terms keep the pod off it.
    core.create_node(
        k8skit.gpu_node_object(crowded, node, allocated={H100_A: 308, H100_B: 308}, extra_labels={GROUP: namespace})
    )
    core.create_node(
        k8skit.gpu_node_object(roomy, node, allocated={H100_A: 200, H100_B: 200}, extra_labels={GROUP: namespace})
    )
    nodes += [roomy, crowded]
    for i in range(3):
        core.create_namespaced_pod(namespace, _share(f"eight-gib-{i}", namespace, {"gpu-memory": "8Gi"}))
        assert k8skit.bound_node(core, namespace, f"eight-gib-{i}") == roomy
    pod = core.read_namespaced_pod("eight-gib-0", namespace)
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    expressions = {e.key: e for term in required.node_selector_terms for e in term.match_expressions}
    assert expressions[CONTRACT.label_free_block_units].operator == "Gt"
    assert expressions[CONTRACT.label_free_block_units].values == ["31"]  # needs 32 units on one GPU

    # Larger than any free block anywhere: unschedulable, and the scheduler says why.
    core.create_namespaced_pod(namespace, _share("too-big", namespace, {"gpu-memory": "40Gi"}))
    message = k8skit.scheduling_failure(core, namespace, "too-big")
    assert "didn't match Pod's node affinity/selector" in message


def test_a_share_prefers_a_partly_used_gpu_to_breaking_a_whole_one(
    release: Any, core: kubernetes.client.CoreV1Api, nodes: list[str], namespace: str
) -> None:
    node = nodefile.load(DEMO_NODE)
    partly, whole = f"{namespace}-partly", f"{namespace}-whole"
    core.create_node(k8skit.gpu_node_object(partly, node, allocated={H100_A: 200}, extra_labels={GROUP: namespace}))
    core.create_node(k8skit.gpu_node_object(whole, node, extra_labels={GROUP: namespace}))
    nodes += [partly, whole]
    core.create_namespaced_pod(namespace, _share("quarter", namespace, {"gpu-fraction": "0.25"}))
    assert k8skit.bound_node(core, namespace, "quarter") == partly


def test_the_charts_binpack_profile_runs_in_the_real_scheduler_and_packs_the_fuller_node(
    release: Any,
    cluster: controlplane.ControlPlane,
    core: kubernetes.client.CoreV1Api,
    nodes: list[str],
    namespace: str,
) -> None:
    node = nodefile.load(DEMO_NODE)
    names = [f"{namespace}-{i}" for i in range(2)]
    for name in names:
        core.create_node(k8skit.gpu_node_object(name, node, extra_labels={GROUP: namespace}))
        nodes.append(name)
    original = json.loads(json.dumps(release.values))
    release.upgrade({**original, "scheduler": {"enabled": True}})
    scheduler = None
    try:
        config_map = core.read_namespaced_config_map(f"{release.fullname}-scheduler", release.namespace)
        configuration = yaml.safe_load(config_map.data["scheduler-config.yaml"])
        profile = configuration["profiles"][0]["schedulerName"]
        scheduler = cluster.start_scheduler(
            "kube-scheduler-binpack",
            configuration=configuration,
            kubeconfig=release.kubeconfig_of(f"{release.fullname}-scheduler"),
        )
        placed = []
        for i in range(4):
            pod = core.create_namespaced_pod(namespace, _share(f"packed-{i}", namespace, {"gpu-fraction": "0.2"}))
            assert pod.spec.scheduler_name == profile  # set by the webhook (config.schedulerName)
            placed.append(k8skit.bound_node(core, namespace, f"packed-{i}"))
        # MostAllocated on gpu-memory: every pod follows the first onto the node already in use.
        assert len(set(placed)) == 1, placed
    finally:
        if scheduler is not None:
            cluster.stop_process(scheduler)
        release.upgrade(original)


def test_the_published_cpu_headroom_is_what_the_real_scheduler_counts(
    labelled_node: tuple[str, k8skit.Harness], core: kubernetes.client.CoreV1Api, namespace: str, admin: Any
) -> None:
    """Sidecars, pod-level requests, a RuntimeClass's overhead and an in-place resize are counted by
    the labeller as kube-scheduler counts them: a pod asking one millicore more than the published
    headroom is refused by the real scheduler, one asking exactly the headroom is placed."""
    name, _ = labelled_node
    free_cpu = CONTRACT.label_free_cpu_milli
    k8skit.wait_for("the first headroom", lambda: _labels(core, name).get(free_cpu) == "64000" or None, timeout=60)

    node_api = kubernetes.client.NodeV1Api(admin)
    runtime_class = f"{namespace}-vm"
    node_api.create_runtime_class(
        {"metadata": {"name": runtime_class}, "handler": "vm", "overhead": {"podFixed": {"cpu": "1"}}}
    )
    try:
        sidecar = k8skit.pod_object("sidecar", requests={"cpu": "10"}, nodeName=name, runtimeClassName=runtime_class)
        sidecar["spec"]["initContainers"] = [
            {
                "name": "proxy",
                "image": "registry.invalid/e2e:1",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "6"}},
            }
        ]
        pod_level = k8skit.pod_object("pod-level", requests={"cpu": "1"}, nodeName=name)
        pod_level["spec"]["resources"] = {"requests": {"cpu": "20"}}
        resized = k8skit.pod_object("resized", requests={"cpu": "10"}, nodeName=name)
        for pod in (sidecar, pod_level, resized):
            core.create_namespaced_pod(namespace, pod)
        # As kubelet reports a running container: allocated and running at 10 CPUs.
        _report_running(core, namespace, "resized", "10")
        # 64 - (10 + 6 + 1) - 20 - 10 (the old count, max(containers, init) without overhead or
        # pod-level requests, said 64 - 10 - 1 - 10 = 43)
        k8skit.wait_for("headroom 17", lambda: _labels(core, name).get(free_cpu) == "17000" or None, timeout=30)

        # Asked down to 4 CPUs: until kubelet has carried it out the scheduler still counts 10.
        core.patch_namespaced_pod_resize(
            "resized", namespace, {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "4"}}}]}}
        )
        core.create_namespaced_pod(namespace, _probe("over-17", "17001m", namespace))
        assert "Insufficient cpu" in k8skit.scheduling_failure(core, namespace, "over-17")
        assert _labels(core, name)[free_cpu] == "17000"
        core.delete_namespaced_pod("over-17", namespace, grace_period_seconds=0)

        _report_running(core, namespace, "resized", "4")  # carried out: 6 CPUs given back
        k8skit.wait_for("headroom 23", lambda: _labels(core, name).get(free_cpu) == "23000" or None, timeout=30)
        core.create_namespaced_pod(namespace, _probe("over-23", "23001m", namespace))
        assert "Insufficient cpu" in k8skit.scheduling_failure(core, namespace, "over-23")
        core.delete_namespaced_pod("over-23", namespace, grace_period_seconds=0)
        core.create_namespaced_pod(namespace, _probe("exactly-23", "23", namespace))
        assert k8skit.bound_node(core, namespace, "exactly-23") == name
    finally:
        node_api.delete_runtime_class(runtime_class)


def _probe(pod_name: str, cpu: str, group: str) -> dict[str, Any]:
    return k8skit.pod_object(pod_name, requests={"cpu": cpu}, nodeSelector={GROUP: group})


def _report_running(core: kubernetes.client.CoreV1Api, namespace: str, pod_name: str, cpu: str) -> None:
    """The status kubelet writes for a running container with `cpu` allocated and in force."""
    status = {
        "name": "main",
        "image": "registry.invalid/e2e:1",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": "2026-11-24T00:00:00Z"}},
        "allocatedResources": {"cpu": cpu},
        "resources": {"requests": {"cpu": cpu}},
    }
    core.patch_namespaced_pod_status(
        pod_name, namespace, {"status": {"phase": "Running", "containerStatuses": [status]}}
    )


def test_a_cpu_pod_goes_to_the_node_with_the_least_gpu_memory_left_with_the_nearly_full_bound(
    release: Any, core: kubernetes.client.CoreV1Api, nodes: list[str], namespace: str
) -> None:
    """steering.cpuPodsNearlyFullMiB's terms, scored by the real scheduler: of four nodes alike in
    CPU, a pod that asks for no device goes to the one whose GPUs have the least GPU memory left
    free (1 GiB: below a quarter of the 8 GiB bound), not to one with 4.5 GiB (below the bound), nor
    to one with shares still open, nor to one with whole GPUs free."""
    node = nodefile.load(DEMO_NODE)
    layouts = {
        "whole-free": {},
        "shares-open": {H100_A: 318, H100_B: 100},  # 218 units (54.5 GiB) free
        "nearly-full": {H100_A: 318, H100_B: 300},  # 18 units (4.5 GiB) free
        "almost-full": {H100_A: 318, H100_B: 314},  # 4 units (1 GiB) free
    }
    for suffix, allocated in layouts.items():
        name = f"{namespace}-{suffix}"
        core.create_node(k8skit.gpu_node_object(name, node, allocated=allocated, extra_labels={GROUP: namespace}))
        nodes.append(name)
    terms = steering.cpu_pod_preferences(CONTRACT, 8192)
    for i in range(3):
        pod = k8skit.pod_object(f"cpu-{i}", requests={"cpu": "1"}, nodeSelector={GROUP: namespace})
        pod["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}
        core.create_namespaced_pod(namespace, pod)
        assert k8skit.bound_node(core, namespace, f"cpu-{i}") == f"{namespace}-almost-full"
