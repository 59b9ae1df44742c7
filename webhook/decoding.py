"""The AdmissionReview fields the webhook reads, decoded in one typed pass (msgspec) that skips
the rest of the pod (env, volumes, probes, managedFields: most of its 5-20 KB) without building
Python objects for it. Pure; no I/O.

`fields(body)` gives the document as orjson decodes it, with only the keys the webhook reads
(admission, shape, mutation and its steps: the types below), and whether the pod's fields have
the types `shape.check_pod` asks for (the typed pass checks most, `shape.parts_kept_whole_pass`
the rest), so the review need not walk them again; or None when the typed pass cannot promise
the document: the caller then decodes the whole body with orjson, which also words the errors.
So what is unusual takes the old path and gets the old answer: a field named below with another
JSON type (a string where an object belongs), a body that is not UTF-8 (msgspec does not check
the strings it skips, so it is checked here), one with more brackets than orjson's nesting limit
(1024; msgspec's follows Python's recursion limit), or not JSON.
The kept fields are encoded again and read by orjson (a few hundred bytes), so their values are
exactly orjson's: it reads an integer beyond 64 bits as a float, msgspec as an int. Explicit nulls
stay None and absent keys stay absent; of an owner reference only the kind is kept.

`fields` also gives the answer's key: the kept fields encoded again without those the answer does
not depend on (the request's uid, the pod's name and generateName, its labels but those the
`KeyRules` name, and the CPU and memory amounts of a pod that asks for no device), so pods of one
template that differ only in what the webhook skips (one-pod Jobs, the Deployments of one chart,
CPU pods sized each their own way) share answers (webhook/repeats.py). Whoever makes an answer
read another field must keep it here.

One leniency, for input kube-apiserver cannot send (a Pod's numbers are 32- and 64-bit integers):
a number beyond a double's range (1e999) in a field the webhook does not read is skipped, where
orjson refuses the whole body.

May import msgspec, orjson and the webhook's shape module.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Collection
from typing import Any

import msgspec
import orjson

from gpuslice.webhook import shape

__all__ = ["Decoded", "KeyRules", "fields"]

_UNSET: Any = msgspec.UNSET


# The pod's fields as webhook/shape.py checks them (null counts as absent): a field of another
# type makes the typed pass fail, and the whole decode and `shape.check_pod` word it. The parts
# kept whole (Any) are checked after (`shape.parts_kept_whole_pass`).
_Strings = dict[str, str | None] | None


class _Container(msgspec.Struct):
    name: str | None = _UNSET
    resources: Any = _UNSET  # kept whole: the patch rewrites it (a device-less pod's amounts left out of the key)
    restartPolicy: Any = _UNSET  # "Always" makes an init container a sidecar, counted with the containers


class _Owner(msgspec.Struct):
    kind: str | None = _UNSET  # DaemonSet pods are not steered
    # The controller's UID: the pods of one controller go to one GPU class (webhook/classchoice.py).
    uid: str | None = _UNSET
    controller: Any = _UNSET


class _Metadata(msgspec.Struct):
    name: str | None = _UNSET
    generateName: str | None = _UNSET
    namespace: str | None = _UNSET
    annotations: _Strings = _UNSET
    labels: _Strings = _UNSET
    ownerReferences: list[_Owner | None] | None = _UNSET


class _Spec(msgspec.Struct):
    containers: list[_Container | None] | None = _UNSET
    initContainers: list[_Container | None] | None = _UNSET
    nodeSelector: _Strings = _UNSET
    nodeName: str | None = _UNSET
    schedulerName: str | None = _UNSET
    affinity: Any = _UNSET  # kept whole: the patch rewrites it
    tolerations: list[dict[str, Any] | None] | None = _UNSET
    resourceClaims: Any = _UNSET
    schedulingGates: Any = _UNSET  # kept whole: pacing appends its gate to the pod's own
    resources: Any = _UNSET  # pod-level requests and the overhead: what the scheduler counts
    overhead: Any = _UNSET  # (gpuslice.podrequests); a device-less pod's are in its key, which is rare


class _Pod(msgspec.Struct):
    metadata: _Metadata | None = _UNSET
    spec: _Spec | None = _UNSET


class _Request(msgspec.Struct):
    uid: Any = _UNSET
    resource: Any = _UNSET
    subResource: Any = _UNSET
    namespace: Any = _UNSET
    operation: Any = _UNSET
    dryRun: Any = _UNSET
    object: _Pod | None = _UNSET


class _Review(msgspec.Struct):
    apiVersion: Any = _UNSET
    kind: Any = _UNSET
    request: _Request | None = _UNSET


_DECODER = msgspec.json.Decoder(_Review)
_ORJSON_MAX_DEPTH = 1024  # orjson refuses deeper nesting; a body with fewer brackets cannot reach it
_ENCODER = msgspec.json.Encoder()
MAX_KEY_BYTES = 16 * 1024  # a larger key (say, kubectl's last-applied annotation) is not worth keeping


@dataclasses.dataclass(frozen=True)
class KeyRules:
    """What of the fields read no answer depends on, as the mutation knows it (webhook/cpupods.py)."""

    labels_read: Collection[str] = ()  # the pod labels an answer reads; the others are left out
    # A pod with none of these annotations whose containers ask only for resources `plain` accepts
    # is answered without reading an amount: its amounts are left out (their JSON types kept).
    device_annotations: Collection[str] = ()
    plain: Callable[[str], bool] | None = None
    plain_names: frozenset[str] = frozenset()  # names `plain` accepts, checked first (in C)
    # (annotation, value) by which a pod's GPU class need not follow its controller's (`Decoded.owner`)
    owner_opt_out: tuple[str, str] = ("", "")


class Decoded:
    """A body decoded by the typed pass: the answer's `key` and the request's `uid` at once, the
    document (re-encoded, read by orjson) only when asked for: an answer found by its key needs none."""

    def __init__(self, review: _Review, rules: KeyRules) -> None:
        self._review = review
        request = review.request
        self.uid = request.uid if isinstance(request, _Request) and isinstance(request.uid, str) else None
        self.key = _key(review, rules) if self.uid is not None else None  # None: not to be remembered
        self._rules = rules

    @property
    def owner(self) -> str:
        """The UID of the pod's controller, as webhook/pods.owner_of reads it from the document; not
        part of the key: the answers of one template serve every owner, their class choice taken
        again for each (webhook/classchoice.py)."""
        request = self._review.request
        pod = request.object if isinstance(request, _Request) else None
        metadata = pod.metadata if isinstance(pod, _Pod) else None
        if not isinstance(metadata, _Metadata) or not metadata.ownerReferences:
            return ""
        opt_out, value = self._rules.owner_opt_out
        if opt_out and isinstance(metadata.annotations, dict) and metadata.annotations.get(opt_out) == value:
            return ""
        for owner in metadata.ownerReferences:
            if owner is not None and owner.controller is True and isinstance(owner.uid, str):
                return owner.uid
        return ""

    def document(self) -> tuple[dict[str, Any], bool]:
        """(the fields read, as orjson decodes them; whether the pod's fields have the types
        `shape.check_pod` asks for)."""
        # Re-encoded and read by orjson, the few kept fields are exactly what orjson makes of them
        # (it turns integers beyond 64 bits into floats, msgspec keeps them). A Struct encodes as
        # an object, so the document is a dict.
        document: dict[str, Any] = orjson.loads(_ENCODER.encode(self._review))
        pod = self._review.request.object if isinstance(self._review.request, _Request) else None
        spec = (document["request"]["object"] or {}).get("spec") if isinstance(pod, _Pod) else None
        return document, shape.parts_kept_whole_pass(spec)

    def plain_requests(self) -> list[Any] | None:
        """Each container's `resources.requests` as decoded, where the containers alone say what
        the pod requests (no init containers, pod-level resources or overhead: most pods); else None."""
        request = self._review.request
        pod = request.object if isinstance(request, _Request) else None
        spec = pod.spec if isinstance(pod, _Pod) else None
        if not isinstance(spec, _Spec) or spec.initContainers or spec.resources or spec.overhead:
            return None
        return [
            c.resources.get("requests")
            for c in spec.containers or ()
            if c is not None and isinstance(c.resources, dict)
        ]

    def requests_spec(self) -> dict[str, Any]:
        """What of the pod's spec says what it requests (webhook/pods.requests reads it): each
        container's resources and restart policy, the pod-level resources and the overhead, as
        decoded, without the document (an answer found by its key needs no more)."""
        request = self._review.request
        pod = request.object if isinstance(request, _Request) else None
        spec = pod.spec if isinstance(pod, _Pod) else None
        if not isinstance(spec, _Spec):
            return {}
        kept: dict[str, Any] = {}
        for field in ("containers", "initContainers"):
            entries = getattr(spec, field)
            if entries:
                kept[field] = [_requests_of(container) for container in entries if container is not None]
        for field in ("resources", "overhead"):
            value = getattr(spec, field)
            if value is not _UNSET:
                kept[field] = value
        return kept


def _requests_of(container: _Container) -> dict[str, Any]:
    kept = {}
    if container.resources is not _UNSET:
        kept["resources"] = container.resources
    if container.restartPolicy is not _UNSET:
        kept["restartPolicy"] = container.restartPolicy
    return kept


def fields(body: bytes, *, rules: KeyRules = KeyRules()) -> Decoded | None:
    """The fields of the AdmissionReview `body` the webhook reads, or None: decode it whole."""
    # msgspec's nesting limit is Python's recursion limit (1000 by default: below orjson's), so what
    # it reads orjson reads too; only where the limit was raised must the brackets be counted.
    if sys.getrecursionlimit() >= _ORJSON_MAX_DEPTH and body.count(b"{") + body.count(b"[") > _ORJSON_MAX_DEPTH:
        return None
    if not body.isascii():
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    try:
        review = _DECODER.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None  # msgspec.ValidationError is a DecodeError
    return Decoded(review, rules)


def _key(review: _Review, rules: KeyRules) -> bytes | None:
    """`review` encoded without what no answer depends on: the request's uid, the pod's name and
    generateName, its labels but `rules.labels_read`, a device-less pod's amounts (set aside while
    encoding, then put back)."""
    request = review.request
    assert isinstance(request, _Request)
    pod = request.object if isinstance(request.object, _Pod) else None
    metadata = pod.metadata if pod is not None else None
    swapped = _without_amounts(pod, rules) if pod is not None and rules.plain is not None else ()
    owners = _without_owner_uids(pod) if pod is not None else ()
    uid, request.uid = request.uid, _UNSET
    if isinstance(metadata, _Metadata):
        kept = metadata.name, metadata.generateName, metadata.labels
        metadata.name = metadata.generateName = _UNSET
        if metadata.labels:
            metadata.labels = {name: metadata.labels[name] for name in rules.labels_read if name in metadata.labels}
        key = _ENCODER.encode(review)
        metadata.name, metadata.generateName, metadata.labels = kept
    else:
        key = _ENCODER.encode(review)
    request.uid = uid
    for container, resources in swapped:
        container.resources = resources
    for owner, owner_uid in owners:
        owner.uid = owner_uid
    return key if len(key) <= MAX_KEY_BYTES else None


def _without_owner_uids(pod: _Pod) -> list[tuple[_Owner, Any]]:
    """The owners' UIDs set aside, to put back (`Decoded.owner` reads them; no answer keys on them)."""
    metadata = pod.metadata
    if not isinstance(metadata, _Metadata) or not metadata.ownerReferences:
        return []
    kept = []
    for owner in metadata.ownerReferences:
        if owner is not None and owner.uid is not _UNSET:
            kept.append((owner, owner.uid))
            owner.uid = _UNSET
    return kept


