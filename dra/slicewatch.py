"""Watches this node's ResourceSlices of our driver, so slices someone else deletes are published
again within the publisher's minimum interval rather than at its next resync.

Kubelet is the one who deletes them: when it starts it wipes the node's slices (none of its drivers
has registered yet), and when a driver unregisters it wipes that driver's slices after a grace
period. The plugin keeps running through a kubelet restart and is registered again, but without
this watch its slices stay missing until `dra.sliceResyncSeconds` (default 300 s) and no claim can
be allocated on the node meanwhile.

Only deletions (and a fresh list, which may follow missed ones) wake the publisher: our own writes
come back as ADDED/MODIFIED events and would otherwise cost a sync each. Slices edited by someone
else are repaired by the periodic resync.

May import gpuslice.listwatch and the kubernetes client (through it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from gpuslice import listwatch

__all__ = ["NodeSlices"]


class NodeSlices(listwatch.ListWatch):
    """`run()` until cancelled or `stop()`; calls `on_gone()` when a slice of ours may be missing."""

    def __init__(
        self,
        resource_api: Callable[[], Any],
        node_name: str,
        driver: str,
        on_gone: Callable[[], None],
        **options: Unpack[listwatch.Options],
    ) -> None:
        options.setdefault("request_timeout_seconds", 10.0)
        selector = f"spec.nodeName={node_name},spec.driver={driver}"
        super().__init__(
            lambda: resource_api().list_resource_slice,  # the client is made on first use
            f"ResourceSlices of {selector}",
            field_selector=selector,
            **options,
        )
        self._on_gone = on_gone
        self.deletions = 0  # slices seen deleted (tests, log lines)

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        # A list after a failed or expired watch: deletions may have been missed; the publisher
        # compares what is stored with what it wants and writes only when they differ.
        self._on_gone()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.deletions += 1
            self._on_gone()
