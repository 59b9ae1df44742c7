"""The real kube-apiserver calls our running webhook through the chart's MutatingWebhookConfiguration
(webhook.externalURL: https://127.0.0.1:<port>, with the chart's own caBundle and certificate): KAI
example pods, pods of a Deployment, a Job and a StatefulSet, a CPU-only pod, kube-system, a bad
annotation, dryRun, reinvocation after a second mutating webhook, and the webhook down.
The CEL matchConditions are evaluated by the API server itself: the webhook's own admission counter
shows which pods it was asked about at all.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import pytest
import yaml

from gpuslice import config as config_
from gpuslice.demo import pods as demo_pods
from gpuslice.node import nodefile
from gpuslice.sim import controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CONTRACT = config_.Config().contract
GPU_MEMORY = CONTRACT.gpu_memory_resource
NVIDIA_GPU = "nvidia.com/gpu"


def _limits(pod: Any, container: int = 0) -> dict[str, str]:
    return dict(pod.spec.containers[container].resources.limits or {})


def _quarter_gpu_template(app: str) -> dict[str, Any]:
    """A pod template asking for a quarter of a GPU the KAI way, labelled app=`app`."""
    return {
        "metadata": {"labels": {"app": app}, "annotations": {"gpu-fraction": "0.25"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.invalid/e2e:1", "resources": {"limits": {NVIDIA_GPU: "1"}}}
            ],
        },
    }


def _kai_pods() -> list[dict[str, Any]]:
    return [k8skit.with_string_quantities(p) for p in yaml.safe_load_all(demo_pods.KAI_EXAMPLE_MANIFEST) if p]


def test_kai_example_pods_are_converted_by_the_webhook_the_api_server_calls(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str, gpu_nodes: list[str]
) -> None:
    for manifest in _kai_pods():
        manifest["metadata"]["namespace"] = namespace
        created = core.create_namespaced_pod(namespace, manifest)
        limits = _limits(created)
        assert NVIDIA_GPU not in limits, created.metadata.name
        assert int(limits[GPU_MEMORY]) > 0
        assert created.spec.scheduler_name == "default-scheduler"  # kai-scheduler rewritten
        assert CONTRACT.decision_annotation in created.metadata.annotations
        required = created.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert required.node_selector_terms  # pinned to a GPU class that exists
    memory = core.read_namespaced_pod("gpu-sharing-memory", namespace)
    assert _limits(memory)[GPU_MEMORY] == "8"  # 2000 MiB rounded up to 256 MiB units
    # The real scheduler places them on our GPU nodes, where kubelet could admit them.
    for name in ("gpu-sharing-fraction", "gpu-sharing-memory", "gpu-pod"):
        assert k8skit.bound_node(core, namespace, name) in gpu_nodes


def test_pods_of_a_deployment_a_job_and_a_statefulset_are_converted(
    release: Any,
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
) -> None:
    template = _quarter_gpu_template("share")
    apps = kubernetes.client.AppsV1Api(admin)
    apps.create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "share"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "share"}}, "template": template},
        },
    )
    stateful = json.loads(json.dumps(template))
    stateful["metadata"]["labels"] = {"app": "stateful"}
    apps.create_namespaced_stateful_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "stateful"},
            "spec": {
                "replicas": 1,
                "serviceName": "stateful",
                "selector": {"matchLabels": {"app": "stateful"}},
                "template": stateful,
            },
        },
    )
    job = json.loads(json.dumps(template))
    job["metadata"]["labels"] = {"app": "job"}
    job["spec"]["restartPolicy"] = "Never"
    kubernetes.client.BatchV1Api(admin).create_namespaced_job(
        namespace, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"}, "spec": {"template": job}}
    )

    def pods() -> list[Any] | None:
        found = core.list_namespaced_pod(namespace).items
        return found if len(found) == 4 else None

    created = k8skit.wait_for("the controllers to create 4 pods", pods, timeout=90)
    owners = sorted(p.metadata.owner_references[0].kind for p in created)
    assert owners == ["Job", "ReplicaSet", "ReplicaSet", "StatefulSet"]
    for pod in created:
        limits = _limits(pod)
        assert NVIDIA_GPU not in limits and int(limits[GPU_MEMORY]) > 0, pod.metadata.name
        assert k8skit.bound_node(core, namespace, pod.metadata.name) in gpu_nodes


def test_the_replicas_of_a_deployment_are_answered_from_memory_with_the_first_ones_answer(
    release: Any,
    admin: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    gpu_nodes: list[str],
) -> None:
    # What kube-apiserver sends for a ReplicaSet's pods is the same but for the request uid (the
    # generated name comes after admission): webhook/repeats.py answers the repeats from memory.
    before = release.metric("gpuslice_webhook_repeat_answers_total")
    replicas = 12
    template = _quarter_gpu_template("many")
    kubernetes.client.AppsV1Api(admin).create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "many"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "many"}}, "template": template},
        },
    )

    def pods() -> list[Any] | None:
        found = core.list_namespaced_pod(namespace, label_selector="app=many").items
        return found if len(found) == replicas else None

    created = k8skit.wait_for(f"the ReplicaSet to create {replicas} pods", pods, timeout=90)
    repeats = release.metric("gpuslice_webhook_repeat_answers_total") - before
    print(f"{repeats:.0f} of {replicas} replicas answered from memory")
    assert repeats >= 1
    # From memory or not, every replica got the same conversion.
    conversions = {
        (json.dumps(_limits(p), sort_keys=True), p.metadata.annotations[CONTRACT.decision_annotation]) for p in created
    }
    assert len(conversions) == 1, conversions


def test_a_pod_without_a_gpu_gets_only_a_preference_and_one_that_opts_out_is_not_sent(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    before = release.admissions()
    plain = core.create_namespaced_pod(namespace, k8skit.pod_object("plain", requests={"cpu": "1"}))
    preferred = plain.spec.affinity.node_affinity.preferred_during_scheduling_ignored_during_execution
    assert preferred and not plain.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    assert release.admissions() == before + 1

    opted_out = core.create_namespaced_pod(
        namespace,
        k8skit.pod_object("opted-out", requests={"cpu": "1"}, labels={CONTRACT.label_pod_cpu_steering: "off"}),
    )
    assert opted_out.spec.affinity is None
    # A DaemonSet's pod asking for no GPU matches neither entry.
    daemon = k8skit.pod_object("daemon-pod", requests={"cpu": "1"})
    daemon["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "0b7e6c6e-0000-4000-8000-000000000001"}
    ]
    assert core.create_namespaced_pod(namespace, daemon).spec.affinity is None
    assert release.admissions() == before + 1, "the API server's matchConditions should have sent none of these"

    # A plain whole-GPU pod is sent and converted (convertWholeGpus, on by default).
    whole = core.create_namespaced_pod(namespace, k8skit.pod_object("whole-gpu", limits={NVIDIA_GPU: 1}))
    assert NVIDIA_GPU not in _limits(whole) and int(_limits(whole)[GPU_MEMORY]) > 0
    assert release.admissions() == before + 2


def test_the_webhook_is_never_asked_about_pods_in_kube_system(release: Any, core: kubernetes.client.CoreV1Api) -> None:
    before = release.admissions()
    pod = k8skit.pod_object("annotated", annotations={"gpu-fraction": "0.5"}, limits={NVIDIA_GPU: 1})
    pod["metadata"]["generateName"] = pod["metadata"].pop("name") + "-"
    created = core.create_namespaced_pod("kube-system", pod)
    assert _limits(created) == {NVIDIA_GPU: "1"}
    assert release.admissions() == before


def test_a_bad_annotation_is_refused_with_our_message_in_the_api_error(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    pod = k8skit.pod_object("bad", annotations={"gpu-fraction": "1.5"}, limits={NVIDIA_GPU: 1})
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod(namespace, pod)
    message = k8skit.api_error_message(refused.value)
    assert f'admission webhook "pods.{CONTRACT.prefix}" denied the request' in message
    assert "annotation gpu-fraction='1.5' is above 1 (one whole GPU)" in message
    assert not core.list_namespaced_pod(namespace).items


def test_a_dry_run_shows_the_conversion_and_stores_nothing(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    pod = k8skit.pod_object("dry", annotations={"gpu-memory": "4Gi"}, limits={NVIDIA_GPU: 1})
    shown = core.create_namespaced_pod(namespace, pod, dry_run="All")
    assert _limits(shown)[GPU_MEMORY] == "16"
    assert not core.list_namespaced_pod(namespace).items


class _SidecarAdder(http.server.BaseHTTPRequestHandler):
    """A second mutating webhook (another vendor's): it adds a sidecar container to every pod."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        pod = review["request"]["object"]
        patch = []
        if not any(c["name"] == "sidecar" for c in pod["spec"]["containers"]):
            patch = [
                {
                    "op": "add",
                    "path": "/spec/containers/0",
                    "value": {"name": "sidecar", "image": "registry.invalid/sidecar:1"},
                }
            ]
        response = {"uid": review["request"]["uid"], "allowed": True}
        if patch:
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sidecar_webhook(
    cluster: controlplane.ControlPlane, admin: kubernetes.client.ApiClient, namespace: str
) -> Iterator[None]:
    cert, key = cluster.pki.issue("sidecar-webhook")
    directory = cluster.workdir / "sidecar-webhook"
    directory.mkdir(exist_ok=True)
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SidecarAdder)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="sidecar-webhook", daemon=True)
    thread.start()
    api = kubernetes.client.AdmissionregistrationV1Api(admin)
    name = "zz-e2e-sidecar"  # ordered after ours: the API server calls configurations by name
    api.create_mutating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "sidecar.e2e.example.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{server.server_address[1]}/mutate",
                        "caBundle": base64.b64encode(cluster.pki.ca_pem).decode(),
                    },
                    "rules": [
                        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                }
            ],
        }
    )
    try:
        yield
    finally:
        api.delete_mutating_webhook_configuration(name)
        server.shutdown()
        thread.join()


