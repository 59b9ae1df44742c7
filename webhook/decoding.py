"""The AdmissionReview fields the webhook reads, decoded in one typed pass (msgspec) that skips
the rest of the pod (env, volumes, probes, managedFields: most of its 5-20 KB) without building
Python objects for it. Pure; no I/O.

`fields(body)` gives the document as orjson decodes it, with only the keys the webhook reads
(admission, shape, mutation and its steps: the types below), or None when the typed pass cannot
promise that; the caller then decodes the whole body with orjson, which also words the errors.
So what is unusual takes the old path and gets the old answer: a field named below with another
JSON type (a string where an object belongs), a body that is not UTF-8 (msgspec does not check
the strings it skips, so it is checked here), JSON nested deeper than msgspec goes, or not JSON.
The kept fields are encoded again and read by orjson (a few hundred bytes), so their values are
exactly orjson's: it reads an integer beyond 64 bits as a float, msgspec as an int. Explicit nulls
stay None and absent keys stay absent.

One leniency, for input kube-apiserver cannot send (a Pod's numbers are 32- and 64-bit integers):
a number beyond a double's range (1e999) in a field the webhook does not read is skipped, where
orjson refuses the whole body.

May import msgspec and orjson only.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

__all__ = ["fields"]

_UNSET: Any = msgspec.UNSET


class _Container(msgspec.Struct):
    name: Any = _UNSET
    resources: Any = _UNSET  # kept whole: the patch rewrites it


class _Metadata(msgspec.Struct):
    name: Any = _UNSET
    generateName: Any = _UNSET
    namespace: Any = _UNSET
    annotations: Any = _UNSET
    labels: Any = _UNSET
    ownerReferences: Any = _UNSET


class _Spec(msgspec.Struct):
    containers: list[_Container | None] | None = _UNSET
    initContainers: list[_Container | None] | None = _UNSET
    nodeSelector: Any = _UNSET
    nodeName: Any = _UNSET
    schedulerName: Any = _UNSET
    affinity: Any = _UNSET  # kept whole: the patch rewrites it
    tolerations: Any = _UNSET
    resourceClaims: Any = _UNSET


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
_ENCODER = msgspec.json.Encoder()


def fields(body: bytes) -> dict[str, Any] | None:
    """The fields of the AdmissionReview `body` the webhook reads, or None (decode it whole)."""
    if not body.isascii():
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    try:
        review = _DECODER.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None  # msgspec.ValidationError is a DecodeError
    # Re-encoded and read by orjson, the few kept fields are exactly what orjson makes of them
    # (it turns integers beyond 64 bits into floats, msgspec keeps them).
    document = orjson.loads(_ENCODER.encode(review))
    return document if isinstance(document, dict) else None
