"""The requeue rule on its own: which refused pods are recreated, and what the recreation holds.
tests/e2e/test_real_burst.py runs the Requeuer against the real API server and scheduler."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import prometheus_client
import pytest

from gpuslice import config
from gpuslice.webhook import requeue

CONTRACT = config.Config().contract


def refused_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": "6f1c2b7e-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "creationTimestamp": "2026-11-23T19:00:00Z",
            "labels": {"app": "train"},
            "annotations": {"gpu-fraction": "0.6", CONTRACT.decision_annotation: "{}"},
            "managedFields": [{"manager": "kubectl"}],
            **metadata,
        },
        "spec": {
            "nodeName": "gpu-7",
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "main", "image": "train:1", "resources": {"limits": {"gpuslice.io/gpu-memory": "191"}}}
            ],
        },
        "status": {
            "phase": "Failed",
            "reason": "UnexpectedAdmissionError",
            "message": "no single GPU had 191 units",
        },
    }


def test_a_refused_converted_bare_pod_is_requeueable() -> None:
    assert requeue.requeueable(refused_pod(), CONTRACT, max_attempts=5)


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["status"].update(reason="OutOfcpu"),  # refused for something else: not ours to judge
        lambda p: p["status"].update(phase="Running"),
        lambda p: p["metadata"]["annotations"].pop(CONTRACT.decision_annotation),  # not converted by us
        lambda p: p["metadata"].update(ownerReferences=[{"kind": "ReplicaSet", "name": "rs", "controller": True}]),
        lambda p: p["metadata"].update(deletionTimestamp="2026-11-23T19:01:00Z"),
        lambda p: p["metadata"]["annotations"].update({CONTRACT.requeues_annotation: "5"}),  # attempts used up
    ],
    ids=["other-reason", "running", "not-converted", "has-controller", "being-deleted", "attempts-used"],
)
def test_pods_that_are_not_ours_to_recreate_are_left_alone(change: Any) -> None:
    pod = refused_pod()
    change(pod)
    assert not requeue.requeueable(pod, CONTRACT, max_attempts=5)


def test_a_non_controller_owner_does_not_stop_a_requeue() -> None:
    pod = refused_pod(ownerReferences=[{"kind": "ConfigMap", "name": "owner"}])
    assert requeue.requeueable(pod, CONTRACT, max_attempts=5)


def test_the_replacement_keeps_identity_and_spec_and_drops_the_binding_and_server_fields() -> None:
    pod = refused_pod()
    original = copy.deepcopy(pod)
    fresh = requeue.replacement(pod, CONTRACT)
    assert pod == original  # the refused pod is not modified
    assert fresh["metadata"] == {
        "name": "train",
        "namespace": "team-a",
        "labels": {"app": "train"},
        "annotations": {**original["metadata"]["annotations"], CONTRACT.requeues_annotation: "1"},
    }
    assert "nodeName" not in fresh["spec"] and "status" not in fresh
    assert fresh["spec"]["containers"] == original["spec"]["containers"]
    again = requeue.replacement({**fresh, "status": pod["status"]}, CONTRACT)
    assert again["metadata"]["annotations"][CONTRACT.requeues_annotation] == "2"


def test_a_replacement_is_gated_for_the_pacer_only_while_pacing() -> None:
    pod = refused_pod()
    assert "schedulingGates" not in requeue.replacement(pod, CONTRACT)["spec"]
    gated = requeue.replacement(pod, CONTRACT, paced=True)
    assert gated["spec"]["schedulingGates"] == [{"name": CONTRACT.pacing_gate}]
    again = requeue.replacement({**gated, "status": pod["status"]}, CONTRACT, paced=True)
    assert again["spec"]["schedulingGates"] == [{"name": CONTRACT.pacing_gate}]  # never twice


class _Api:
    """Records what the requeuer deletes and creates (kube-apiserver's side is in tests/e2e)."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
        pass

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        self.created.append(body)

    def create_namespaced_event(self, namespace: str, body: Any) -> None:
        pass


@pytest.mark.parametrize("alive", [True, False])
def test_the_requeuer_gates_its_replacement_while_a_pacer_is_alive(alive: bool) -> None:
    settings = config.Config()
    settings = dataclasses.replace(settings, requeue=dataclasses.replace(settings.requeue, backoff_seconds=0.0))
    api = _Api()
    requeuer = requeue.Requeuer(
        api,  # type: ignore[arg-type]
        settings,
        registry=prometheus_client.CollectorRegistry(),
        paced=lambda: alive,
    )
    asyncio.run(requeuer._requeue(refused_pod()))
    (created,) = api.created
    assert ("schedulingGates" in created["spec"]) is alive
