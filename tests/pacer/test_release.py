"""Which gated pod goes next and the patch that releases it (pacer/release.py)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from gpuslice import contract as contract_
from gpuslice.pacer import release

CONTRACT = contract_.Contract()
GATE = {"name": CONTRACT.pacing_gate}
CLASS_PIN = {"key": CONTRACT.label_gpu_memory_mib, "operator": "In", "values": ["81559"]}


def pod(
    name: str = "p", *, gates: list[dict[str, str]] | None = None, affinity: Any = None, **meta: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "x"}],
        "schedulingGates": [GATE] if gates is None else gates,
    }
    if affinity is not None:
        spec["affinity"] = affinity
    metadata = {"name": name, "namespace": "team", "uid": f"uid-{name}", "resourceVersion": "7", **meta}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def released(manifest: dict[str, Any]) -> dict[str, Any]:
    entry = release.gated(manifest, CONTRACT)
    assert entry is not None
    return jsonpatch.apply_patch(copy.deepcopy(manifest), release.patch(entry, CONTRACT))


def test_only_unbound_pods_with_our_gate_are_waiting() -> None:
    assert release.gated(pod(), CONTRACT) is not None
    assert release.gated(pod(gates=[{"name": "example.com/other"}]), CONTRACT) is None
    bound = pod()
    bound["spec"]["nodeName"] = "n1"
    assert release.gated(bound, CONTRACT) is None
    assert release.gated(pod(deletionTimestamp="2026-11-24T00:00:00Z"), CONTRACT) is None


def test_higher_priority_goes_first_then_the_older_then_the_first_seen() -> None:
    def entry(name: str, created: str, seen: int, priority: int | None = None) -> release.Gated:
        manifest = pod(name, creationTimestamp=created)
        if priority is not None:
            manifest["spec"]["priority"] = priority
        gated = release.gated(manifest, CONTRACT, seen)
        assert gated is not None
        return gated

    entries = [
        entry("late", "2026-11-24T00:00:02Z", 0),
        entry("a-second", "2026-11-24T00:00:01Z", 2),  # same second: the watch showed it later
        entry("b-first", "2026-11-24T00:00:01Z", 1),
        entry("urgent", "2026-11-24T00:00:09Z", 3, priority=1000),
    ]
    assert [e.name for e in sorted(entries)] == ["urgent", "b-first", "a-second", "late"]


def test_the_release_removes_only_our_gate_and_tests_the_version_read() -> None:
    other = {"name": "example.com/quota"}
    manifest = pod(gates=[other, GATE])
    entry = release.gated(manifest, CONTRACT)
    assert entry is not None
    ops = release.patch(entry, CONTRACT)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert released(manifest)["spec"]["schedulingGates"] == [other]
    assert "schedulingGates" not in released(pod())["spec"]
    moved = pod()
    moved["metadata"]["resourceVersion"] = "8"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved, ops)


def test_the_affinity_is_never_touched() -> None:
    manifest = pod(affinity=required({"matchExpressions": [CLASS_PIN]}))
    after = released(manifest)
    assert after["spec"]["affinity"] == manifest["spec"]["affinity"]
    kubernetes_validate.validate(after, "1.31", strict=True)
