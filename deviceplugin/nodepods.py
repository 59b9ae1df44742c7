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
from typing import Any

from gpuslice import listwatch

__all__ = ["NodePods"]


class NodePods(listwatch.ListWatch):
    """`run()` until cancelled or `stop()`; `pods()` once `synced` is set."""

    def __init__(
        self,
        core_api: Callable[[], Any],
        node_name: str,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 10.0,
        backoff_initial_seconds: float = 0.5,
        backoff_max_seconds: float = 30.0,
    ) -> None:
        selector = f"spec.nodeName={node_name}"
        super().__init__(
            lambda: core_api().list_pod_for_all_namespaces,  # the client is made on first use
            f"pods of {selector}",
            field_selector=selector,
            from_cache=True,
            watch_timeout_seconds=watch_timeout_seconds,
            request_timeout_seconds=request_timeout_seconds,
            backoff_initial_seconds=backoff_initial_seconds,
            backoff_max_seconds=backoff_max_seconds,
        )
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
