"""Which nodes' labels lag the pods bound to them. Pure: fed node and pod objects, no I/O.

A node lags while one of its free-count labels says more than kubelet can still give: for each of
our extended resources, the label (`gpu.free-units`, `mig.<profile>.free`) is above the node's
allocatable minus what the pods bound to it request. That is exactly the moment between a binding
and the labeller's write that shows it, when the scheduler can place another share by labels that
no longer hold. The rule needs no memory of what was released: a pod bound by anyone counts, a
pod that ends or is refused stops counting (kubelet's release then only makes the labels lower,
never higher, than the rule allows), and events of the two watches may come in either order.

While a node lags, the pods bound to it since it last did not (`unlabelled`) are the ones its
labels do not count yet: the pacer counts them as landing there, beside the pods it released.

May import gpuslice.{contract,labelcodec,podrequests} only.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice import labelcodec, podrequests, quantity

__all__ = ["Ledger", "pod_demand"]

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def _count(value: Any) -> int | None:
    """An extended resource's quantity as a whole number (they have no units); None when it is not
    one. Any form of the grammar: the API server writes a count of 2,000 as "2k"."""
    try:
        amount = quantity.parse(value)
    except quantity.QuantityError:
        return None
    whole = amount == amount.to_integral_value() and 0 <= amount < 10**12
    return int(amount) if whole else None


def _free_label(labels: Mapping[str, Any], key: str) -> int | None:
    """A free-count label's count; None when the node has none, or one not believed."""
    try:
        return labelcodec.read_count(labels, key)
    except labelcodec.Malformed:
        return None


def pod_demand(spec: Mapping[str, Any], contract: contract_.Contract) -> dict[str, int]:
    """What a pod holds of our resources once admitted, per resource, added up as the scheduler
    adds them (gpuslice.podrequests: containers and sidecars together, other init containers alone)."""

    def of(container: Mapping[str, Any]) -> dict[str, int]:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        counts = {}
        for name, value in wanted.items():
            if contract.is_gpuslice_resource(name) and (count := _count(value)):
                counts[name] = count
        return counts

    return {name: count for name, count in podrequests.container_total(spec, of).items() if count}


@dataclasses.dataclass
class _Node:
    allocatable: dict[str, int] = dataclasses.field(default_factory=dict)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    free_labels: dict[str, int] = dataclasses.field(default_factory=dict)  # resource -> the label's count
    bound: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    # uid -> demand of the pods bound since the node last caught up: what its labels may not count yet
    unlabelled: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)


class Ledger:
    """Nodes' labels and allocatable, the demand of the pods bound to each, and the nodes that lag
    (`lagging`: name -> since when, by `clock`), kept current on every update."""

    def __init__(self, contract: contract_.Contract, clock: Callable[[], float] = time.monotonic) -> None:
        self.contract = contract
        self.clock = clock
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[str, tuple[str, dict[str, int]]] = {}  # uid -> (node, demand) of bound pods counted
        self.lagging: dict[str, float] = {}

    def names(self) -> list[str]:
        """The nodes known."""
        return list(self._nodes)

    def labels(self, name: str) -> Mapping[str, str]:
        record = self._nodes.get(name)
        return record.labels if record is not None else {}

    def allocatable(self, name: str) -> Mapping[str, int]:
        record = self._nodes.get(name)
        return record.allocatable if record is not None else {}

    def unlabelled(self, name: str) -> list[dict[str, int]]:
        """The demand of each pod bound to the node that its labels may not count yet (empty unless it lags)."""
        record = self._nodes.get(name)
        return list(record.unlabelled.values()) if record is not None else []

    # --- nodes ---------------------------------------------------------------------------------
    def update_node(self, node: Mapping[str, Any]) -> None:
        metadata = node.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name:
            return
        record = self._nodes.setdefault(name, _Node())
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        record.allocatable = {
            r: count
            for r, v in allocatable.items()
            if self.contract.is_gpuslice_resource(r) and (count := _count(v)) is not None
        }
        labels = metadata.get("labels") or {}
        record.labels = labels
        record.free_labels = {}
        for resource in record.allocatable:
            key = self.contract.free_label_of_resource(resource)
            count = _free_label(labels, key) if key else None
            if count is not None:
                record.free_labels[resource] = count
        self._judge(name)

    def remove_node(self, name: str) -> None:
        self._nodes.pop(name, None)
        self.lagging.pop(name, None)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for node in nodes:
            self.update_node(node)
            seen.add(str((node.get("metadata") or {}).get("name") or ""))
        for name in set(self._nodes) - seen:
            bound = self._nodes[name].bound
            if bound:  # pods still bound to a node we have not seen yet: keep their demand
                self._nodes[name] = _Node(bound=bound)
                self.lagging.pop(name, None)
            else:
                self.remove_node(name)

    # --- pods ----------------------------------------------------------------------------------
    def update_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod as the watch shows it: counted while bound and not finished."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        spec = pod.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in _TERMINAL_PHASES:
            self.forget_pod(uid)
            return
        if uid in self._pods:
            return  # a bound pod's node and requests do not change
        demand = pod_demand(spec, self.contract)
        if not demand:
            return
        self._pods[uid] = (node, demand)
        record = self._nodes.setdefault(node, _Node())
        record.bound.update(demand)
        record.unlabelled[uid] = demand
        self._judge(node)

    def forget_pod(self, uid: str) -> None:
        """The pod is gone (deleted, finished, refused, or no longer in the watch's selection)."""
        entry = self._pods.pop(uid, None)
        if entry is None:
            return
        node, demand = entry
        record = self._nodes.get(node)
        if record is not None:
            record.bound.subtract(demand)
            record.unlabelled.pop(uid, None)
            self._judge(node)

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        listed = {}
        for pod in pods:
            listed[str((pod.get("metadata") or {}).get("uid") or "")] = pod
        self.keep_only(set(listed))
        for pod in listed.values():
            self.update_pod(pod)

    def keep_only(self, uids: set[str]) -> None:
        """Forget every pod but those of `uids` (a list is whole: the others went meanwhile)."""
        for uid in set(self._pods) - uids:
            self.forget_pod(uid)

    # --- the rule ------------------------------------------------------------------------------
    def _judge(self, name: str) -> None:
        record = self._nodes.get(name)
        if record is not None and any(
            free > record.allocatable[r] - record.bound[r] for r, free in record.free_labels.items()
        ):
            self.lagging.setdefault(name, self.clock())
        else:
            self.lagging.pop(name, None)
            if record is not None:
                record.unlabelled.clear()  # the labels count every pod bound to it