@pytest.mark.usefixtures("sidecar_webhook")
def test_a_later_webhook_adding_a_sidecar_reinvokes_ours_and_the_share_stays_on_the_gpu_container(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    before = release.admissions()
    pod = k8skit.pod_object("with-sidecar", annotations={"gpu-memory": "2000"}, limits={NVIDIA_GPU: 1})
    created = core.create_namespaced_pod(namespace, pod)
    assert [c.name for c in created.spec.containers] == ["sidecar", "main"]
    assert _limits(created, 1)[GPU_MEMORY] == "8"
    assert GPU_MEMORY not in _limits(created, 0)
    assert release.admissions() == before + 2  # called, then called again after the sidecar was added


def test_with_the_webhook_down_gpu_pods_are_refused_and_other_pods_still_created(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    release.stop_webhook()
    try:
        pod = k8skit.pod_object("while-down", annotations={"gpu-fraction": "0.5"}, limits={NVIDIA_GPU: 1})
        with pytest.raises(kubernetes.client.ApiException) as refused:
            core.create_namespaced_pod(namespace, pod)
        message = k8skit.api_error_message(refused.value)
        assert f'failed calling webhook "pods.{CONTRACT.prefix}"' in message
        # The CPU-pod entry fails open: the pod is created as written.
        plain = core.create_namespaced_pod(namespace, k8skit.pod_object("plain-while-down", requests={"cpu": "1"}))
        assert plain.spec.affinity is None
    finally:
        release.start_webhook()
    created = core.create_namespaced_pod(
        namespace, k8skit.pod_object("after-restart", annotations={"gpu-fraction": "0.5"}, limits={NVIDIA_GPU: 1})
    )
    assert GPU_MEMORY in _limits(created)


def test_a_namespace_quota_on_gpu_memory_counts_converted_units_and_refuses_the_pod_over_it(
    release: Any, core: kubernetes.client.CoreV1Api, namespace: str, gpu_nodes: list[str]
) -> None:
    """docs/quotas.md: mutating admission runs before the API server's quota admission, so a team's
    ResourceQuota on requests.<prefix>/gpu-memory caps the converted shares."""
    core.create_namespaced_resource_quota(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu"},
            "spec": {"hard": {f"requests.{GPU_MEMORY}": "20"}},
        },
    )
    # The resourcequota controller fills in the quota's status; until then admission refuses pods.
    k8skit.wait_for(
        "the quota controller to count the namespace",
        lambda: (core.read_namespaced_resource_quota("gpu", namespace).status.hard or {}).get(f"requests.{GPU_MEMORY}"),
        timeout=60,
    )
    for name in ("first", "second"):
        pod = core.create_namespaced_pod(
            namespace, k8skit.pod_object(name, annotations={"gpu-memory": "2000"}, limits={NVIDIA_GPU: 1})
        )
        assert _limits(pod)[GPU_MEMORY] == "8"
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod(
            namespace, k8skit.pod_object("third", annotations={"gpu-memory": "2000"}, limits={NVIDIA_GPU: 1})
        )
    message = k8skit.api_error_message(refused.value)
    assert "exceeded quota: gpu" in message
    assert (
        f"requested: requests.{GPU_MEMORY}=8, used: requests.{GPU_MEMORY}=16, limited: requests.{GPU_MEMORY}=20"
        in message
    )


@pytest.fixture
def priority_classes(admin: kubernetes.client.ApiClient, namespace: str) -> Iterator[tuple[str, str]]:
    api = kubernetes.client.SchedulingV1Api(admin)
    names = (f"{namespace}-low", f"{namespace}-high")
    for name, value in zip(names, (100, 100000), strict=True):
        api.create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}
        )
    yield names
    for name in names:
        api.delete_priority_class(name)


