"""Keeps the webhook's ClusterView current from the Kubernetes API: the nodes, listed and then
watched (gpuslice.listwatch: relist on 410 Gone, backoff on errors). Admissions read the view in
memory; nothing is fetched per request.

May import gpuslice.{compact,listwatch}, the webhook's cluster module and the kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import kubernetes

from gpuslice import compact, listwatch
from gpuslice.webhook import cluster as cluster_

__all__ = ["NodeWatcher"]

log = logging.getLogger(__name__)


def _labels(node: Mapping[str, Any]) -> tuple[str, Mapping[str, str], Mapping[str, Any] | None]:
    """(name, labels, status) of a node object; status None when the object has none."""
    metadata = node.get("metadata") or {}
    status = node.get("status")
    return str(metadata.get("name", "")), metadata.get("labels") or {}, status if isinstance(status, Mapping) else None


class NodeWatcher(listwatch.ListWatch):
    """List + watch nodes into a ClusterView. `run()` until `stop()`; `synced` is set after the first list."""

    def __init__(
        self, api: kubernetes.client.CoreV1Api, cluster: cluster_.ClusterView, **options: Unpack[listwatch.Options]
    ) -> None:
        super().__init__(lambda: api.list_node, "nodes", **options)
        self.api = api
        self.cluster = cluster

    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return compact.node(obj)

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        seen = set()
        for node in items:
            name, labels, status = _labels(node)
            seen.add(name)
            self._update(name, labels, status)
        for name in self.cluster.node_names() - seen:
            self.cluster.remove_node(name)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        name, labels, status = _labels(obj)
        if kind == "DELETED":
            self.cluster.remove_node(name)
        else:
            self._update(name, labels, status)

    def _update(self, name: str, labels: Mapping[str, str], status: Mapping[str, Any] | None) -> None:
        """Update the view; say once when a node starts or stops being left out."""
        before = self.cluster.untrusted.get(name)
        self.cluster.update_node(name, labels, status=status)
        after = self.cluster.untrusted.get(name)
        if after != before:
            if after is not None:
                log.warning("node %s left out of GPU class choice (%s): %s", name, after[0], after[1])
            else:
                log.info("node %s is used for GPU class choice again", name)
