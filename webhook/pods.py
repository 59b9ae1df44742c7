"""Reading the parts of a pod the conversion looks at: its containers and their resource maps,
the GPU products it selects itself, and the CPU and memory the scheduler counts for it. Pure.

May import gpuslice.{contract,podrequests,quantity} and the webhook's parsing module.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice import podrequests, quantity
from gpuslice.webhook import parsing

__all__ = [
    "containers",
    "cpu_requested",
    "gpu_count",
    "has_gpuslice_resource",
    "nvidia_gpus",
    "owner_of",
    "requests",
    "resource_maps",
    "selected_products",
]


def containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(field, index, container) over containers then initContainers."""
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or ()):
            if isinstance(container, Mapping):
                yield field, index, container


def resource_maps(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """(requests, limits) of a container, empty where absent."""
    resources = container.get("resources") or {}
    return resources.get("requests") or {}, resources.get("limits") or {}


def has_gpuslice_resource(container: Mapping[str, Any], contract: contract_.Contract) -> bool:
    """The container already asks for gpuslice GPU memory or a MIG device (converted, or by hand)."""
    requests, limits = resource_maps(container)
    if not requests and not limits:
        return False
    memory, mig_prefix = contract.gpu_memory_resource, contract.mig_resource_prefix
    for amounts in (requests, limits):  # loops, not a generator: this runs for every container
        for name in amounts:
            if name == memory or name.startswith(mig_prefix):
                return True
    return False


def owner_of(metadata: Mapping[str, Any], contract: contract_.Contract) -> str:
    """The UID of the controller that made the pod (ReplicaSet, Job, StatefulSet...), whose pods go
    to one GPU class; "" for a bare pod, or one whose `<prefix>/gpu-class: any` lets it take any."""
    owners = metadata.get("ownerReferences")
    if not owners:
        return ""
    annotations = metadata.get("annotations") or {}
    if annotations.get(contract.gpu_class_annotation) == contract_.GPU_CLASS_ANY:
        return ""
    for owner in owners:
        # dict, not Mapping: this runs for every admission, and an ABC check costs a microsecond
        if isinstance(owner, dict) and owner.get("controller") is True and isinstance(owner.get("uid"), str):
            return str(owner["uid"])
    return ""


def nvidia_gpus(container: Mapping[str, Any]) -> Any:
    """The container's nvidia.com/gpu value (limits win, as the API server defaults requests from them)."""
    requests, limits = resource_maps(container)
    return limits.get(contract_.NVIDIA_GPU, requests.get(contract_.NVIDIA_GPU))


def gpu_count(value: Any, where: str) -> int:
    """An nvidia.com/gpu value as a count, or parsing.Invalid naming `where` it was written."""
    return parsing.count(f"{contract_.NVIDIA_GPU} of {where}", value, forms="a whole number of GPUs")


def selected_products(spec: Mapping[str, Any], contract: contract_.Contract) -> frozenset[str] | None:
    """GPU products the pod itself selects (nodeSelector and required node affinity), else None."""
    keys = (contract.label_gpu_product, contract_.NVIDIA_GPU_PRODUCT_LABEL)
    chosen: list[set[str]] = []
    node_selector = spec.get("nodeSelector") or {}
    from_selector = {str(node_selector[k]) for k in keys if k in node_selector}
    if from_selector:
        chosen.append(from_selector)
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    terms = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or ()
    from_terms: set[str] = set()
    for term in terms:
        for expression in (term or {}).get("matchExpressions") or ():
            if expression.get("key") in keys and expression.get("operator") == "In":
                from_terms.update(str(v) for v in expression.get("values") or ())
    if from_terms:
        chosen.append(from_terms)
    if not chosen:
        return None
    products = set.intersection(*chosen)
    return frozenset(contract_.label_value(p) for p in products)


def requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory MiB) the scheduler counts for the pod (gpuslice.podrequests: sidecars,
    pod-level requests, overhead). Unreadable quantities count as 0: the API server validates them,
    and class choice is only a preference."""
    if _containers_only(spec):
        # Containers alone (most pods): their sum, as podrequests adds them, at a third of the cost.
        cpu = memory = 0
        for container in spec.get("containers") or ():
            if isinstance(container, Mapping):
                amounts = _container_requests(container)
                cpu, memory = cpu + amounts["cpu"], memory + amounts["memory"]
        return cpu, memory
    counted = podrequests.new_pod(spec, _container_requests, _read, _COUNTED)
    return counted.get("cpu", 0), counted.get("memory", 0)


_COUNTED = frozenset({"cpu", "memory"})


def _containers_only(spec: Mapping[str, Any]) -> bool:
    """No init containers, pod-level requests or overhead: the containers' sum is the whole rule."""
    return not (spec.get("initContainers") or spec.get("resources") or spec.get("overhead"))


def cpu_requested(spec: Mapping[str, Any]) -> int:
    """The CPU millicores of `requests`, without the memo: for pods whose amounts never repeat."""
    if _containers_only(spec):
        return sum(_container_cpu(c)["cpu"] for c in spec.get("containers") or () if isinstance(c, Mapping))
    return podrequests.new_pod(spec, _container_cpu, _read_cpu, _CPU).get("cpu", 0)


_CPU = frozenset({"cpu"})


def _container_cpu(container: Mapping[str, Any]) -> dict[str, int]:
    amounts = (container.get("resources") or {}).get("requests") or {}
    return {"cpu": parsing.cpu_milli(amounts.get("cpu", 0))}


def _read_cpu(name: str, value: Any) -> int:
    return parsing.cpu_milli(value)


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    amounts = (container.get("resources") or {}).get("requests") or {}
    cpu, memory = amounts.get("cpu", 0), amounts.get("memory", 0)
    try:
        cpu_milli, memory_mib = _amounts(cpu, memory)
    except TypeError:  # not hashable: read it without the memo (it comes to 0)
        cpu_milli, memory_mib = _amounts.__wrapped__(cpu, memory)
    return {"cpu": cpu_milli, "memory": memory_mib}


def _read(name: str, value: Any) -> int:
    """One CPU or memory quantity (a container's, pod-level, overhead) in the units of `requests`."""
    amount = parsing.request_quantity(value)
    return int(amount * 1000) if name == "cpu" else quantity.mib_down(amount)


# Pods repeat a handful of request pairs ("4", "16Gi"); the Decimal arithmetic costs more than a lookup.
# typed: True and 1 are different keys (a boolean request counts as 0).
@functools.lru_cache(maxsize=4096, typed=True)
def _amounts(cpu: Any, memory: Any) -> tuple[int, int]:
    """(CPU millicores, memory MiB) of one container's CPU and memory requests."""
    return _read("cpu", cpu), _read("memory", memory)
