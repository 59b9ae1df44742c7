"""Pods, lists and watch frames in the API server's protobuf encoding, written with proto/kubeapi's
own messages and laid out as the API server lays them out (each object enveloped: the bytes "k8s",
a zero byte, a runtime.Unknown; each watch frame after its 4-byte length): for tests of
gpuslice.podwire and of the watches that read it."""

from __future__ import annotations

import calendar
import copy
import time
from typing import Any

from google.protobuf import json_format

from gpuslice.proto.kubeapi.v1 import api_pb2 as pb


def _seconds(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


def encode_pod(pod: dict[str, Any]) -> bytes:
    """The pod as the API server writes it in protobuf (without its envelope), with fields the
    decode does not know (as unknown fields) beside the ones it does."""
    body = copy.deepcopy(pod)
    metadata = body["metadata"]
    stamps = {k: metadata.pop(k) for k in ("creationTimestamp", "deletionTimestamp") if k in metadata}
    # a Quantity is a message holding its string
    spec = body.get("spec") or {}
    for quantities in [
        spec.get("overhead"),
        *(c.get("resources", {}).get(k) for c in spec.get("containers", []) for k in ("limits", "requests")),
    ]:
        for name, value in (quantities or {}).items():
            quantities[name] = {"string": value}
    message = json_format.ParseDict(body, pb.Pod())
    for key, stamp in stamps.items():
        getattr(message.metadata, key).seconds = _seconds(stamp)
    data = message.SerializeToString()
    # a field number pb.Pod does not declare, as an unknown field: 4 (length-delimited)
    return data + b"\x22\x03abc"


def envelope(kind: str, raw: bytes) -> bytes:
    return b"k8s\x00" + pb.Unknown(typeMeta=pb.TypeMeta(apiVersion="v1", kind=kind), raw=raw).SerializeToString()


def frame(event_type: str, kind: str, raw: bytes) -> bytes:
    event = pb.WatchEvent(type=event_type, object=pb.RawExtension(raw=envelope(kind, raw))).SerializeToString()
    return len(event).to_bytes(4, "big") + event


def pod_list(pods: list[dict[str, Any]], version: str, token: str = "") -> bytes:
    """A PodList page, enveloped."""
    page = pb.PodList(items=[pb.Pod.FromString(encode_pod(p)) for p in pods])
    page.metadata.resourceVersion = version
    if token:
        setattr(page.metadata, "continue", token)  # a Python keyword
    return envelope("PodList", page.SerializeToString())


def bookmark(version: str, initial_events_end: bool = True) -> bytes:
    """The BOOKMARK frame that ends a streamed list."""
    pod = pb.Pod()
    pod.metadata.resourceVersion = version
    if initial_events_end:
        pod.metadata.annotations["k8s.io/initial-events-end"] = "true"
    return frame("BOOKMARK", "Pod", pod.SerializeToString())
