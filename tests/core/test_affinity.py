"""Whether a pod's node selection admits a node, as kube-scheduler's NodeAffinity filter decides
(gpuslice/affinity.py: the pacer asks it of lagging nodes, the simulator's filter is held to it)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice import affinity

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
    assert affinity.admits(spec({"matchExpressions": [requirement]}), "n1", LABELS) is admitted


def test_terms_are_ored_and_requirements_within_a_term_anded() -> None:
    wrong = {"matchExpressions": [expr("zone", "In", "b")]}
    right = {"matchExpressions": [expr("zone", "In", "a"), expr("gpuslice.io/gpu.free-block-units", "Gt", "100")]}
    half = {"matchExpressions": [expr("zone", "In", "a"), expr("gpuslice.io/gpu.free-block-units", "Gt", "300")]}
    assert affinity.admits(spec(wrong, right), "n1", LABELS)
    assert not affinity.admits(spec(wrong, half), "n1", LABELS)


def test_node_names_are_matched_by_field_and_an_empty_term_selects_nothing() -> None:
    by_name = {"matchFields": [expr("metadata.name", "In", "n1")]}
    assert affinity.admits(spec(by_name), "n1", LABELS)
    assert not affinity.admits(spec(by_name), "n2", LABELS)
    assert not affinity.admits(spec({}), "n1", LABELS)


def test_the_node_selector_must_hold_as_well() -> None:
    assert affinity.admits(spec(node_selector={"zone": "a"}), "n1", LABELS)
    assert not affinity.admits(spec(node_selector={"zone": "b"}), "n1", LABELS)
    assert affinity.admits(spec(), "n1", {})


@pytest.mark.parametrize(
    ("value", "number"),
    [
        ("42", 42),
        ("0", 0),
        ("-3", -3),
        ("+7", 7),
        ("007", 7),
        (str(2**63 - 1), 2**63 - 1),
        (str(-(2**63)), -(2**63)),
        (str(2**63), None),  # beyond 64 bits: Go's ParseInt fails, so Gt and Lt do
        ("1_0", None),  # int() reads these; the scheduler does not
        (" 12", None),
        ("１２", None),
        ("1.5", None),
        ("1e3", None),
        ("", None),
        ("a", None),
        (None, None),
    ],
)
def test_gt_and_lt_read_a_label_as_a_64_bit_decimal_integer(value: str | None, number: int | None) -> None:
    assert affinity.integer(value) == number


@pytest.mark.parametrize(
    ("requirement", "admitted"),
    [
        (expr("gpuslice.io/gpu.free-block-units", "Gt", "1_0"), False),  # a bound that is no integer
        (expr("gpuslice.io/gpu.free-block-units", "Gt", "1", "2"), False),  # two bounds
        (expr("gpuslice.io/gpu.free-block-units", "Lt"), False),  # none
        (expr("missing", "Lt", "5"), False),  # a missing label fails Gt and Lt
        (expr("zone", "In"), False),  # In nothing
        (expr("zone", "NotIn"), True),
    ],
    ids=lambda v: v if isinstance(v, bool) else f"{v['key']} {v['operator']} {v.get('values', '')}",
)
def test_requirements_the_api_server_would_refuse_match_as_written(requirement: dict[str, Any], admitted: bool) -> None:
    assert affinity.admits(spec({"matchExpressions": [requirement]}), "n1", LABELS) is admitted


@pytest.mark.parametrize(
    "field",
    [expr("metadata.name", "Exists"), expr("metadata.name", "DoesNotExist"), expr("metadata.uid", "NotIn", "x")],
    ids=["exists", "does-not-exist", "another-field"],
)
def test_fields_other_than_the_node_name_by_in_or_notin_match_no_node(field: dict[str, Any]) -> None:
    assert not affinity.admits(spec({"matchFields": [field]}), "n1", LABELS)


def test_a_node_name_notin_matches_every_other_node() -> None:
    by_name = {"matchFields": [expr("metadata.name", "NotIn", "n1")]}
    assert not affinity.admits(spec(by_name), "n1", LABELS)
    assert affinity.admits(spec(by_name), "n2", LABELS)


def test_a_required_affinity_without_terms_selects_no_node_and_none_selects_every_node() -> None:
    no_terms = {"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}
    assert affinity.required_terms(no_terms) == ()
    assert not affinity.admits(no_terms, "n1", LABELS)
    empty = {"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}}
    assert affinity.required_terms(empty) is None
    assert affinity.admits(empty, "n1", LABELS)


def test_terms_are_read_expressions_first_then_fields() -> None:
    term = {"matchFields": [expr("metadata.name", "In", "n1")], "matchExpressions": [expr("zone", "Exists")]}
    assert affinity.term(term) == (
        affinity.Requirement("zone", "Exists"),
        affinity.Requirement("metadata.name", "In", ("n1",), field=True),
    )


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (expr("zone", "Bogus", "a"), "operator 'Bogus' is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
        ({"key": "zone"}, "operator None is not one of"),
        (expr("n", "Gt"), r"Gt needs exactly one integer value, got \[\]"),
        (expr("n", "Lt", "1", "2"), r"Lt needs exactly one integer value, got \['1', '2'\]"),
        (expr("n", "Gt", "ten"), r"Gt needs exactly one integer value, got \['ten'\]"),
        (expr("n", "Gt", "1_0"), r"Gt needs exactly one integer value, got \['1_0'\]"),
        (expr("n", "Lt", str(2**63)), "Lt needs exactly one integer value"),
        (expr("zone", "In"), "In needs at least one value"),
        (expr("zone", "NotIn"), "NotIn needs at least one value"),
        (expr("zone", "Exists", "a"), "Exists takes no values"),
        (expr("zone", "DoesNotExist", "a"), "DoesNotExist takes no values"),
    ],
)
def test_a_checked_requirement_names_the_rule_it_breaks(expression: dict[str, Any], message: str) -> None:
    with pytest.raises(affinity.AffinityError, match=message):
        affinity.checked_requirement(expression)
    with pytest.raises(affinity.AffinityError, match=message):
        affinity.required_terms(spec({"matchExpressions": [expression]}), checked=True)


def test_a_checked_requirement_is_the_requirement_as_written() -> None:
    expression = expr("gpuslice.io/gpu.free-block-units", "Gt", "190")
    assert affinity.checked_requirement(expression) == affinity.requirement(expression)
    assert affinity.requirement(expression) == affinity.Requirement("gpuslice.io/gpu.free-block-units", "Gt", ("190",))
