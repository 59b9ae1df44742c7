"""Pacing on the real control plane: the chart with `config.pacing.enabled`, our webhook gating the
pods it converts, the controller (`gpuslice-controller`, as its own processes with the chart's
ServiceAccount, so the chart's RBAC is what they run with) electing a leader that releases them,
the real kube-scheduler placing them, and kubelet's real device manager admitting them through our
device plugin on two nodes of 2 x H100 (test_real_burst.py's nodes). The burst that makes kubelet
refuse pods without pacing (bare pods created back to back, docs/steering.md "Bursts") must now be
admitted whole: every pod on a GPU of its own, no refusal, nothing requeued. The leader renews the
Lease with the chart's Role, and the webhook reads it with its own: a second replica stands by and
takes over when the leader stops, and once every replica is stopped, a new pod goes ungated, is
placed, and its decision says why it was not gated.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import k8skit
import kubernetes
import nodeagent
import pytest
from test_real_burst import (  # noqa: F401 - device_plugins and gpu_nodes are fixtures
    CONTRACT,
    GROUP,
    NODES,
    device_plugins,
    gpu_nodes,
    gpus_held,
)

from gpuslice.sim import controlplane

pytestmark = [pytest.mark.e2e, pytest.mark.helm]


# Short, so that a test sees the Lease expire soon after the controller stops (renewed every 2 s).
LEASE_SECONDS = 6


@dataclasses.dataclass
class Pacing:
    leader: Any  # conftest.Controller
    standby: Any


@pytest.fixture
def pacing(release: Any, cluster: controlplane.ControlPlane) -> Iterator[Pacing]:
    """The chart upgraded with pacing on (the webhook and a controller restarted on its config.yaml),
    a second controller replica standing by, the leader seen alive by the webhook. Restored afterwards."""
    original = json.loads(json.dumps(release.values))
    values = json.loads(json.dumps(original))
    values.setdefault("config", {})["pacing"] = {"enabled": True}
    values["config"]["controller"] = {"leaseSeconds": LEASE_SECONDS}
    release.upgrade(values)
    try:
        (leader,) = release.controllers
        k8skit.wait_for("a controller to lead", lambda: leader.leading, timeout=30)
        standby = release.start_controller("controller-1")
        # The webhook gates only once it has read a renewal of the leader's Lease.
        k8skit.wait_for("the webhook to see the pacer alive", lambda: webhook_sees_pacer(release), timeout=30)
        assert not standby.leading
        yield Pacing(leader, standby)
    finally:
        release.upgrade(original)


def webhook_sees_pacer(release: Any) -> bool:
    return bool(release.metric("gpuslice_webhook_pacer_alive") == 1)


def test_a_paced_burst_of_bare_pods_is_admitted_whole_one_share_per_gpu(
    core: kubernetes.client.CoreV1Api,
    pacing: Pacing,
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
    assert len(gpus_held(gpu_nodes, namespace)) == len(names)  # one per GPU
    refusals = [d for agent in gpu_nodes.values() for d in agent.refusals() if d.namespace == namespace]
    assert refusals == []
    assert all(CONTRACT.requeues_annotation not in (p.metadata.annotations or {}) for p in running)
    assert pacing.leader.metric("gpuslice_pacer_released_total") >= len(names)
    assert pacing.leader.metric("gpuslice_pacer_release_failures_total") == 0
    assert pacing.leader.metric("gpuslice_pacer_gated_pods") == 0
    assert pacing.standby.metric("gpuslice_pacer_released_total") == 0  # standing by: it released nothing


def test_the_standby_takes_over_when_the_leader_stops_and_with_none_left_a_new_pod_is_not_gated(
    core: kubernetes.client.CoreV1Api,
    cluster: controlplane.ControlPlane,
    release: Any,
    pacing: Pacing,
    gpu_nodes: dict[str, nodeagent.NodeAgent],  # noqa: F811 - the fixture imported above
    namespace: str,
) -> None:
    # The leader created and renews the Lease (the chart names it after the release) with the chart's
    # Role (the webhook reads it with its own).
    lease_name = f"{release.fullname}-controller"
    leases = kubernetes.client.CoordinationV1Api(core.api_client)
    lease = leases.read_namespaced_lease(lease_name, release.namespace)
    assert lease.spec.lease_duration_seconds == LEASE_SECONDS and lease.spec.holder_identity == pacing.leader.identity
    assert lease.spec.renew_time is not None

    # The leader stops cleanly: it gives the Lease up, and the standby takes it at its next look
    # (every third of the duration), long before the duration would have run out.
    release.stop_controller(pacing.leader)
    k8skit.wait_for("the standby to lead", lambda: pacing.standby.leading, timeout=LEASE_SECONDS)
    lease = leases.read_namespaced_lease(lease_name, release.namespace)
    assert lease.spec.holder_identity == pacing.standby.identity and lease.spec.lease_transitions >= 1
    # Between the give-up and the webhook's next read of the new renewal, new pods go ungated (a
    # Lease with no holder is no pacer); then they are gated again, for the new leader.
    k8skit.wait_for("the webhook to see the new leader", lambda: webhook_sees_pacer(release), timeout=LEASE_SECONDS)
    taken_over = k8skit.pod_object(
        "taken-over", annotations={"gpu-fraction": "0.6"}, limits={"nvidia.com/gpu": 1}, nodeSelector={GROUP: namespace}
    )
    created = core.create_namespaced_pod(namespace, taken_over)
    assert created.spec.scheduling_gates  # the webhook still gates: a leader paces
    k8skit.all_running(core, namespace, ["taken-over"], "the new leader to release the pod")
    assert pacing.standby.metric("gpuslice_pacer_released_total") >= 1

    release.stop_controller(pacing.standby)
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
    assert decision["notGated"].startswith(f"no pacer alive: Lease {release.namespace}/{lease_name}")

    def running() -> bool:
        return bool(core.read_namespaced_pod("unpaced", namespace).status.phase == "Running")

    k8skit.wait_for("the ungated pod to run", running, timeout=60, interval=0.5)
