"""Pacing on the real control plane: the chart with `config.pacing.enabled`, our webhook gating the
pods it converts, the pacer (`gpuslice-pacer`, as its own process with the chart's ServiceAccount, so
the chart's RBAC is what it runs with) releasing them, the real kube-scheduler placing them, and
kubelet's real device manager admitting them through our device plugin on two nodes of 2 x H100
(test_real_burst.py's nodes). The burst that makes kubelet refuse pods without pacing (bare pods
created back to back, docs/steering.md "Bursts") must now be admitted whole: every pod on a GPU of
its own, no refusal, nothing requeued. The pacer renews its Lease with the chart's Role, and the
webhook reads it with its own: once the pacer is stopped and its Lease has expired, a new pod goes
ungated, is placed, and its decision says why it was not gated.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import nodeagent
import pytest
from test_real_burst import CONTRACT, GPU_MEMORY, GROUP, NODES, gpu_nodes  # noqa: F401 - gpu_nodes is a fixture

from gpuslice import contract as contract_
from gpuslice.sim import controlplane, kube_replay

pytestmark = [pytest.mark.e2e, pytest.mark.helm]


# Short, so that a test sees the Lease expire soon after the pacer stops (renewed every 2 s).
LEASE_SECONDS = 6


@dataclasses.dataclass
class Pacer:
    port: int
    process: Any


@pytest.fixture
def pacing(release: Any, cluster: controlplane.ControlPlane) -> Iterator[Pacer]:
    """The chart upgraded with pacing on (the webhook restarted on its config.yaml) and the pacer
    running, renewing its Lease, seen alive by the webhook. Restored afterwards."""
    original = json.loads(json.dumps(release.values))
    values = json.loads(json.dumps(original))
    values.setdefault("config", {})["pacing"] = {"enabled": True, "leaseSeconds": LEASE_SECONDS}
    release.upgrade(values)
    directory = cluster.workdir / "pacer"
    directory.mkdir(exist_ok=True)
    (directory / "config.yaml").write_text(release.config_yaml())
    # The Lease's namespace, as the chart's downward API gives it.
    process, port = kube_replay.start_pacer(
        cluster,
        directory / "config.yaml",
        release.kubeconfig_of(f"{release.fullname}-pacer"),
        env={"POD_NAMESPACE": release.namespace},
        log_level="DEBUG",
    )
    try:
        # The webhook gates only once it has read a renewal of the pacer's Lease.
        k8skit.wait_for("the webhook to see the pacer alive", lambda: webhook_sees_pacer(release), timeout=30)
        yield Pacer(port, process)
    finally:
        cluster.stop_process(process)
        release.upgrade(original)


def webhook_sees_pacer(release: Any) -> bool:
    return bool(release.metric("gpuslice_webhook_pacer_alive") == 1)


def pacer_page(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:  # noqa: S310
            return answer.status, answer.read().decode()
    except OSError:
        return 0, ""


def metric(port: int, name: str) -> float:
    status, text = pacer_page(port, "/metrics")
    assert status == 200, text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((f"{name}{{", f"{name} "))
    )


def test_a_paced_burst_of_bare_pods_is_admitted_whole_one_share_per_gpu(
    core: kubernetes.client.CoreV1Api,
    pacing: Pacer,
    gpu_nodes: dict[str, nodeagent.NodeAgent],  # noqa: F811 - the fixture imported above
    namespace: str,
) -> None:
    # Four shares of 0.6 on two nodes of 2 x H100, created back to back: a node's 636 units take three
    # of 191, its GPUs two. Without pacing the scheduler binds a third to a node before its labels move.
    names = [f"paced-{i}" for i in range(2 * NODES)]
    for name in names:
        pod = k8skit.pod_object(
            name, annotations={"gpu-fraction": "0.6"}, limits={"nvidia.com/gpu": 1}, nodeSelector={GROUP: namespace}
        )
        created = core.create_namespaced_pod(namespace, pod)
        # The webhook gated it; whether the pacer has let it go already or not, the decision says so.
        assert CONTRACT.pacing_gate in created.metadata.annotations[CONTRACT.decision_annotation]

    running = k8skit.all_running(core, namespace, names, "every paced pod to run")
    assert not any(p.spec.scheduling_gates for p in running)
    gpus = set()
    for agent in gpu_nodes.values():
        assert not agent.errors, agent.errors
        for decision in agent.decisions.values():
            if decision.admitted and decision.namespace == namespace and not decision.released:
                gpus |= {(agent.node, contract_.parse_unit_device_id(i).gpu_uuid) for i in decision.devices[GPU_MEMORY]}
    assert len(gpus) == len(names)  # one per GPU
    refusals = [d for agent in gpu_nodes.values() for d in agent.refusals() if d.namespace == namespace]
    assert refusals == []
    assert all(CONTRACT.requeues_annotation not in (p.metadata.annotations or {}) for p in running)
    assert metric(pacing.port, "gpuslice_pacer_released_total") >= len(names)
    assert metric(pacing.port, "gpuslice_pacer_release_failures_total") == 0
    assert metric(pacing.port, "gpuslice_pacer_gated_pods") == 0


def test_with_the_pacer_gone_a_new_pod_is_not_gated_and_is_placed(
    core: kubernetes.client.CoreV1Api,
    cluster: controlplane.ControlPlane,
    release: Any,
    pacing: Pacer,
    gpu_nodes: dict[str, nodeagent.NodeAgent],  # noqa: F811 - the fixture imported above
    namespace: str,
) -> None:
    # The pacer created and renews its Lease (the chart names it after the release) with the chart's
    # Role (the webhook read it with its own).
    lease_name = f"{release.fullname}-pacer"
    lease = kubernetes.client.CoordinationV1Api(core.api_client).read_namespaced_lease(lease_name, release.namespace)
    assert lease.spec.lease_duration_seconds == LEASE_SECONDS and lease.spec.holder_identity
    assert lease.spec.renew_time is not None

    cluster.stop_process(pacing.process)
    k8skit.wait_for(
        "the webhook to see the pacer gone", lambda: not webhook_sees_pacer(release), timeout=3 * LEASE_SECONDS
    )
    pod = k8skit.pod_object(
        "unpaced", annotations={"gpu-fraction": "0.6"}, limits={"nvidia.com/gpu": 1}, nodeSelector={GROUP: namespace}
    )
    created = core.create_namespaced_pod(namespace, pod)
    assert not created.spec.scheduling_gates
    decision = json.loads(created.metadata.annotations[CONTRACT.decision_annotation])
    assert "gated" not in decision
    assert decision["notGated"] == (
        f"no pacer alive: Lease {release.namespace}/{lease_name} not renewed within {LEASE_SECONDS} s"
    )

    def running() -> bool:
        return bool(core.read_namespaced_pod("unpaced", namespace).status.phase == "Running")

    k8skit.wait_for("the ungated pod to run", running, timeout=60, interval=0.5)
