"""Pods in the API server's protobuf encoding, read into the dictionaries the JSON path makes.

A cluster-wide pod list is the largest thing gpuslice reads: at 100,000 pods the API server spends
35-44 s of CPU encoding them as JSON (978 MB), on the cores the pacer needs too. Asked for
protobuf, it sends the same pods for 7-9 s of CPU in 693 MB (docs/benchmarks.md, "Cluster
scale"). The messages of proto/kubeapi/v1 hold only the fields gpuslice.compact keeps; the decoder
(upb, in C) skips every other field without building it, and each pod becomes the dictionary
`compact.pod_page` / `compact.pod_event` would make of its JSON, so what reads it cannot tell the
two apart.

The wire: a list or an object is the 4 bytes "k8s\\0" and a runtime.Unknown holding its kind and
its bytes; a watch stream is frames, each a 4-byte big-endian length and a WatchEvent whose
object is such an envelope.

May import gpuslice.proto only.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable
from typing import Any

from google.protobuf.message import DecodeError

from gpuslice.proto.kubeapi.v1 import api_pb2 as pb

__all__ = ["ACCEPT_LIST", "ACCEPT_WATCH", "is_protobuf", "pod_event", "pod_page", "frames"]

# What to ask for: protobuf, else JSON (an API server or proxy that cannot encode protobuf answers
# JSON, and the response's Content-Type says which came).
ACCEPT_LIST = "application/vnd.kubernetes.protobuf, application/json"
ACCEPT_WATCH = "application/vnd.kubernetes.protobuf;stream=watch, application/json;stream=watch"
_MAGIC = b"k8s\x00"
_MAX_FRAME = 64 << 20  # far above any pod (etcd stores objects of at most 1.5 MiB)


def is_protobuf(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip() == "application/vnd.kubernetes.protobuf"


def _unwrap(data: bytes) -> tuple[str, bytes]:
    """(kind, bytes) of an enveloped object."""
    if not data.startswith(_MAGIC):
        raise ValueError("not a protobuf object (no k8s envelope)")
    try:
        unknown = pb.Unknown.FromString(data[len(_MAGIC) :])
    except DecodeError as exc:
        raise ValueError(f"not a protobuf object: {exc}") from None
    return unknown.typeMeta.kind, unknown.raw


def _time(value: pb.Time) -> str:
    # as the API's JSON writes a time: RFC 3339, UTC, whole seconds
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value.seconds))


def _quantities(values: Any) -> dict[str, str]:
    return {name: quantity.string for name, quantity in values.items()}


def _container(container: pb.Container) -> dict[str, Any]:
    out: dict[str, Any] = {"name": container.name}
    if container.HasField("resources"):
        resources = container.resources
        kept: dict[str, Any] = {}
        if resources.limits:
            kept["limits"] = _quantities(resources.limits)
        if resources.requests:
            kept["requests"] = _quantities(resources.requests)
        if resources.claims:
            kept["claims"] = [
                {"name": c.name, **({"request": c.request} if c.request else {})} for c in resources.claims
            ]
        out["resources"] = kept
    if container.HasField("restartPolicy"):
        out["restartPolicy"] = container.restartPolicy
    return out


def _requirements(requirements: Iterable[pb.NodeSelectorRequirement]) -> list[dict[str, Any]]:
    out = []
    for r in requirements:
        requirement: dict[str, Any] = {"key": r.key, "operator": r.operator}
        if r.values:
            requirement["values"] = list(r.values)
        out.append(requirement)
    return out


def _required_affinity(spec: pb.PodSpec) -> dict[str, Any] | None:
    if not spec.HasField("affinity") or not spec.affinity.nodeAffinity.HasField(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ):
        return None
    terms = []
    for term in spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms:
        kept: dict[str, Any] = {}
        if term.matchExpressions:
            kept["matchExpressions"] = _requirements(term.matchExpressions)
        if term.matchFields:
            kept["matchFields"] = _requirements(term.matchFields)
        terms.append(kept)
    return {"nodeSelectorTerms": terms}


def _pod(pod: pb.Pod) -> dict[str, Any]:
    """The pod as compact's typed JSON decode makes it: the same keys, present where the JSON has them."""
    meta = pod.metadata
    metadata: dict[str, Any] = {}
    for key in ("name", "namespace", "uid", "resourceVersion"):
        if value := getattr(meta, key):
            metadata[key] = value
    if meta.creationTimestamp.seconds:  # unset is the zero time, which the JSON writes as null
        metadata["creationTimestamp"] = _time(meta.creationTimestamp)
    if meta.HasField("deletionTimestamp"):
        metadata["deletionTimestamp"] = _time(meta.deletionTimestamp)
    if meta.labels:
        metadata["labels"] = dict(meta.labels)
    if meta.annotations:
        metadata["annotations"] = dict(meta.annotations)
    if meta.ownerReferences:
        owners = []
        for o in meta.ownerReferences:
            owner: dict[str, Any] = {"kind": o.kind, "name": o.name, "uid": o.uid}
            if o.HasField("controller"):
                owner["controller"] = o.controller
            owners.append(owner)
        metadata["ownerReferences"] = owners
    s = pod.spec
    spec: dict[str, Any] = {}
    if s.nodeName:
        spec["nodeName"] = s.nodeName
    if s.schedulingGates:
        spec["schedulingGates"] = [{"name": gate.name} for gate in s.schedulingGates]
    if s.HasField("priority"):
        spec["priority"] = s.priority
    if s.nodeSelector:
        spec["nodeSelector"] = dict(s.nodeSelector)
    if (required := _required_affinity(s)) is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    if s.overhead:
        spec["overhead"] = _quantities(s.overhead)
    if s.containers:
        spec["containers"] = [_container(c) for c in s.containers]
    if s.initContainers:
        spec["initContainers"] = [_container(c) for c in s.initContainers]
    st = pod.status
    status: dict[str, Any] = {}
    if st.phase:
        status["phase"] = st.phase
    if st.reason:
        status["reason"] = st.reason
    if st.conditions:
        conditions = []
        for c in st.conditions:
            condition = {"type": c.type, "status": c.status}
            if c.reason:
                condition["reason"] = c.reason
            conditions.append(condition)
        status["conditions"] = conditions
    return {"metadata": metadata, "spec": spec, "status": status}


