"""Releasing one gated pod: which pod goes next and the JSON patch that lets it go. Pure.

The patch removes our scheduling gate and nothing else: other gates stay, and the pod's node
affinity is not touched. (Kubernetes would let a gated pod's required affinity be narrowed, say to
keep it off lagging nodes, but such a narrowing stays for the pod's life: a pod kept off the
nodes that were busy a moment ago could never go there later. The pacer waits instead.) A `test`
of the resourceVersion makes the patch apply only to the version the pacer read.

May import gpuslice.contract only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuslice import contract as contract_

__all__ = ["Gated", "gated", "patch"]


@dataclasses.dataclass(frozen=True, order=True)
class Gated:
    """A pod waiting for our gate to be removed, ordered as it should be released: higher priority
    first, then the older; within a second (creationTimestamp's resolution) in the order the pacer
    first saw them, which a watch gives in creation order, as the scheduler's queue would have them."""

    order: tuple[int, str, int]  # (-priority, creationTimestamp, seen)
    uid: str = dataclasses.field(compare=False)
    namespace: str = dataclasses.field(compare=False)
    name: str = dataclasses.field(compare=False)
    resource_version: str = dataclasses.field(compare=False)
    spec: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)


def gated(pod: Mapping[str, Any], contract: contract_.Contract, seen: int = 0) -> Gated | None:
    """The pod as a Gated entry, `seen` its place among the pods the pacer has seen, when it carries
    our gate and is not bound; None otherwise."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or metadata.get("deletionTimestamp"):
        return None
    gates = spec.get("schedulingGates") or ()
    if not any(isinstance(g, Mapping) and g.get("name") == contract.pacing_gate for g in gates):
        return None
    priority = spec.get("priority")
    return Gated(
        order=(-priority if isinstance(priority, int) else 0, str(metadata.get("creationTimestamp") or ""), seen),
        uid=str(metadata.get("uid") or ""),
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        spec=spec,
    )


def patch(pod: Gated, contract: contract_.Contract) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that releases `pod`: our gate removed, any other gate kept."""
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}]
    remaining = [g for g in pod.spec.get("schedulingGates") or () if g.get("name") != contract.pacing_gate]
    if remaining:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": remaining})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    return ops
