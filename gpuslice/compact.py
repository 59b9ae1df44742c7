"""What the watches keep of a node or a pod: the fields gpuslice reads, in the object's own shape,
so that code reading a whole object reads a compact one the same way.

A node written by kubelet carries its image list, addresses and conditions; a pod its managed
fields, volumes, environment and container statuses. At 5,000 nodes and 100,000 pods those are
most of a list's size (docs/benchmarks.md, "Cluster scale"), and none of it steers a pod, so each
list page and watch event is cut down in the reading thread, before it is handed on
(gpuslice.listwatch, `ListWatch.keep`).

May import gpuslice.contract only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice import contract as contract_

__all__ = ["node", "pod"]

_NODE_STATUS = ("allocatable", "capacity")
_POD_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "labels")
# What the pacer's placement reads (pacer/selection.py: nodeSelector, and of the affinity only the
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
