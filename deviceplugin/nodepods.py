"""The pods bound to one node, kept current by a list + watch that asks only for them (field
selector `spec.nodeName=<node>`), for the labeller's CPU and memory headroom.

Listing the node's pods on every refresh (every poll and every Allocate) cost the API server a
list per node every few seconds; a watch costs one list at start (from the watch cache,
resourceVersion "0") and then only the node's own pod events. The loop (410 Gone, backoff,
stop) is gpuslice.listwatch's.

May import gpuslice.listwatch and the kubernetes client (through it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from gpuslice import listwatch

__all__ = ["NodePods"]


class NodePods(listwatch.PodWatch):
    """`run()` until cancelled or `stop()`; `pods()` once `synced` is set."""

    def __init__(self, core_api: Callable[[], Any], node_name: str, **options: Unpack[listwatch.Options]) -> None:
        options.setdefault("request_timeout_seconds", 10.0)
        selector = f"spec.nodeName={node_name}"
        super().__init__(core_api, f"pods of {selector}", selector, **options)
        self._pods: dict[str, Mapping[str, Any]] = {}  # by UID

    def pods(self) -> list[Mapping[str, Any]]:
        return list(self._pods.values())

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self._pods = {_uid(pod): pod for pod in items}

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self._pods.pop(_uid(obj), None)
        else:
            self._pods[_uid(obj)] = obj


def _uid(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")