def test_a_higher_priority_share_preempts_a_lower_one_for_converted_units(
    release: Any, core: kubernetes.client.CoreV1Api, nodes: list[str], namespace: str, priority_classes: tuple[str, str]
) -> None:
    low, high = priority_classes
    group = {"e2e.gpuslice.io/group": namespace}
    name = f"{namespace}-gpu"
    core.create_node(
        k8skit.gpu_node_object(name, nodefile.load(k8skit.EXAMPLES / "demo-node.yaml"), extra_labels=group)
    )
    nodes.append(name)

    def share(pod_name: str, fraction: str, priority: str) -> dict[str, Any]:
        # No kubelet acknowledges a graceful deletion here: victims go at once.
        return k8skit.pod_object(
            pod_name,
            annotations={"gpu-fraction": fraction},
            limits={NVIDIA_GPU: 1},
            nodeSelector=group,
            priorityClassName=priority,
            terminationGracePeriodSeconds=0,
        )

    for i in range(2):  # two whole H100s' worth of units: the node is full
        core.create_namespaced_pod(namespace, share(f"low-{i}", "1", low))
        assert k8skit.bound_node(core, namespace, f"low-{i}") == name
    core.create_namespaced_pod(namespace, share("urgent", "0.5", high))
    assert k8skit.bound_node(core, namespace, "urgent", timeout=90) == name
    survivors = {
        p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.metadata.deletion_timestamp is None
    }
    assert survivors in ({"low-0", "urgent"}, {"low-1", "urgent"})
