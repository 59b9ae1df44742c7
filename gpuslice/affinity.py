"""Whether a node's labels and name satisfy a pod's `nodeSelector` and required node affinity,
as kube-scheduler's NodeAffinity filter decides: the one matcher the pacer asks of a node, and the
semantics the simulator's vectorised filter (sim/scheduler.py) is tested against.

The rules (k8s.io/component-helpers' nodeaffinity, apimachinery's label selectors):
- every `nodeSelector` pair must be a label of the node, exactly;
- the required terms are ORed, the requirements of one term ANDed, and a term with no
  requirement selects no node;
- In / NotIn: the label's value is (not) one of the values; a missing label is not In anything
  and is NotIn everything; Exists / DoesNotExist: whether the label is there at all;
- Gt / Lt: the label's value, read as a base-10 64-bit integer, is greater / less than the one
  value; a label that is missing or not such an integer fails both;
- matchFields: only `metadata.name` with In or NotIn, against the node's name; anything else
  matches no node.

`requirement` reads an expression as written (an unknown operator simply matches nothing), which
is what the pacer needs of pods the API server has already validated; `checked_requirement` also
refuses what the API server would (AffinityError), as the simulator does for pods it builds.

May import only the standard library.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "NODE_NAME_FIELD",
    "OPERATORS",
    "AffinityError",
    "Requirement",
    "admits",
    "checked_requirement",
    "integer",
    "required_terms",
    "requirement",
    "selector_matches",
    "term",
    "term_matches",
]

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
NODE_NAME_FIELD = "metadata.name"
_INTEGER_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)  # Go's strconv.ParseInt(s, 10, 64); not int()
_INT64 = 2**63


class AffinityError(ValueError):
    """A node selector requirement the API server would refuse; the message says which rule."""


def integer(value: str | None) -> int | None:
    """What Gt and Lt read of a label value: a base-10 64-bit integer, or None (which fails both).
    Python's int() would also take "1_0", " 12" and "１２", and beyond 64 bits."""
    if value is None or not _INTEGER_RE.fullmatch(value):
        return None
    number = int(value)
    return number if -_INT64 <= number < _INT64 else None


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One node selector requirement; `field` True for matchFields (only metadata.name)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """Whether a node with `labels` and `name` satisfies this requirement."""
        if self.field:
            if self.key != NODE_NAME_FIELD or self.operator not in ("In", "NotIn"):
                return False
            return (name in self.values) is (self.operator == "In")
        value = labels.get(self.key)
        operator = self.operator
        if operator == "In":
            return value is not None and value in self.values
        if operator == "NotIn":
            return value is None or value not in self.values
        if operator == "Exists":
            return value is not None
        if operator == "DoesNotExist":
            return value is None
        if operator in ("Gt", "Lt") and len(self.values) == 1:
            have, bound = integer(value), integer(self.values[0])
            if have is None or bound is None:
                return False
            return have > bound if operator == "Gt" else have < bound
        return False


def requirement(expression: Mapping[str, Any], *, field: bool = False) -> Requirement:
    """One matchExpressions (or, `field`, matchFields) entry as written."""
    values = tuple(str(v) for v in expression.get("values") or ())
    return Requirement(str(expression.get("key", "")), str(expression.get("operator")), values, field)


def checked_requirement(expression: Mapping[str, Any], *, field: bool = False) -> Requirement:
    """`requirement`, refusing (AffinityError) what the API server's validation refuses of the
    operator and its values."""
    operator = expression.get("operator")
    if operator not in OPERATORS:
        raise AffinityError(f"operator {operator!r} is not one of {', '.join(OPERATORS)}")
    read = requirement(expression, field=field)
    values = read.values
    if operator in ("Gt", "Lt") and (len(values) != 1 or integer(values[0]) is None):
        raise AffinityError(f"{operator} needs exactly one integer value, got {list(values)}")
    if operator in ("In", "NotIn") and not values:
        raise AffinityError(f"{operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise AffinityError(f"{operator} takes no values")
    return read


def term_matches(term: Sequence[Requirement], labels: Mapping[str, str], name: str) -> bool:
    """Whether every requirement of one term holds; an empty term selects no node."""
    return bool(term) and all(r.matches(labels, name) for r in term)


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether every pair of a `nodeSelector` is a label of the node."""
    return all(labels.get(k) == v for k, v in selector.items())


def term(term: Mapping[str, Any], *, checked: bool = False) -> tuple[Requirement, ...]:
    """One node selector term (matchExpressions, then matchFields) as requirements; `checked`:
    read with `checked_requirement`."""
    read = checked_requirement if checked else requirement
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    return tuple(read(e) for e in expressions) + tuple(read(f, field=True) for f in fields)


def required_terms(spec: Mapping[str, Any], *, checked: bool = False) -> tuple[tuple[Requirement, ...], ...] | None:
    """The pod's required node affinity as terms of requirements; None when it has none (a
    required affinity without terms is kept: it selects no node)."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return None
    return tuple(term(t or {}, checked=checked) for t in required.get("nodeSelectorTerms") or ())


def admits(spec: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """Whether the pod with `spec` may be placed on node `name` with `labels`, by its nodeSelector
    and required node affinity (the pod as the API server stored it: not validated again)."""
    if not selector_matches(spec.get("nodeSelector") or {}, labels):
        return False
    terms = required_terms(spec)
    return terms is None or any(term_matches(term, labels, name) for term in terms)