def pod_page(data: bytes) -> tuple[list[dict[str, Any]], str | None, str]:
    """A PodList in protobuf: (its pods as `compact.pod_page` gives them, the continue token, the
    list's resourceVersion). Raises ValueError when it is not a list of pods."""
    kind, raw = _unwrap(data)
    if kind != "PodList":
        raise ValueError(f"not a pod list: a {kind or 'nameless kind'}")
    try:
        page = pb.PodList.FromString(raw)
    except DecodeError as exc:
        raise ValueError(f"not a pod list: {exc}") from None
    token = getattr(page.metadata, "continue")  # a Python keyword
    return [_pod(item) for item in page.items], token or None, page.metadata.resourceVersion


def pod_event(frame: bytes) -> tuple[str, dict[str, Any]]:
    """One frame of a pod watch in protobuf: (its type, its object: a pod as `compact.pod_event`
    gives it, or for an ERROR the Status's code, reason and message). Raises ValueError when it is
    not a watch event."""
    try:
        event = pb.WatchEvent.FromString(frame)
    except DecodeError as exc:
        raise ValueError(f"not a watch event: {exc}") from None
    if not event.object.raw:
        return event.type, {}
    kind, raw = _unwrap(event.object.raw)
    try:
        if kind == "Pod":
            return event.type, _pod(pb.Pod.FromString(raw))
        if kind == "Status":
            status = pb.Status.FromString(raw)
            return event.type, {
                "kind": "Status",
                "status": status.status,
                "code": status.code,
                "reason": status.reason,
                "message": status.message,
            }
    except DecodeError as exc:
        raise ValueError(f"not a {kind}: {exc}") from None
    raise ValueError(f"a watch event of a {kind or 'nameless kind'}, not a pod")


def frames(chunks: Iterable[bytes]) -> Generator[bytes]:
    """The frames of a protobuf watch stream, from its bytes as they come (any chunking)."""
    buffer = bytearray()
    start = 0
    for chunk in chunks:
        if start:
            del buffer[:start]
            start = 0
        buffer += chunk
        while len(buffer) - start >= 4:
            size = int.from_bytes(buffer[start : start + 4], "big")
            if size > _MAX_FRAME:
                raise ValueError(f"a watch frame of {size} bytes: not a protobuf watch stream")
            end = start + 4 + size
            if end > len(buffer):
                break
            yield bytes(buffer[start + 4 : end])
            start = end
    if len(buffer) > start:
        raise ValueError(f"the watch stream ended inside a frame ({len(buffer) - start} bytes left)")
