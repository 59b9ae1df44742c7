"""Releasing one gated pod: which pod goes next and the JSON patch that lets it go. Pure.

The patch removes our scheduling gate (other gates stay) and, when nodes lag, keeps the pod off
them with one `metadata.name NotIn` field requirement per node (the API allows one value per field
requirement) added to each of its required node selector terms. Kubernetes lets a gated pod's
required node affinity be narrowed this way, never widened (KEP-3838, stable in 1.30): adding
requirements to existing terms, or setting the terms where there were none. A `test` of the
resourceVersion makes the patch apply only to the version the pacer read.

May import gpuslice.contract only.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice import contract as contract_

__all__ = ["Gated", "gated", "patch"]


@dataclasses.dataclass(frozen=True, order=True)
class Gated:
    """A pod waiting for our gate to be removed, ordered as it should be released: higher priority
    first, then the older, then by name."""

    order: tuple[int, str, str, str]  # (-priority, creationTimestamp, namespace, name)
    uid: str = dataclasses.field(compare=False)
    namespace: str = dataclasses.field(compare=False)
    name: str = dataclasses.field(compare=False)
    resource_version: str = dataclasses.field(compare=False)
    spec: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)


def gated(pod: Mapping[str, Any], contract: contract_.Contract) -> Gated | None:
    """The pod as a Gated entry when it carries our gate and is not bound; None otherwise."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or metadata.get("deletionTimestamp"):
        return None
    gates = spec.get("schedulingGates") or ()
    if not any(isinstance(g, Mapping) and g.get("name") == contract.pacing_gate for g in gates):
        return None
    priority = spec.get("priority")
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    return Gated(
        order=(
            -priority if isinstance(priority, int) else 0,
            str(metadata.get("creationTimestamp") or ""),
            namespace,
            name,
        ),
        uid=str(metadata.get("uid") or ""),
        namespace=namespace,
        name=name,
        resource_version=str(metadata.get("resourceVersion") or ""),
        spec=spec,
    )


def patch(pod: Gated, contract: contract_.Contract, excluded: Sequence[str]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that releases `pod` kept off the nodes `excluded`."""
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}]
    remaining = [g for g in pod.spec.get("schedulingGates") or () if g.get("name") != contract.pacing_gate]
    if remaining:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": remaining})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    if excluded:
        ops.append({"op": "add", "path": "/spec/affinity", "value": _narrowed(pod.spec.get("affinity"), excluded)})
    return ops


def _narrowed(affinity: Mapping[str, Any] | None, excluded: Sequence[str]) -> dict[str, Any]:
    """The pod's affinity with every required node selector term also excluding `excluded`."""
    requirements = [{"key": "metadata.name", "operator": "NotIn", "values": [name]} for name in excluded]
    narrowed = copy.deepcopy(dict(affinity or {}))
    node_affinity = narrowed.setdefault("nodeAffinity", {})
    selector = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = selector.get("nodeSelectorTerms") or [{}]
    for term in terms:
        fields = term.setdefault("matchFields", [])
        fields.extend(r for r in requirements if r not in fields)
    selector["nodeSelectorTerms"] = terms
    return narrowed
