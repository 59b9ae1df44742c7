"""Type checks of the parts of a pod the webhook reads, before it reads them.

kube-apiserver decodes a pod into its Go type before any webhook sees it, so a string where a
list belongs never comes from it; a body that has one is malformed, and gets a 400 naming the
field rather than an exception deep in the conversion. Only the fields the mutation, steering
and DRA claims read are checked; the API server validates the rest after admission.
JSON null counts as absent everywhere, as the conversion reads it. Pure; imports nothing of gpuslice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["WrongShape", "check_pod"]

Check = Callable[[Any, str], None]


class WrongShape(ValueError):
    """A field has the wrong JSON type; the message names it."""


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _string(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, str):
        raise WrongShape(f"{where} must be a string, not {_kind(value)}")


def _quantity(value: Any, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise WrongShape(f"{where} must be a quantity (a string), not {_kind(value)}")


def _list(item: Check) -> Check:
    def check(value: Any, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, list):
            raise WrongShape(f"{where} must be a list, not {_kind(value)}")
        for index, entry in enumerate(value):
            item(entry, f"{where}[{index}]")

    return check


def _object(fields: Mapping[str, Check] | None = None, *, values: Check | None = None) -> Check:
    """An object whose named `fields` (or every value, with `values`) pass their checks."""

    def check(value: Any, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, Mapping):
            raise WrongShape(f"{where} must be an object, not {_kind(value)}")
        if values is not None:
            for key, entry in value.items():
                values(entry, f"{where}[{key[:100]!r}]")
        for key, field_check in (fields or {}).items():
            field_check(value.get(key), f"{where}.{key}")

    return check


_RESOURCE_MAP = _object(values=_quantity)
_CONTAINER = _object(
    {
        "name": _string,
        "resources": _object({"requests": _RESOURCE_MAP, "limits": _RESOURCE_MAP, "claims": _list(_object())}),
    }
)
_EXPRESSION = _object({"key": _string, "operator": _string, "values": _list(_string)})
_TERM = _object({"matchExpressions": _list(_EXPRESSION), "matchFields": _list(_EXPRESSION)})
_NODE_AFFINITY = _object(
    {
        "requiredDuringSchedulingIgnoredDuringExecution": _object({"nodeSelectorTerms": _list(_TERM)}),
        "preferredDuringSchedulingIgnoredDuringExecution": _list(_object({"preference": _TERM})),
    }
)
_POD = _object(
    {
        "metadata": _object(
            {
                "name": _string,
                "generateName": _string,
                "namespace": _string,
                "annotations": _object(values=_string),
                "labels": _object(values=_string),
                "ownerReferences": _list(_object({"kind": _string})),
            }
        ),
        "spec": _object(
            {
                "containers": _list(_CONTAINER),
                "initContainers": _list(_CONTAINER),
                "nodeSelector": _object(values=_string),
                "nodeName": _string,
                "schedulerName": _string,
                "affinity": _object({"nodeAffinity": _NODE_AFFINITY}),
                "tolerations": _list(_object()),
                "resourceClaims": _list(_object({"name": _string})),
            }
        ),
    }
)


def check_pod(pod: Any) -> None:
    """Raise WrongShape naming the first field of `pod` with the wrong type."""
    if not isinstance(pod, Mapping):
        raise WrongShape(f"object must be an object, not {_kind(pod)}")
    _POD(pod, "object")
