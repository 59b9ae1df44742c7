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

__all__ = ["WrongShape", "check_pod", "parts_kept_whole_pass"]

Check = Callable[[Any], None]


class WrongShape(ValueError):
    """A field has the wrong JSON type; the message names it."""

    def __init__(self, expected: str, value: Any) -> None:
        super().__init__(expected)
        self.expected, self.kind = expected, _kind(value)
        self.path: list[str] = []  # filled in on the way out, so the happy path builds no strings

    def __str__(self) -> str:
        return f"{''.join(self.path)} must be {self.expected}, not {self.kind}"


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # orjson gives dicts: skip the ABC check


def _string(value: Any) -> None:
    if type(value) is not str and not isinstance(value, str):
        raise WrongShape("a string", value)


def _quantity(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise WrongShape("a quantity (a string)", value)


def _list(item: Check) -> Check:
    def check(value: Any) -> None:
        if type(value) is not list:
            raise WrongShape("a list", value)
        for index, entry in enumerate(value):
            if entry is not None:
                try:
                    item(entry)
                except WrongShape as exc:
                    exc.path.insert(0, f"[{index}]")
                    raise

    return check


def _object(fields: Mapping[str, Check] | None = None, *, values: Check | None = None) -> Check:
    """An object whose named `fields` (or every value, with `values`) pass their checks."""
    named = tuple((fields or {}).items())

    def check(value: Any) -> None:
        if not _is_mapping(value):
            raise WrongShape("an object", value)
        if values is not None:
            for key, entry in value.items():
                if entry is not None:
                    try:
                        values(entry)
                    except WrongShape as exc:
                        exc.path.insert(0, f"[{str(key)[:100]!r}]")
                        raise
        for key, field_check in named:
            entry = value.get(key)
            if entry is not None:
                try:
                    field_check(entry)
                except WrongShape as exc:
                    exc.path.insert(0, f".{key}")
                    raise

    return check


_RESOURCE_MAP = _object(values=_quantity)
_RESOURCES = _object({"requests": _RESOURCE_MAP, "limits": _RESOURCE_MAP, "claims": _list(_object())})
_CONTAINER = _object({"name": _string, "resources": _RESOURCES})
_EXPRESSION = _object({"key": _string, "operator": _string, "values": _list(_string)})
_TERM = _object({"matchExpressions": _list(_EXPRESSION), "matchFields": _list(_EXPRESSION)})
_NODE_AFFINITY = _object(
    {
        "requiredDuringSchedulingIgnoredDuringExecution": _object({"nodeSelectorTerms": _list(_TERM)}),
        "preferredDuringSchedulingIgnoredDuringExecution": _list(_object({"preference": _TERM})),
    }
)
_AFFINITY = _object({"nodeAffinity": _NODE_AFFINITY})
_RESOURCE_CLAIMS = _list(_object({"name": _string}))
_POD = _object(
    {
        "metadata": _object(
            {
                "name": _string,
                "generateName": _string,
                "namespace": _string,
                "annotations": _object(values=_string),
                "labels": _object(values=_string),
                "ownerReferences": _list(_object({"kind": _string, "uid": _string})),
            }
        ),
        "spec": _object(
            {
                "containers": _list(_CONTAINER),
                "initContainers": _list(_CONTAINER),
                "nodeSelector": _object(values=_string),
                "nodeName": _string,
                "schedulerName": _string,
                "affinity": _AFFINITY,
                "tolerations": _list(_object()),
                "resourceClaims": _RESOURCE_CLAIMS,
            }
        ),
    }
)


def check_pod(pod: Any) -> None:
    """Raise WrongShape naming the first field of `pod` (as `object.spec...`) with the wrong type."""
    try:
        _POD(pod)
    except WrongShape as exc:
        exc.path.insert(0, "object")
        raise


def parts_kept_whole_pass(spec: Mapping[str, Any] | None) -> bool:
    """Whether the parts of a pod's `spec` that webhook/decoding.py keeps whole, untyped (each
    container's resources, the affinity, the resource claims), pass `check_pod`'s checks; it has
    checked the rest of what `check_pod` checks as it decoded. (False: `check_pod` words it.)"""
    if not spec:
        return True
    try:
        for field in ("containers", "initContainers"):
            for container in spec.get(field) or ():
                if container is not None and container.get("resources") is not None:
                    _RESOURCES(container["resources"])
        if spec.get("affinity") is not None:
            _AFFINITY(spec["affinity"])
        if spec.get("resourceClaims") is not None:
            _RESOURCE_CLAIMS(spec["resourceClaims"])
    except WrongShape:
        return False
    return True