def _without_amounts(pod: _Pod, rules: KeyRules) -> list[tuple[_Container, Any]]:
    """For a pod that asks for no device (no `rules.device_annotations`, only `rules.plain`
    resources), each container's resources swapped for a copy whose amounts are reduced to their
    JSON type ("" or 0: shape checks read no more of them); the containers with their own
    resources, to put back. Nothing swapped for any other pod. Runs for every CPU pod, so the
    common cases are checked first in C (`plain_names`, string amounts)."""
    metadata = pod.metadata
    annotations = metadata.annotations if isinstance(metadata, _Metadata) else None
    if annotations and not annotations.keys().isdisjoint(rules.device_annotations):
        return []
    spec = pod.spec
    if not isinstance(spec, _Spec):
        return []
    plain, names = rules.plain, rules.plain_names
    assert plain is not None
    owned: list[_Container] = []
    for entries in (spec.containers, spec.initContainers):
        for container in entries or ():
            if container is None or not container.resources:
                continue
            resources = container.resources
            if not isinstance(resources, dict):
                return []
            for part in ("requests", "limits"):
                amounts = resources.get(part)
                if not amounts:
                    continue
                if not isinstance(amounts, dict) or not (names.issuperset(amounts) or all(map(plain, amounts))):
                    return []
            owned.append(container)
    swapped = []
    for container in owned:
        resources = container.resources
        stripped = dict(resources)
        for part in ("requests", "limits"):
            amounts = resources.get(part)
            if amounts:
                stripped[part] = {
                    name: "" if value.__class__ is str else _type_only(value) for name, value in amounts.items()
                }
        swapped.append((container, resources))
        container.resources = stripped
    return swapped


def _type_only(amount: Any) -> Any:
    """An amount as far as any answer reads it: its JSON type (`shape` accepts strings and numbers)."""
    if isinstance(amount, str):
        return ""
    if isinstance(amount, (int, float)) and not isinstance(amount, bool):
        return 0
    return amount
