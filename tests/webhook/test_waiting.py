"""Promises of converted pods the scheduler cannot place, or deleted unbound, are given back, and the
pods other webhook replicas converted are promised here too (webhook/waiting.py)."""

from __future__ import annotations

import json
from typing import Any

from test_admission import SETTINGS, two_class_view

from gpuslice import contract as contract_
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
    pods.cluster.ledger.promise_conversion(DECISION)
    pods.cluster.ledger.promise_conversion(DECISION)
    pods.apply("MODIFIED", pod("a"))
    pods.apply("MODIFIED", pod("a"))  # the same mark again
    assert pods.cluster.ledger.promised_units(81559) == 159 and pods.released == 1


def test_own_pods_only_pending_or_bound_and_pods_not_converted_keep_the_promises() -> None:
    pods = watching()
    for _ in range(2):
        pods.cluster.ledger.promise_conversion(DECISION)
    for own in (pod("b", reason=""), pod("c", node="gpu-1"), pod("d", decision=None)):
        pods.apply("MODIFIED", own)
    pods.apply("MODIFIED", pod("c", node="gpu-1", reason="Unschedulable"))  # bound: its units go to the labels
    assert pods.cluster.ledger.promised_units(81559) == 2 * 159 and pods.released == 0
    assert pods.cluster.ledger.promised_from_others == 0


def test_another_replicas_pending_pod_is_promised_here_until_bound_marked_or_deleted() -> None:
    pods = watching()
    view = pods.cluster
    view.ledger.promise_conversion(DECISION)  # this replica's own, seen as "mine"
    pods.apply("ADDED", pod("mine", reason=""))
    for uid in ("bound-later", "unschedulable-later", "deleted-later"):  # converted by another replica
        pods.apply("ADDED", pod(uid, reason=""))
    assert view.ledger.promised_units(81559) == 4 * 159 and view.ledger.promised_from_others == 3
    pods.apply("MODIFIED", pod("bound-later", node="gpu-1", reason=""))  # left to the labels
    assert view.ledger.promised_units(81559) == 4 * 159
    pods.apply("MODIFIED", pod("unschedulable-later"))
    assert view.ledger.promised_units(81559) == 3 * 159 and pods.released == 1
    pods.apply("DELETED", pod("deleted-later", reason=""))
    assert view.ledger.promised_units(81559) == 2 * 159
    pods.apply("DELETED", pod("bound-later", node="gpu-1", reason=""))  # Running now: nothing given back
    assert view.ledger.promised_units(81559) == 2 * 159


def test_another_replicas_pod_already_bound_or_unschedulable_is_not_promised_nor_released() -> None:
    pods = watching()
    view = pods.cluster
    view.ledger.promise_conversion(DECISION)
    pods.apply("ADDED", pod("own", reason=""))  # this replica's
    pods.apply("ADDED", pod("bound", node="gpu-1", reason=""))
    pods.apply("ADDED", pod("waiting"))  # marked before this replica saw it
    pods.apply("MODIFIED", pod("waiting"))
    pods.apply("DELETED", pod("waiting"))
    assert view.ledger.promised_units(81559) == 159 and view.ledger.promised_from_others == 0 and pods.released == 0


def test_the_first_list_promises_the_pending_pods_of_other_replicas() -> None:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type]
    view = pods.cluster
    view.ledger.promise_conversion(DECISION)  # admitted before the first list; stored since
    pods.replace([pod("own", reason=""), pod("other", reason=""), pod("marked"), pod("bound", node="gpu-1")])
    pods.lists = 1
    assert view.ledger.track_appearance and view.ledger.promised_from_others == 1  # "other" only
    assert view.ledger.promised_units(81559) == 2 * 159
    pods.apply("MODIFIED", pod("other"))  # then marked unschedulable: given back here
    pods.apply("MODIFIED", pod("own"))
    assert view.ledger.promised_units(81559) == 0 and pods.released == 2


def test_a_first_list_that_failed_part_way_and_started_again_promises_each_pod_once() -> None:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type]
    view = pods.cluster
    pods.list_started()
    pods.listed([pod("other", reason="")])  # then the list fails, and starts again
    pods.list_started()
    pods.listed([pod("other", reason=""), pod("another", reason="")])
    pods.replace([])
    pods.lists = 1
    assert view.ledger.promised_from_others == 2 and view.ledger.promised_units(81559) == 2 * 159


