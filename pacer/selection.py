"""Whether a pod's node selection admits a node: its `nodeSelector` and its required node affinity,
evaluated as kube-scheduler's NodeAffinity filter does on labels and `metadata.name`. Pure.

The pacer asks this only of the few nodes that lag, to know whether a gated pod could be sent to
one of them. Taints, resources and pod affinity are not looked at: a node they rule out is one
the pod waits for needlessly, never one it is sent to by stale labels.

May import nothing of gpuslice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["admits"]


def admits(spec: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """Whether the pod with `spec` may be placed on node `name` with `labels`."""
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or ()
    return any(_term_admits(term or {}, name, labels) for term in terms)


def _term_admits(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False  # an empty term selects no node
    return all(_holds(e, labels.get(str(e.get("key")))) for e in expressions) and all(
        _holds(f, name if f.get("key") == "metadata.name" else None) for f in fields
    )


def _holds(requirement: Mapping[str, Any], value: str | None) -> bool:
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or ()]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
