"""The nodeSelector building blocks every steering family writes its terms with: `Gt` and `Lt`
expressions on a label, and a weighted preferred term. Imports nothing of gpuslice."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_BOUND", "Expression", "Term", "gt", "lt", "term"]

Expression = dict[str, Any]  # a nodeSelectorRequirement
Term = dict[str, Any]  # a preferredSchedulingTerm

# A million times the largest node's CPU (millicores) or memory (MiB); far inside the int64 the
# API server reads Gt/Lt values as. A term that would need a bound beyond it is not written.
MAX_BOUND = 10**15


def gt(key: str, value: int) -> Expression:
    return {"key": key, "operator": "Gt", "values": [str(value)]}


def lt(key: str, value: int) -> Expression:
    return {"key": key, "operator": "Lt", "values": [str(value)]}


def term(weight: int, *expressions: Expression) -> Term:
    return {"weight": weight, "preference": {"matchExpressions": list(expressions)}}