def test_a_relist_that_failed_part_way_forgets_a_pod_its_retry_does_not_show() -> None:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type]
    view = pods.cluster
    pods.replace([pod("gone", reason=""), pod("kept", reason="")])
    pods.lists = 1
    assert view.ledger.promised_from_others == 2
    pods.list_started()  # a relist after an expired watch
    pods.listed([pod("gone", reason=""), pod("kept", reason="")])  # then it fails, and starts again;
    pods.list_started()  # "gone" is deleted meanwhile (its DELETED event before the new list's version)
    pods.listed([pod("kept", reason="")])
    pods.replace([])
    assert pods._held == {"kept"} and pods._seen == {"kept"}


def test_the_first_list_releases_nothing_for_pods_marked_before_it() -> None:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type]
    pods.cluster.ledger.promise(81559, 159, now=0.0)  # not a conversion of a pod in the list
    pods.replace([pod("old")])
    pods.lists = 1
    pods.apply("MODIFIED", pod("old"))
    assert pods.cluster.ledger.promised_units(81559, now=1.0) == 159


def test_mig_and_unreadable_decisions_release_nothing() -> None:
    pods = watching()
    pods.cluster.ledger.promise(81559, 159, now=0.0)
    pods.apply("MODIFIED", pod("m", decision={**DECISION, "migProfile": "1g.10gb"}))
    pods.apply("MODIFIED", pod("x", decision="not a decision"))
    assert pods.cluster.ledger.promised_units(81559, now=1.0) == 159


# --- conversions whose pod never appears (refused later in admission) -----------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watching_with_clock() -> tuple[waiting.WaitingPods, Clock]:
    pods = watching()
    clock = Clock()
    pods.cluster.ledger.clock = clock
    return pods, clock


def test_a_conversion_whose_pod_is_never_stored_gives_its_promise_back_after_appear_seconds() -> None:
    pods, clock = watching_with_clock()
    view = pods.cluster
    assert view.ledger.track_appearance  # the first list is in: appearances can be told
    view.ledger.promise_conversion(DECISION)  # admitted; a quota then refused the pod
    view.ledger.promise_conversion(DECISION)  # admitted and stored:
    pods.apply("ADDED", pod("stored", reason=""))
    clock.now += cluster.APPEAR_SECONDS - 1
    assert view.ledger.outstanding()[0][81559] == 2 * 159  # both still promised within the window
    clock.now += 2
    assert view.ledger.outstanding()[0][81559] == 159 and view.ledger.not_created == 1  # only the stored pod's is left


def test_a_pod_seen_again_or_after_a_relist_counts_as_appeared_once() -> None:
    pods, clock = watching_with_clock()
    view = pods.cluster
    for _ in range(3):
        view.ledger.promise_conversion(DECISION)
    pods.apply("ADDED", pod("a", reason=""))
    pods.apply("MODIFIED", pod("a", reason=""))  # the same pod again: not a second appearance
    pods.replace([pod("a", reason=""), pod("b", reason="")])  # the watch expired; b appeared meanwhile
    clock.now += cluster.APPEAR_SECONDS + 1
    assert view.ledger.outstanding()[0][81559] == 2 * 159 and view.ledger.not_created == 1


def test_without_the_watch_no_promise_is_given_back_for_not_appearing() -> None:
    view = two_class_view()
    clock = Clock()
    view.ledger.clock = clock
    view.ledger.promise_conversion(DECISION)
    clock.now += cluster.APPEAR_SECONDS * 2
    assert view.ledger.outstanding()[0][81559] == 159 and view.ledger.not_created == 0


def refused(uid: str, *, reason: str = "UnexpectedAdmissionError") -> dict[str, Any]:
    failed = pod(uid, node="gpu-1", reason="")
    failed["status"] = {"phase": "Failed", "reason": reason}
    return failed


def test_a_pod_kubelet_refused_after_binding_gives_its_promise_back_once() -> None:
    pods = watching()
    view = pods.cluster
    for _ in range(2):
        view.ledger.promise_conversion(DECISION)
    pods.apply("ADDED", pod("a", reason=""))
    pods.apply("MODIFIED", pod("a", node="gpu-1", reason=""))  # bound: left to the labels...
    pods.apply("DELETED", pod("a", node="gpu-1", reason=""))  # ...no longer Pending
    watch = waiting.RefusedPods(None, pods)  # type: ignore[arg-type]
    watch.apply("MODIFIED", refused("a"))  # ...but kubelet refused it: its units will never show
    watch.replace([refused("a")])  # seen again (a relist): once only
    watch.apply("DELETED", refused("a"))
    assert view.ledger.promised_units(81559) == 159 and pods.refused == 1


