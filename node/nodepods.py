"""The pods bound to one node, kept current by a list + watch that asks only for them (field
selector `spec.nodeName=<node>`), for the labeller's CPU and memory headroom.

Listing the node's pods on every refresh (every poll and every Allocate) cost the API server a
list per node every few seconds; a watch costs one list at start (from the watch cache,
resourceVersion "0") and then only the node's own pod events. The loop (410 Gone, backoff,
stop) is gpuslice.listwatch's.

May import gpuslice.{listwatch,podrequests,quantity}.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Unpack

from gpuslice import listwatch, podrequests, quantity

__all__ = ["NodePods", "holds_resources", "requests"]

# What the labeller's headroom counts.
_COUNTED = frozenset({"cpu", "memory"})


class NodePods(listwatch.PodWatch):
    """`run()` until cancelled or `stop()`; `pods()` once `synced` is set. `on_change()` is called
    (on the event loop) when what the node's pods hold of its CPU and memory changes: one bound,
    one ended (Succeeded, Failed) or deleted, one resized in place. Other status updates of a
    running pod do not call it, so the labeller refreshes about twice per pod, not on every
    kubelet status write."""

    def __init__(
        self,
        core_api: Callable[[], Any],
        node_name: str,
        on_change: Callable[[], object] | None = None,
        **options: Unpack[listwatch.Options],
    ) -> None:
        options.setdefault("request_timeout_seconds", 10.0)
        selector = f"spec.nodeName={node_name}"
        super().__init__(core_api, f"pods of {selector}", selector, **options)
        self._pods: dict[str, Mapping[str, Any]] = {}  # by UID
        self._on_change = on_change

    def pods(self) -> list[Mapping[str, Any]]:
        return list(self._pods.values())

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        holding = {_uid(pod): _held(pod) for pod in self._pods.values() if holds_resources(pod)}
        self._pods = {_uid(pod): pod for pod in items}
        if holding != {_uid(pod): _held(pod) for pod in items if holds_resources(pod)}:
            self._changed()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        before = self._pods.get(uid)
        if kind == "DELETED":
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = obj
        held_before = _held(before) if before is not None and holds_resources(before) else None
        held_now = _held(obj) if kind != "DELETED" and holds_resources(obj) else None
        if held_before != held_now:
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Whether the scheduler still counts the pod's requests on its node: until it has ended."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """The pod's CPU (cores) and memory (bytes) as kube-scheduler counts them on its node."""
    return podrequests.on_node(pod, _parse, _COUNTED)


def _parse(name: str, value: Any) -> Decimal:
    return quantity.parse(value)


def _held(pod: Mapping[str, Any]) -> tuple[Decimal, Decimal]:
    counted = requests(pod)
    return counted.get("cpu", Decimal(0)), counted.get("memory", Decimal(0))


def _uid(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")
