"""Gives back the promises of converted pods the scheduler could not place or that were deleted
unbound, says which converted pods were stored, so that the promise of one never stored goes back
too, and promises here the pods other webhook replicas converted (the shared ledger).

Each conversion pinned to a GPU class is promised against that class until the class's labels show
it (webhook/promises.py, kept by webhook/cluster.py), so that the pods of a burst choose their class knowing what the
ones before them took. A pod the scheduler marks unschedulable takes nothing, but its promise
would hold the class's capacity for PROMISE_SECONDS: one pod at a time, the classes then look
fuller than they are and later pods go to worse ones (0.36 points of the default trace, measured
when this was added: docs/benchmarks.md, "How we got here"). This watch sees the mark and releases
the promise.

Pending pods of the whole cluster are watched (field selector status.phase=Pending; the condition
itself cannot be selected on); only those carrying the webhook's decision annotation count. A
converted pod seen for the first time (in the first list, added, or new in a list after the watch
expired) has appeared (`promises.Ledger.appeared`) if this replica converted it; if another replica
did (or a process before this one), it is promised here too while it is unbound and not marked
unschedulable (`promises.Ledger.promise_seen`): the promises every replica holds are those of every
replica. How many converted pods so wait for a placement is the class choice's measure of a backlog
(`ClusterView.unplaced`, read by webhook/classchoice.py). A promise held here is given back when the
pod is marked Unschedulable (each UID once) or deleted unbound, and left to the labels once the pod
is bound, unless kubelet then refuses it (`kubelet_refused`, told by `RefusedPods`, a watch of
Failed pods: a pod leaving the pending watch's selection is shown as it last matched, Pending,
without the refusal). Once the first list is in, the view gives back the promise of a pod of this
replica that does not appear within APPEAR_SECONDS of its admission (refused later in admission).

May import gpuslice.{compact,contract,listwatch}, the webhook's cluster view and pods modules and the kubernetes client.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import kubernetes

from gpuslice import compact, listwatch
from gpuslice import contract as contract_
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import pods

__all__ = ["REFUSAL_WINDOW_SECONDS", "RefusedPods", "WaitingPods", "unschedulable_decision"]

# How long after its binding a pod's refusal still gives its promise back (kubelet refuses within
# seconds; after this the promise has expired or been consumed by the labels anyway).
REFUSAL_WINDOW_SECONDS = 120.0


def unschedulable_decision(pod: Mapping[str, Any], contract: contract_.Contract) -> dict[str, Any] | None:
    """The decision of a converted pod the scheduler found no node for; None for any other pod."""
    metadata = pod.get("metadata") or {}
    text = (metadata.get("annotations") or {}).get(contract.decision_annotation)
    if not text or (pod.get("spec") or {}).get("nodeName"):
        return None
    conditions = (pod.get("status") or {}).get("conditions") or ()
    if not any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in conditions
        if isinstance(c, Mapping)
    ):
        return None
    return _decision(text)


def _decision(text: str) -> dict[str, Any] | None:
    try:
        decision = json.loads(text)
    except ValueError:
        return None
    return decision if isinstance(decision, dict) else None


class WaitingPods(listwatch.PodWatch):
    """`run()` until cancelled or `stop()`; `released` counts the promises given back."""

    def __init__(
        self, api: kubernetes.client.CoreV1Api, cluster: cluster_.ClusterView, **options: Unpack[listwatch.Options]
    ) -> None:
        super().__init__(
            lambda: api, "pending pods", "status.phase=Pending", compact=True, stream_lists=True, **options
        )
        self.cluster = cluster
        cluster.ledger.record_appearance = True  # from now: conversions admitted before the first list count too
        self._held: set[str] = set()  # UIDs of converted pods whose promise this replica holds
        self._seen: set[str] = set()  # UIDs of converted pending pods seen (until the pod goes or binds)
        # UIDs bound while their promise was held here -> when: kubelet may still refuse them
        self._bound: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._listed: set[str] = set()  # UIDs of the list being read (a list after the first)
        self.released = 0
        self.refused = 0  # promises given back because kubelet refused the pod (`kubelet_refused`)

    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Converted pods only (the decision annotation is written at admission and stays), cut down."""
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return (
            compact.pod(obj, self.cluster.contract)
            if self.cluster.contract.decision_annotation in annotations
            else None
        )

    def listed(self, page: Sequence[Mapping[str, Any]]) -> None:
        """A page at a time: 60,000 pending pods are never held at once, and no page keeps the
        event loop (and the admissions waiting on it) for long."""
        if self.lists == 0:
            for pod in page:  # pods converted by this replica, by others, or by a process before
                if str((pod.get("metadata") or {}).get("uid")) not in self._seen:  # once, if the list is retried
                    self._first_sight(pod)
            return
        # A list after an expired watch: what changed meanwhile is applied as it comes; pods gone
        # meanwhile are forgotten once the list is whole (`replace`).
        for pod in page:
            self._listed.add(str((pod.get("metadata") or {}).get("uid")))
            self.apply("MODIFIED", pod)

    def list_started(self) -> None:
        self._listed = set()  # pods of a list that failed part-way do not count as listed

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.listed(items)  # empty when the list came in pages (`listed` took them)
        if self.lists == 0:
            self.cluster.ledger.track_appearance = True
            # The pods held are now those waiting for a placement: the class choice asks how many.
            self.cluster.count_unplaced = lambda: len(self._held)
            return
        self._held &= self._listed
        self._seen &= self._listed
        self._listed = set()

    def _first_sight(self, pod: Mapping[str, Any]) -> None:
        """A converted pod seen pending for the first time: this replica's conversion appeared, or
        another replica's is promised here too (unless it is bound or unschedulable already)."""
        metadata = pod.get("metadata") or {}
        if self.cluster.contract.decision_annotation not in (metadata.get("annotations") or {}):
            return  # only converted pods are remembered
        uid = str(metadata.get("uid"))
        self._seen.add(uid)
        decision = self._decision_of(pod)
        mine = self.cluster.ledger.appeared(decision)
        # the owner's class, whichever replica (or earlier process) converted the pod
        self.cluster.note_owner_class(pods.owner_of(metadata, self.cluster.contract), decision)
        if mine:
            self._held.add(uid)
        elif not (pod.get("spec") or {}).get("nodeName") and unschedulable_decision(pod, self.cluster.contract) is None:
            self.cluster.ledger.promise_seen(decision, pods.cpu_requested(pod.get("spec") or {}))
            self._held.add(uid)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid"))
        if uid not in self._seen and kind != "DELETED":
            self._first_sight(obj)
        if uid not in self._held:
            if kind == "DELETED":
                self._seen.discard(uid)
            return
        if (obj.get("spec") or {}).get("nodeName"):  # bound: its units will show in the labels
            self._held.discard(uid)
            self._remember_bound(uid)
            if kind == "DELETED":
                self._seen.discard(uid)
            return
        if kind == "DELETED":  # deleted before it was bound (or failed unbound): it takes nothing
            self._held.discard(uid)
            self._seen.discard(uid)
            self.cluster.ledger.release_conversion(self._decision_of(obj))
            return
        decision = unschedulable_decision(obj, self.cluster.contract)
        if decision is not None:
            self._held.discard(uid)
            self.cluster.ledger.release_conversion(decision)
            self.released += 1

    def _remember_bound(self, uid: str) -> None:
        now = self.cluster.ledger.clock()
        self._bound[uid] = now
        while self._bound and next(iter(self._bound.values())) < now - REFUSAL_WINDOW_SECONDS:
            self._bound.popitem(last=False)

    def kubelet_refused(self, pod: Mapping[str, Any]) -> None:
        """A Failed pod (`RefusedPods`): if kubelet refused it at admission and it was bound
        while its promise was held here, its units will never show in the labels: give them back
        now, as the simulator's model does, not after PROMISE_SECONDS."""
        uid = str((pod.get("metadata") or {}).get("uid"))
        refused = (pod.get("status") or {}).get("reason") == contract_.KUBELET_REFUSED_REASON
        if not refused or self._bound.pop(uid, None) is None:
            return
        self.cluster.ledger.release_conversion(self._decision_of(pod))
        self.refused += 1

    def _decision_of(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(self.cluster.contract.decision_annotation)
        return _decision(text) if text else None


class RefusedPods(listwatch.PodWatch):
    """The cluster's Failed pods (field selector status.phase=Failed), each handed to
    `WaitingPods.kubelet_refused` when it fails or changes while Failed. Read only: the controller
    recreates the refused ones (controller/requeue.py)."""

    def __init__(self, api: kubernetes.client.CoreV1Api, waiting: WaitingPods, **options: Unpack[listwatch.Options]):
        super().__init__(lambda: api, "failed pods", "status.phase=Failed", compact=True, stream_lists=True, **options)
        self.waiting = waiting

    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Pods kubelet refused (a Failed pod's reason does not change), cut down."""
        refused = (obj.get("status") or {}).get("reason") == contract_.KUBELET_REFUSED_REASON
        return compact.pod(obj, self.waiting.cluster.contract) if refused else None

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        for pod in items:  # a list after an expired watch may show a refusal made meanwhile
            self.waiting.kubelet_refused(pod)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self.waiting.kubelet_refused(obj)
