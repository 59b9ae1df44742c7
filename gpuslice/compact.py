"""What the watches keep of a node or a pod: the fields gpuslice reads, in the object's own shape,
so that code reading a whole object reads a compact one the same way.

A node written by kubelet carries its image list, addresses and conditions; a pod its managed
fields, volumes, environment and container statuses. At 5,000 nodes and 100,000 pods those are
most of a list's size (docs/benchmarks.md, "Cluster scale"), and none of it steers a pod, so each
list page and watch event is cut down in the reading thread, before it is handed on
(gpuslice.listwatch, `ListWatch.keep`).

May import gpuslice.contract and msgspec only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import msgspec

from gpuslice import contract as contract_

__all__ = ["node", "pod", "pod_event", "pod_page"]

_NODE_STATUS = ("allocatable", "capacity")
_POD_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "labels")
# What the pacer's placement reads (gpuslice/affinity.py: nodeSelector, and of the affinity only the
# required node affinity, below) and what a pod holds (gpuslice.podrequests: containers, init
# containers and sidecars, overhead). The preferences our webhook writes are most of a converted
# pod's spec: nothing that watches reads them.
_POD_SPEC = ("nodeName", "schedulingGates", "priority", "nodeSelector", "overhead")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_CONTAINER = ("name", "resources", "restartPolicy")
_CONDITION = ("type", "status", "reason")


def _pick(obj: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: obj[key] for key in keys if key in obj}


def node(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A node's name, labels and resourceVersion, and its status's capacity and allocatable (what
    webhook/nodelabels.py checks the labels against and the pacer's ledger counts)."""
    metadata = obj.get("metadata") or {}
    status = obj.get("status")
    compact: dict[str, Any] = {"metadata": _pick(metadata, ("name", "labels", "resourceVersion"))}
    if isinstance(status, Mapping):
        compact["status"] = _pick(status, _NODE_STATUS)
    return compact


def pod(obj: Mapping[str, Any], contract: contract_.Contract) -> dict[str, Any]:
    """A pod's identity, owners and our annotations (`<prefix>/...`: the webhook's decision, the
    requeue count, the class a user allows); its placement fields and each container's name and
    resources; its required node affinity; its phase, reason and conditions' type, status and
    reason. Values are shared with `obj`, not copied: cut a parsed object nothing else holds."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    compact_metadata = _pick(metadata, _POD_METADATA)
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping):
        ours = f"{contract.prefix}/"
        compact_metadata["annotations"] = {k: v for k, v in annotations.items() if k.startswith(ours)}
    owners = metadata.get("ownerReferences")
    if isinstance(owners, list):
        compact_metadata["ownerReferences"] = [
            _pick(o, ("kind", "name", "uid", "controller")) for o in owners if isinstance(o, Mapping)
        ]
    compact_spec = _pick(spec, _POD_SPEC)
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(_REQUIRED)
    if required:
        compact_spec["affinity"] = {"nodeAffinity": {_REQUIRED: required}}
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        if isinstance(containers, list):
            compact_spec[field] = [_pick(c, _CONTAINER) for c in containers if isinstance(c, Mapping)]
    compact_status = _pick(status, ("phase", "reason"))
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        compact_status["conditions"] = [_pick(c, _CONDITION) for c in conditions if isinstance(c, Mapping)]
    return {"metadata": compact_metadata, "spec": compact_spec, "status": compact_status}


# --- reading a page or an event straight into compact objects -------------------------------------
# A typed decode (msgspec) reads only the fields below and skips the rest of the JSON without
# building it: the environments, volumes, managed fields and preferences that make up most of a
# pod's 9 KB as the API server sends it are never turned into Python objects. Parsing a page of
# 500 such pods whole takes about 100 ms of the reading thread, which holds the interpreter's lock.


# The shapes read, as TypedDicts: msgspec decodes them into plain dicts holding only these keys,
# in the object's own shape, and skips every other key without building it.


class _Owner(TypedDict, total=False):
    kind: str
    name: str
    uid: str
    controller: bool


class _PodMetadata(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[_Owner]


class _Container(TypedDict, total=False):
    name: str
    resources: dict[str, Any]  # requests and limits are maps, claims (DRA) a list
    restartPolicy: str


class _NodeAffinity(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: dict[str, Any]  # noqa: N815 - the API's name


class _Affinity(TypedDict, total=False):
    nodeAffinity: _NodeAffinity


class _PodSpec(TypedDict, total=False):
    nodeName: str
    schedulingGates: list[dict[str, Any]]
    priority: int
    nodeSelector: dict[str, str]
    affinity: _Affinity
    overhead: dict[str, Any]
    containers: list[_Container]
    initContainers: list[_Container]


class _Condition(TypedDict, total=False):
    type: str
    status: str
    reason: str


class _PodStatus(TypedDict, total=False):
    phase: str
    reason: str
    conditions: list[_Condition]


class _Pod(TypedDict, total=False):
    metadata: _PodMetadata
    spec: _PodSpec
    status: _PodStatus


_ListMetadata = TypedDict("_ListMetadata", {"resourceVersion": str, "continue": str}, total=False)


class _PodList(TypedDict, total=False):
    metadata: _ListMetadata
    items: list[_Pod]


class _PodEvent(msgspec.Struct):
    type: str = ""
    object: msgspec.Raw = msgspec.Raw()


_POD_LIST = msgspec.json.Decoder(_PodList)
_POD_EVENT = msgspec.json.Decoder(_PodEvent)
_POD = msgspec.json.Decoder(_Pod)


def pod_page(data: bytes) -> tuple[list[dict[str, Any]], str | None, str]:
    """A PodList as the API server sends it: (its pods, each with only the keys `pod` may keep, not
    yet cut further by it; the continue token; the list's resourceVersion). Raises ValueError when
    it is not a list of pods."""
    try:
        page = _POD_LIST.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a pod list: {exc}") from None
    metadata = page.get("metadata") or {}
    items: list[dict[str, Any]] = [dict(item) for item in page.get("items") or ()]
    return items, metadata.get("continue") or None, metadata.get("resourceVersion") or ""


def pod_event(line: bytes) -> tuple[str, dict[str, Any]]:
    """One line of a pod watch: (its type, its object: a pod with only the keys `pod` may keep, or
    for any other type, such as ERROR's Status or BOOKMARK's, the object whole). Raises ValueError
    when it is not a watch event."""
    try:
        event = _POD_EVENT.decode(line)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a watch event: {exc}") from None
    raw = event.object
    kind = event.type
    if not raw:
        return kind, {}
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        try:
            return kind, dict(_POD.decode(raw))
        except msgspec.DecodeError as exc:
            raise ValueError(f"not a pod: {exc}") from None
    whole = msgspec.json.decode(raw)
    return kind, whole if isinstance(whole, dict) else {}
