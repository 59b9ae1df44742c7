"""One GPU class per owner (webhook/classchoice.py): the converted pods of one controller (a
ReplicaSet's replicas, a Job's or StatefulSet's pods) take the class its first pod was given, even
when promises would move the next ones elsewhere; `<prefix>/gpu-class: any` opts out; the class is
learnt from the pending pods another webhook replica converted; a class gone is chosen afresh."""

from __future__ import annotations

import json
from typing import Any

from test_admission import SETTINGS, two_class_view
from test_mutation import container, deployment_pod

from gpuslice.webhook import admission, waiting

CONTRACT = SETTINGS.contract


def review_of(pod: dict[str, Any], uid: str) -> bytes:
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": pod,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def classes_of(view: Any, pods: list[dict[str, Any]]) -> list[int]:
    chosen = []
    for i, pod in enumerate(pods):
        result = admission.review(review_of(pod, f"uid-{i}"), settings=SETTINGS, cluster=view)
        assert result.outcome is not None and result.outcome.decision is not None
        chosen.append(result.outcome.decision["classMemoryMiB"])
    return chosen


def replicas(count: int, annotations: dict[str, str] | None = None, owner: str = "rs-1") -> list[dict[str, Any]]:
    pods = []
    for _ in range(count):
        pod = deployment_pod(annotations or {"gpu-fraction": "0.5"})
        pod["metadata"]["ownerReferences"][0]["uid"] = owner
        pods.append(pod)
    return pods


def test_the_replicas_of_one_owner_all_take_the_class_of_the_first():
    assert len(set(classes_of(two_class_view(), replicas(24)))) == 1


def test_pods_that_opt_out_follow_the_free_capacity_as_before():
    opted = replicas(24, {"gpu-fraction": "0.5", CONTRACT.gpu_class_annotation: "any"})
    assert len(set(classes_of(two_class_view(), opted))) == 2  # promises move them from class to class


def test_owners_choose_apart_and_whole_gpu_pods_keep_their_owners_class_too():
    view = two_class_view()
    first = classes_of(view, replicas(12, owner="rs-a"))
    second = classes_of(view, replicas(12, owner="rs-b"))
    assert len(set(first)) == len(set(second)) == 1
    whole = [deployment_pod(containers=[container(limits={"nvidia.com/gpu": "1"})]) for _ in range(6)]
    for pod in whole:
        pod["metadata"]["ownerReferences"][0]["uid"] = "rs-whole"
    assert len(set(classes_of(view, whole))) == 1


def test_the_class_is_learnt_from_pods_another_replica_converted():
    view = two_class_view()
    (own,) = set(classes_of(two_class_view(), replicas(1)))  # what this view would choose
    other = next(c.memory_mib for c in view.classes() if c.memory_mib != own)
    seen = deployment_pod({"gpu-fraction": "0.5"})
    seen["metadata"]["ownerReferences"][0]["uid"] = "rs-1"
    seen["metadata"]["uid"] = "pod-seen"
    seen["metadata"]["annotations"][CONTRACT.decision_annotation] = json.dumps({"classMemoryMiB": other, "units": 1})
    watch = waiting.WaitingPods(None, view)  # type: ignore[arg-type] - the API is never called here
    watch.replace([])
    watch.lists = 1
    watch.apply("ADDED", seen)
    assert set(classes_of(view, replicas(3))) == {other}


def test_a_class_no_node_has_any_more_is_chosen_afresh():
    view = two_class_view()
    view.note_owner_class("rs-1", {"classMemoryMiB": 12345, "units": 1})
    assert 12345 not in classes_of(view, replicas(2))
