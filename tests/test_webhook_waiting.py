"""Promises of converted pods the scheduler cannot place are given back (webhook/waiting.py)."""

from __future__ import annotations

import json
from typing import Any

from test_webhook_admission import SETTINGS, two_class_view

from gpuslice.webhook import cluster, waiting

CONTRACT = SETTINGS.contract
DECISION = {"annotation": "gpu-fraction", "classMemoryMiB": 81559, "units": 159}


def pod(uid: str, *, reason: str = "Unschedulable", node: str = "", decision: Any = DECISION) -> dict[str, Any]:
    annotations = {CONTRACT.decision_annotation: json.dumps(decision)} if decision is not None else {}
    return {
        "metadata": {"name": uid, "namespace": "team", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": reason}] if reason else [],
        },
    }


def watching() -> waiting.WaitingPods:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type] - the API is never called here
    pods.replace([])
    pods.lists = 1  # the first list is done
    return pods


def test_an_unschedulable_converted_pod_gives_its_units_back_once() -> None:
    pods = watching()
    pods.cluster.promise(81559, 159, now=0.0)
    pods.cluster.promise(81559, 159, now=0.0)
    pods.apply("MODIFIED", pod("a"))
    pods.apply("MODIFIED", pod("a"))  # the same mark again
    assert pods.cluster.promised_units(81559, now=1.0) == 159 and pods.released == 1


def test_pods_that_are_only_pending_bound_or_not_ours_keep_the_promises() -> None:
    pods = watching()
    pods.cluster.promise(81559, 159, now=0.0)
    for other in (pod("b", reason=""), pod("c", node="gpu-1"), pod("d", decision=None), pod("e", reason="Preempting")):
        pods.apply("MODIFIED", other)
    assert pods.cluster.promised_units(81559, now=1.0) == 159 and pods.released == 0


def test_the_first_list_releases_nothing_made_by_an_earlier_process() -> None:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type]
    pods.cluster.promise(81559, 159, now=0.0)
    pods.replace([pod("old")])
    pods.lists = 1
    pods.apply("MODIFIED", pod("old"))
    assert pods.cluster.promised_units(81559, now=1.0) == 159


def test_mig_and_unreadable_decisions_release_nothing() -> None:
    pods = watching()
    pods.cluster.promise(81559, 159, now=0.0)
    pods.apply("MODIFIED", pod("m", decision={**DECISION, "migProfile": "1g.10gb"}))
    pods.apply("MODIFIED", pod("x", decision="not a decision"))
    assert pods.cluster.promised_units(81559, now=1.0) == 159


# --- conversions whose pod never appears (refused later in admission) -----------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watching_with_clock() -> tuple[waiting.WaitingPods, Clock]:
    pods = watching()
    clock = Clock()
    pods.cluster.clock = clock
    return pods, clock


def test_a_conversion_whose_pod_is_never_stored_gives_its_promise_back_after_appear_seconds() -> None:
    pods, clock = watching_with_clock()
    view = pods.cluster
    assert view.track_appearance  # the first list is in: appearances can be told
    view.promise_conversion(DECISION)  # admitted; a quota then refused the pod
    view.promise_conversion(DECISION)  # admitted and stored:
    pods.apply("ADDED", pod("stored", reason=""))
    clock.now += cluster.APPEAR_SECONDS - 1
    assert view.promises()[0][81559] == 2 * 159  # both still promised within the window
    clock.now += 2
    assert view.promises()[0][81559] == 159 and view.not_created == 1  # only the stored pod's is left


def test_a_pod_seen_again_or_after_a_relist_counts_as_appeared_once() -> None:
    pods, clock = watching_with_clock()
    view = pods.cluster
    for _ in range(3):
        view.promise_conversion(DECISION)
    pods.apply("ADDED", pod("a", reason=""))
    pods.apply("MODIFIED", pod("a", reason=""))  # the same pod again: not a second appearance
    pods.replace([pod("a", reason=""), pod("b", reason="")])  # the watch expired; b appeared meanwhile
    clock.now += cluster.APPEAR_SECONDS + 1
    assert view.promises()[0][81559] == 2 * 159 and view.not_created == 1


def test_without_the_watch_no_promise_is_given_back_for_not_appearing() -> None:
    view = two_class_view()
    clock = Clock()
    view.clock = clock
    view.promise_conversion(DECISION)
    clock.now += cluster.APPEAR_SECONDS * 2
    assert view.promises()[0][81559] == 159 and view.not_created == 0
