"""Gives back the promises of converted pods the scheduler could not place, and says which
converted pods were stored, so that the promise of one never stored goes back too.

Each conversion pinned to a GPU class is promised against that class until the class's labels show
it (webhook/cluster.py, promises), so that the pods of a burst choose their class knowing what the
ones before them took. A pod the scheduler marks unschedulable takes nothing, but its promise
would hold the class's capacity for PROMISE_SECONDS: one pod at a time, the classes then look
fuller than they are and later pods go to worse ones (0.36 points of the default trace, measured
when this was added: docs/benchmarks.md, "How we got here"). This watch sees the mark and releases
the promise.

Pending pods of the whole cluster are watched (field selector status.phase=Pending; the condition
itself cannot be selected on); only those carrying the webhook's decision annotation, not bound,
with PodScheduled False for reason Unschedulable count, each UID once. A converted pod seen for
the first time (added, or new in a list after the watch expired) has appeared
(`ClusterView.appeared`); once the first list is in, the view gives back the promise of a pod
that does not appear within APPEAR_SECONDS of its admission (refused later in admission).

May import gpuslice.{contract,listwatch}, the webhook's cluster view and pods modules and the kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import kubernetes

from gpuslice import contract as contract_
from gpuslice import listwatch
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import pods

__all__ = ["WaitingPods", "unschedulable_decision"]


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
        super().__init__(lambda: api, "pending pods", "status.phase=Pending", **options)
        self.cluster = cluster
        self._done: set[str] = set()  # UIDs whose promise was given back (until the pod goes)
        self._seen: set[str] = set()  # UIDs of converted pending pods seen (until the pod goes or binds)
        self.released = 0

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        listed = {str((p.get("metadata") or {}).get("uid")) for p in items}
        if self.lists == 0:
            # The first list: promises of pods waiting already were made by a process that is gone.
            self._done = listed
            key = self.cluster.contract.decision_annotation
            self._seen = {
                str((p.get("metadata") or {}).get("uid"))
                for p in items
                if key in ((p.get("metadata") or {}).get("annotations") or {})
            }
            self.cluster.track_appearance = True
            return
        self._done &= listed  # a list after an expired watch: pods gone meanwhile are forgotten
        self._seen &= listed
        for pod in items:
            self.apply("MODIFIED", pod)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid"))
        if uid not in self._seen and kind != "DELETED":
            metadata = obj.get("metadata") or {}
            text = (metadata.get("annotations") or {}).get(self.cluster.contract.decision_annotation)
            if text:  # a converted pod: only those are remembered
                self._seen.add(uid)
                decision = _decision(text)
                self.cluster.appeared(decision)
                # another replica's conversion, or one made before this process started
                self.cluster.note_owner_class(pods.owner_of(metadata, self.cluster.contract), decision)
        if kind == "DELETED":  # gone, or no longer Pending (the field selector's view)
            self._done.discard(uid)
            self._seen.discard(uid)
            return
        if (obj.get("spec") or {}).get("nodeName"):
            self._done.discard(uid)
            return
        if uid in self._done:
            return
        decision = unschedulable_decision(obj, self.cluster.contract)
        if decision is not None:
            self._done.add(uid)
            self.cluster.release_conversion(decision)
            self.released += 1
