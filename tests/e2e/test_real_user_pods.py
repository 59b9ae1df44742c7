"""Pods written for other GPU systems, through the real kube-apiserver, the chart's
MutatingWebhookConfiguration (its CEL matchConditions evaluated by the API server) and our webhook,
then the real scheduler: NVIDIA's mixed-strategy MIG resources and HAMi's shares are converted and
bound to a GPU node; what gpuslice cannot honour is refused with its advice in the API error; a pod
that names KAI's scheduler, GPU or not, leaves with a scheduler that exists; a conversion the API
server then refuses (a ResourceQuota) gives its promise back (the webhook's metric says so); and
the replicas of one Deployment keep one GPU class on a cluster of two.
"""

from __future__ import annotations

import json
import time
from typing import Any

import k8skit
import kubernetes
import pytest

from gpuslice import config as config_
from gpuslice.node import nodefile
from gpuslice.sim import controlplane
from gpuslice.webhook import cluster

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CONTRACT = config_.Config().contract


def pod(name: str, limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/e2e:1"}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container], **spec}}


def test_nvidia_mig_and_hami_pods_are_converted_and_bound_to_a_gpu_node(
    release: Any,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
) -> None:
    mig = core.create_namespaced_pod(namespace, pod("nvidia-mig", {"nvidia.com/mig-1g.10gb": "1"}))
    assert mig.spec.containers[0].resources.limits == {CONTRACT.mig_resource("1g.10gb"): "1"}
    hami = core.create_namespaced_pod(namespace, pod("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}))
    assert hami.spec.containers[0].resources.limits == {CONTRACT.gpu_memory_resource: "12"}
    share = core.create_namespaced_pod(
        namespace, pod("hami-share", {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"})
    )
    assert CONTRACT.gpu_memory_resource in share.spec.containers[0].resources.limits
    for name in ("nvidia-mig", "hami", "hami-share"):
        assert k8skit.bound_node(core, namespace, name) in gpu_nodes


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}, "does not cap"),
        ({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"}, "keeps a share on one GPU"),
        ({"nvidia.com/mig-7g.80gb": "1"}, "no node of the cluster offers MIG profile"),
    ],
    ids=["hami-gpucores", "hami-several-gpus", "unknown-mig-profile"],
)
def test_what_gpuslice_cannot_honour_is_refused_with_the_advice_in_the_api_error(
    release: Any,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
    limits,
    said,
) -> None:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod(namespace, pod("refused", limits))
    assert refused.value.status == 400
    assert said in k8skit.api_error_message(refused.value)


def test_a_cpu_pod_naming_kais_scheduler_is_given_one_that_exists_and_is_bound(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str, nodes: list[str]
) -> None:
    core.create_node(k8skit.node_object(f"{namespace}-cpu"))
    nodes.append(f"{namespace}-cpu")
    created = core.create_namespaced_pod(
        namespace, pod("quickstart", {"cpu": "100m", "memory": "64Mi"}, schedulerName="kai-scheduler")
    )
    assert created.spec.scheduler_name == "default-scheduler"
    assert k8skit.bound_node(core, namespace, "quickstart")


def _not_created(release: Any) -> float:
    assert release.webhook is not None
    cafile = str(release.plane.workdir / f"webhook-{release.name}" / "ca.crt")
    status, body = controlplane._https_get(release.webhook.url + "/metrics", cafile)
    assert status == 200
    prefix = 'gpuslice_webhook_promises_returned_total{reason="not-created"} '
    lines = [line for line in body.decode().splitlines() if line.startswith(prefix)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_a_conversion_a_resourcequota_then_refuses_gives_its_promise_back(
    release: Any,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
) -> None:
    core.create_namespaced_resource_quota(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu"},
            "spec": {"hard": {f"requests.{CONTRACT.gpu_memory_resource}": "4"}},
        },
    )
    k8skit.wait_for(
        "the quota's status",
        lambda: core.read_namespaced_resource_quota("gpu", namespace).status.hard or None,
        30,
    )
    before = _not_created(release)
    over = pod("over-quota")
    over["metadata"]["annotations"] = {"gpu-memory": "2000"}  # 8 units; the quota, checked after us, allows 4
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod(namespace, over)
    assert refused.value.status == 403 and "exceeded quota" in k8skit.api_error_message(refused.value)
    deadline = time.monotonic() + cluster.APPEAR_SECONDS + 30
    while _not_created(release) < before + 1:
        assert time.monotonic() < deadline, "the promise of the refused pod was not given back"
        time.sleep(1)


def test_the_replicas_of_a_deployment_share_one_gpu_class_on_a_mixed_cluster(
    release: Any,
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    nodes: list[str],
) -> None:
    """8 replicas of a half-GPU Deployment on H100 and H200 nodes: promises would move every other
    replica to the other class (40 GiB here, 70 GiB there); one class per owner keeps them alike."""
    for name, file in ((f"{namespace}-h100", "demo-node.yaml"), (f"{namespace}-h200", "h200x8-node.yaml")):
        core.create_node(k8skit.gpu_node_object(name, nodefile.load(k8skit.EXAMPLES / file)))
        nodes.append(name)
    template = {
        "metadata": {"labels": {"app": "share"}, "annotations": {"gpu-fraction": "0.5"}},
        "spec": pod("x")["spec"],
    }
    kubernetes.client.AppsV1Api(admin).create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "share"},
            "spec": {"replicas": 8, "selector": {"matchLabels": {"app": "share"}}, "template": template},
        },
    )
    created = k8skit.wait_for(
        "8 replicas", lambda: (lambda p: p if len(p) == 8 else None)(core.list_namespaced_pod(namespace).items), 60
    )
    classes = {json.loads(p.metadata.annotations[CONTRACT.decision_annotation])["classMemoryMiB"] for p in created}
    assert len(classes) == 1, classes
    bound = {k8skit.bound_node(core, namespace, p.metadata.name) for p in created}
    expected = f"{namespace}-h100" if classes == {81559} else f"{namespace}-h200"
    assert bound == {expected}