def test_failed_pods_not_refused_at_admission_or_not_held_here_give_nothing_back() -> None:
    pods = watching()
    view = pods.cluster
    view.ledger.promise_conversion(DECISION)
    pods.apply("ADDED", pod("a", reason=""))
    pods.apply("MODIFIED", pod("a", node="gpu-1", reason=""))
    pods.kubelet_refused(refused("a", reason="OOMKilled"))  # ran, then failed: its units were in the labels
    pods.kubelet_refused(refused("never-seen"))  # bound before this replica saw it: it promised nothing
    assert view.ledger.promised_units(81559) == 159 and pods.refused == 0


def test_the_pod_watches_keep_only_the_pods_they_count() -> None:
    view = cluster.ClusterView(CONTRACT, default_gpu_memory_mib=81920)
    pending = waiting.WaitingPods(None, view)  # type: ignore[arg-type]
    plain = {"metadata": {"uid": "u1", "annotations": {"team": "a"}}, "spec": {}, "status": {"phase": "Pending"}}
    assert pending.keep(plain) is None  # not converted: it holds no promise
    converted = {**plain, "metadata": {"uid": "u2", "annotations": {CONTRACT.decision_annotation: "{}", "team": "a"}}}
    assert pending.keep(converted) == {
        "metadata": {"uid": "u2", "annotations": {CONTRACT.decision_annotation: "{}"}},
        "spec": {},
        "status": {"phase": "Pending"},
    }
    refused = waiting.RefusedPods(None, pending)  # type: ignore[arg-type]
    done = {**converted, "status": {"phase": "Failed", "reason": "Completed"}}
    assert refused.keep(done) is None
    assert refused.keep({**done, "status": {"phase": "Failed", "reason": contract_.KUBELET_REFUSED_REASON}}) is not None


def test_a_list_in_pages_is_taken_a_page_at_a_time_and_pruned_once_whole() -> None:
    pods = waiting.WaitingPods(None, two_class_view())  # type: ignore[arg-type]
    view = pods.cluster
    pods.listed([pod("a", reason="")])  # another replica's conversion, on the first page
    assert (
        view.ledger.promised_from_others == 1 and not view.ledger.track_appearance
    )  # counted before the list is whole
    pods.listed([pod("b", reason="")])
    pods.replace([])  # the pages were taken one by one: nothing is left for the whole list
    pods.lists = 1
    assert view.ledger.track_appearance and view.ledger.promised_units(81559) == 2 * 159
    # The watch expired, then a list in pages: "a" went meanwhile (its delete was missed) and is
    # forgotten once the list is whole, so its later events release nothing; "b" is still held.
    pods.listed([pod("b", reason="")])
    pods.replace([])
    pods.apply("DELETED", pod("a", reason=""))
    assert pods.released == 0 and view.ledger.promised_units(81559) == 2 * 159
    pods.apply("MODIFIED", pod("b"))  # marked unschedulable: its promise goes back
    assert pods.released == 1 and view.ledger.promised_units(81559) == 159


def test_the_class_choice_is_told_how_many_converted_pods_wait_for_a_placement() -> None:
    view = two_class_view()
    assert view.unplaced() is None  # no watch: nothing counts them
    pods = waiting.WaitingPods(None, view)  # type: ignore[arg-type] - the API is never called here
    pods.listed([pod("first-page", reason="")])
    assert view.unplaced() is None  # until the first list is whole, neither is the count
    pods.replace([pod("listed", reason="")])
    pods.lists = 1
    view.ledger.promise_conversion(DECISION)
    for uid in ("mine", "other", "bound", "gone"):
        pods.apply("ADDED", pod(uid, reason=""))
    pods.apply("ADDED", pod("not-converted", reason="", decision=None))
    assert view.unplaced() == 6
    pods.apply("MODIFIED", pod("bound", node="gpu-1", reason=""))
    pods.apply("MODIFIED", pod("other"))  # marked unschedulable: the scheduler has tried it
    pods.apply("DELETED", pod("gone", reason=""))
    assert view.unplaced() == 3
