"""Whether a pod's node selection admits a node, as kube-scheduler's NodeAffinity filter decides
(pacer/selection.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.pacer import selection

LABELS = {"gpuslice.io/gpu.memory-mib": "81559", "gpuslice.io/gpu.free-block-units": "200", "zone": "a"}


def spec(*terms: dict[str, Any], node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": []}
    if terms:
        body["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    if node_selector is not None:
        body["nodeSelector"] = node_selector
    return body


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize(
    ("requirement", "admitted"),
    [
        (expr("gpuslice.io/gpu.memory-mib", "In", "81559", "143771"), True),
        (expr("gpuslice.io/gpu.memory-mib", "In", "143771"), False),
        (expr("gpuslice.io/gpu.memory-mib", "NotIn", "143771"), True),
        (expr("missing", "NotIn", "x"), True),
        (expr("zone", "Exists"), True),
        (expr("missing", "Exists"), False),
        (expr("missing", "DoesNotExist"), True),
        (expr("gpuslice.io/gpu.free-block-units", "Gt", "190"), True),
        (expr("gpuslice.io/gpu.free-block-units", "Gt", "200"), False),
        (expr("gpuslice.io/gpu.free-block-units", "Lt", "201"), True),
        (expr("zone", "Gt", "1"), False),  # not a number
        (expr("zone", "Bogus", "a"), False),
    ],
    ids=lambda v: v if isinstance(v, bool) else f"{v['key']} {v['operator']} {v.get('values', '')}",
)
def test_each_operator_reads_labels_as_the_scheduler_does(requirement: dict[str, Any], admitted: bool) -> None:
    assert selection.admits(spec({"matchExpressions": [requirement]}), "n1", LABELS) is admitted


def test_terms_are_ored_and_requirements_within_a_term_anded() -> None:
    wrong = {"matchExpressions": [expr("zone", "In", "b")]}
    right = {"matchExpressions": [expr("zone", "In", "a"), expr("gpuslice.io/gpu.free-block-units", "Gt", "100")]}
    half = {"matchExpressions": [expr("zone", "In", "a"), expr("gpuslice.io/gpu.free-block-units", "Gt", "300")]}
    assert selection.admits(spec(wrong, right), "n1", LABELS)
    assert not selection.admits(spec(wrong, half), "n1", LABELS)


def test_node_names_are_matched_by_field_and_an_empty_term_selects_nothing() -> None:
    by_name = {"matchFields": [expr("metadata.name", "In", "n1")]}
    assert selection.admits(spec(by_name), "n1", LABELS)
    assert not selection.admits(spec(by_name), "n2", LABELS)
    assert not selection.admits(spec({}), "n1", LABELS)


def test_the_node_selector_must_hold_as_well() -> None:
    assert selection.admits(spec(node_selector={"zone": "a"}), "n1", LABELS)
    assert not selection.admits(spec(node_selector={"zone": "b"}), "n1", LABELS)
    assert selection.admits(spec(), "n1", {})
