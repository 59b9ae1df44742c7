"""Tolerations for converted pods (issue 14).

GPU nodes are commonly tainted `nvidia.com/gpu:NoSchedule`. Kubernetes' ExtendedResourceToleration
admission plugin adds the matching toleration only to pods that request `nvidia.com/gpu`, and a
converted pod requests gpuslice resources instead, so without help it could never land on a
tainted GPU node. The webhook adds the configured tolerations (`convertedPodTolerations`) that the
pod does not already have, in the sense the scheduler uses: an existing toleration that tolerates
every taint the wanted one tolerates makes it redundant.

Pure. May import nothing of gpuslice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["covers", "patch_ops"]


def covers(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when `existing` tolerates every taint `wanted` tolerates."""
    effect = existing.get("effect") or ""
    if effect and effect != (wanted.get("effect") or ""):
        return False  # an empty effect tolerates every effect; a set one only its own
    if existing.get("operator", "Equal") == "Exists":
        if existing.get("key") and existing.get("key") != wanted.get("key"):
            return False
    elif existing.get("key") != wanted.get("key") or wanted.get("operator", "Equal") == "Exists":
        return False  # Equal tolerates one value; wanted tolerates them all
    elif (existing.get("value") or "") != (wanted.get("value") or ""):
        return False
    seconds, wanted_seconds = existing.get("tolerationSeconds"), wanted.get("tolerationSeconds")
    # A NoExecute toleration with a time limit tolerates for less than one without.
    return seconds is None or (wanted_seconds is not None and seconds >= wanted_seconds)


def patch_ops(spec: Mapping[str, Any], wanted: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """(JSON patch operations adding the wanted tolerations the pod lacks, how many are added)."""
    existing = [t for t in spec.get("tolerations") or () if isinstance(t, Mapping)]
    missing: list[dict[str, Any]] = []
    for toleration in wanted:
        if not any(covers(e, toleration) for e in (*existing, *missing)):
            missing.append(dict(toleration))
    if not missing:
        return [], 0
    if spec.get("tolerations"):
        return [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing], len(missing)
    return [{"op": "add", "path": "/spec/tolerations", "value": missing}], len(missing)
