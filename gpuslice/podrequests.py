"""What kube-scheduler counts a pod as requesting, for everything in gpuslice that must agree
with it: the labeller's CPU and memory headroom, the webhook's class choice (does the pod's CPU
fit beside the GPUs of a class) and the pacer's ledger of our extended resources.

The rule, as Kubernetes 1.37 applies it (component-helpers' `PodRequests` with the scheduler's
default feature gates), per resource name:

- regular containers and sidecars (init containers with `restartPolicy: Always`) run together:
  their requests add up;
- an ordinary init container runs alone, beside the sidecars declared before it; the pod needs
  the larger of that peak and the running total;
- pod-level requests (`spec.resources.requests`, PodLevelResources, on by default since 1.34)
  replace the containers' figure for CPU, memory and hugepages;
- a pod on a node is counted at the larger of what it asks (spec), what kubelet allocated
  (`allocatedResources`) and what runs (`status...resources.requests`), so that an in-place
  resize counts at its larger side until kubelet has carried it out; a resize kubelet marked
  Infeasible counts only its allocated and running sides;
- the RuntimeClass overhead (`spec.overhead`) is added.

Not covered: resources a DRA claim adds to node allocatable (DRANodeAllocatableResources, alpha).
Pure: amounts are read by the caller's `read(name, value)` (a quantity parser in the caller's
units), so the webhook keeps its memoised integer parser and the node side the Kubernetes
client's Decimal one.

May import nothing from gpuslice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

__all__ = ["POD_LEVEL_RESOURCES", "container_total", "new_pod", "on_node"]

N = TypeVar("N", int, Decimal)
# The container's amounts of the names the caller counts (unreadable entries left out or 0).
ReadContainer = Callable[[Mapping[str, Any]], Mapping[str, N]]
# One quantity of the named resource, in the caller's units.
Read = Callable[[str, Any], N]

# Resources pod-level requests may set (hugepages-<size> too).
POD_LEVEL_RESOURCES = frozenset({"cpu", "memory"})


def _pod_level(name: str) -> bool:
    return name in POD_LEVEL_RESOURCES or name.startswith("hugepages-")


def _add(total: dict[str, N], amounts: Mapping[str, N]) -> None:
    for name, value in amounts.items():
        total[name] = total[name] + value if name in total else value


def _raise_to(total: dict[str, N], amounts: Mapping[str, N]) -> None:
    for name, value in amounts.items():
        if name not in total or value > total[name]:
            total[name] = value


def container_total(spec: Mapping[str, Any], read: ReadContainer[N]) -> dict[str, N]:
    """The containers' requests as the scheduler adds them up (sidecars included), `read`
    giving each container's amounts; null entries in the lists count nothing."""
    total: dict[str, N] = {}
    for container in spec.get("containers") or ():
        if isinstance(container, Mapping):
            _add(total, read(container))
    sidecars: dict[str, N] = {}
    init_peak: dict[str, N] = {}
    for container in spec.get("initContainers") or ():
        if not isinstance(container, Mapping):
            continue
        amounts = read(container)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs on beside everything after it
            _add(total, amounts)
            _add(sidecars, amounts)
            _raise_to(init_peak, sidecars)
        else:
            peak = dict(amounts)
            _add(peak, sidecars)
            _raise_to(init_peak, peak)
    _raise_to(total, init_peak)
    return total


def new_pod(
    spec: Mapping[str, Any], read_container: ReadContainer[N], read: Read[N], names: Collection[str]
) -> dict[str, N]:
    """What the scheduler counts for a pod not yet on a node (no status to read), of `names`: the
    containers' total, pod-level requests in its place, plus the overhead."""
    total = container_total(spec, read_container)
    _apply_pod_level(total, _pod_level_amounts(spec, read, names))
    _add(total, _read_list(spec.get("overhead"), read, names))
    return total


def on_node(pod: Mapping[str, Any], read: Read[N], names: Collection[str]) -> dict[str, N]:
    """What the scheduler counts for a pod bound to a node, of `names` (its status read: an
    in-place resize counts at its larger side until kubelet has carried it out)."""
    spec: Mapping[str, Any] = pod.get("spec") or {}
    status: Mapping[str, Any] = pod.get("status") or {}
    infeasible = _resize_infeasible(status)
    reported = (*(status.get("containerStatuses") or ()), *(status.get("initContainerStatuses") or ()))
    statuses = {str(entry.get("name")): entry for entry in reported if isinstance(entry, Mapping)}

    def spec_side(container: Mapping[str, Any]) -> Mapping[str, N]:
        return _read_list(_container_requests(container), read, names)

    def allocated_side(container: Mapping[str, Any]) -> Mapping[str, N]:
        allocated = (statuses.get(str(container.get("name"))) or {}).get("allocatedResources")
        if allocated is not None:
            return _read_list(allocated, read, names)
        return {} if infeasible else spec_side(container)

    def running_side(container: Mapping[str, Any]) -> Mapping[str, N]:
        resources = (statuses.get(str(container.get("name"))) or {}).get("resources") or {}
        if resources.get("requests") is not None:
            return _read_list(resources["requests"], read, names)
        return allocated_side(container)

    pod_allocated = status.get("allocatedResources")
    pod_running = (status.get("resources") or {}).get("requests")
    if pod_allocated is not None and pod_running is not None:  # kubelet's pod-level sums (1.36+)
        allocated, running = _read_list(pod_allocated, read, names), _read_list(pod_running, read, names)
    else:
        allocated, running = container_total(spec, allocated_side), container_total(spec, running_side)
    total: dict[str, N] = {} if infeasible else container_total(spec, spec_side)
    _raise_to(total, running)
    _raise_to(total, allocated)

    pod_level = _pod_level_amounts(spec, read, names)
    if pod_level and status.get("resources") is not None:
        pod_level = {} if infeasible else dict(pod_level)
        _raise_to(pod_level, _read_list(pod_running, read, names))
        _raise_to(pod_level, _read_list(pod_allocated, read, names))
    _apply_pod_level(total, pod_level)
    _add(total, _read_list(spec.get("overhead"), read, names))
    return total


def _container_requests(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return (container.get("resources") or {}).get("requests") or {}


def _read_list(amounts: Any, read: Read[N], names: Collection[str]) -> dict[str, N]:
    if not isinstance(amounts, Mapping):
        return {}
    return {name: read(name, value) for name, value in amounts.items() if name in names}


def _pod_level_amounts(spec: Mapping[str, Any], read: Read[N], names: Collection[str]) -> dict[str, N]:
    """The pod-level requests the scheduler applies, of `names`; empty unless one is set."""
    resources = spec.get("resources")
    requests = resources.get("requests") if isinstance(resources, Mapping) else None
    if not isinstance(requests, Mapping) or not any(_pod_level(str(name)) for name in requests):
        return {}
    return _read_list(requests, read, names)


def _apply_pod_level(total: dict[str, N], pod_level: Mapping[str, N]) -> None:
    for name, value in pod_level.items():
        if _pod_level(name):
            total[name] = value


def _resize_infeasible(status: Mapping[str, Any]) -> bool:
    conditions: Iterable[Any] = status.get("conditions") or ()
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False
