"""The conversion itself: a pod with KAI-style annotations in, an allow/deny outcome and a JSON
patch out. Pure and fast (the simulator calls it for every pod it places); no I/O, no clock.

Conversions (docs/webhook.md explains them for users):
  gpu-memory: "2000"            -> <prefix>/gpu-memory: ceil(2000 / unit) in requests and limits
  gpu-fraction: "0.5"           -> the same resource, floor(0.5 x the units of one GPU of the class
                                   chosen), pinned by required node affinity on <prefix>/gpu.memory-mib
  <prefix>/isolation: mig       -> <prefix>/mig-<smallest profile that holds the memory>: 1
  nvidia.com/gpu: N (convertWholeGpus, no annotations) -> N whole GPUs of units, pinned to a class
  no device asked for (steering.cpuPods) -> preferred node affinity for nodes without a free whole GPU
Bad input is denied with a message naming the annotation, the value and the accepted forms; a
denied pod gets no patch. A container that already carries a gpuslice resource is left alone,
so reinvocation never adds a second or conflicting conversion.

May import gpuslice.contract, gpuslice.config and the webhook's own pure modules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import decision as decision_
from gpuslice.webhook import dra_claims, parsing, steering, tolerations

__all__ = [
    "Outcome",
    "fraction_units",
    "json_pointer",
    "merge_node_affinity",
    "mutate",
    "parse_fraction",
    "parse_memory_mib",
]

KAI_SCHEDULER = "kai-scheduler"
DEFAULT_SCHEDULER = "default-scheduler"
ISOLATION_MIG = "mig"

KIND_MEMORY = "gpu-memory"
KIND_FRACTION = "gpu-fraction"
KIND_WHOLE_GPUS = "whole-gpus"
KIND_MIG = "mig"
KIND_CPU_POD = "cpu-pod"  # no conversion: a pod that asks for no device, given steering preferences

# What a pod may ask for and still count as asking for no device (hugepages-<size> too).
_PLAIN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the webhook answers for one pod."""

    allowed: bool
    patch: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    message: str = ""  # the denial reason, else ""
    decision: dict[str, Any] | None = None  # what was converted and why (also in the decision annotation)
    warnings: tuple[str, ...] = ()  # shown by kubectl; short
    kind: str = ""  # conversion kind for metrics ("" when nothing was converted)
    # DRA mode: objects the webhook creates before answering (the pod's ResourceClaimTemplate).
    objects: tuple[dict[str, Any], ...] = ()


_UNCHANGED = Outcome(allowed=True)


# Internal: the pod is refused with this message (parsing's errors are refusals too).
_Denied = parsing.Invalid


# --- parsing the annotations (webhook/parsing.py) --------------------------------------------


def parse_fraction(text: Any) -> float:
    """The gpu-fraction value, or _Denied naming what is wrong."""
    return parsing.fraction(f"annotation {contract_.KAI_GPU_FRACTION}", text)


def parse_memory_mib(text: Any) -> int:
    """The gpu-memory value in MiB (rounded up), or _Denied naming what is wrong."""
    return parsing.memory_mib(f"annotation {contract_.KAI_GPU_MEMORY}", text)


def _parse_num_devices(text: Any) -> int:
    name = f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}"
    forms = 'a positive integer, a GPU count such as "1"'
    value = parsing.count(name, text, forms=forms)
    if value == 0:
        raise _Denied(f"{name}={parsing.quote(text)} is not a positive integer; accepted: {forms}")
    return value


# --- reading the pod -----------------------------------------------------------------------


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(field, index, container) over containers then initContainers."""
    for field in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(field) or ()):
            if isinstance(container, Mapping):
                yield field, index, container


def _resource_maps(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    resources = container.get("resources") or {}
    return resources.get("requests") or {}, resources.get("limits") or {}


def _has_gpuslice_resource(container: Mapping[str, Any], contract: contract_.Contract) -> bool:
    requests, limits = _resource_maps(container)
    if not requests and not limits:
        return False
    memory, mig_prefix = contract.gpu_memory_resource, contract.mig_resource_prefix
    return any(name == memory or name.startswith(mig_prefix) for m in (requests, limits) for name in m)


def _nvidia_gpus(container: Mapping[str, Any]) -> Any:
    """The container's nvidia.com/gpu value (limits win, as the API server defaults requests from them)."""
    requests, limits = _resource_maps(container)
    return limits.get(contract_.NVIDIA_GPU, requests.get(contract_.NVIDIA_GPU))


def _gpu_count(value: Any, where: str) -> int:
    return parsing.count(f"{contract_.NVIDIA_GPU} of {where}", value, forms="a whole number of GPUs")


def _selected_products(spec: Mapping[str, Any], contract: contract_.Contract) -> frozenset[str] | None:
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


# --- choosing a GPU class ------------------------------------------------------------------


def _share_of(units: int, gpu_class: cluster_.GpuClass, contract: contract_.Contract) -> float:
    """`units` as a share of the class's whole capacity (0 for a class without capacity)."""
    capacity = gpu_class.gpus * contract.units_per_gpu(gpu_class.memory_mib)
    return units / capacity if capacity else 0.0


def _free_share_key(gpu_class: cluster_.GpuClass, contract: contract_.Contract) -> tuple[float, int, int]:
    # Largest free share first, then more GPUs, then the smaller GPU.
    return (-_share_of(gpu_class.free_units, gpu_class, contract), -gpu_class.gpus, gpu_class.memory_mib)


def _candidate_classes(cluster: cluster_.ClusterView, products: frozenset[str] | None) -> list[cluster_.GpuClass]:
    classes = cluster.classes()
    if products is None:
        return classes
    chosen = [c for c in classes if c.products & products]
    if classes and not chosen:
        known = ", ".join(sorted({p for c in classes for p in c.products})) or "none"
        raise _Denied(
            f"the pod selects GPU product {parsing.cut(', '.join(sorted(products)))}, but no gpuslice GPU node has it "
            f"(products known: {known})"
        )
    return chosen


def fraction_units(fraction: float, units_per_gpu: int) -> int:
    """Units for a share of one GPU: rounded down (at least one), so shares that add up to one
    GPU always fit on it (five pods of 0.2 share one GPU); a share of 1 is the whole GPU."""
    if fraction >= 1:
        return units_per_gpu
    return max(1, math.floor(fraction * units_per_gpu + 1e-9))


@dataclasses.dataclass(frozen=True)
class _Demand:
    """What the pod needs on one node, to judge which GPU class can run it now."""

    fraction: float = 0.0  # share of one GPU; 0 for whole GPUs
    whole_gpus: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def need(self, gpu_class: cluster_.GpuClass, contract: contract_.Contract) -> int:
        """Units on one GPU of the class (or whole GPUs) the pod needs there."""
        if self.whole_gpus:
            return self.whole_gpus
        return fraction_units(self.fraction, contract.units_per_gpu(gpu_class.memory_mib))


def _best_class(
    classes: Sequence[cluster_.GpuClass],
    contract: contract_.Contract,
    cluster: cluster_.ClusterView,
    demand: _Demand,
) -> tuple[cluster_.GpuClass, str]:
    """The class with the largest free share on nodes where the pod fits now (its units on one
    GPU, its CPU and memory beside them); when no node has room, the largest free share overall
    (the pod then waits for room in that class)."""
    if len(classes) == 1:
        return classes[0], "only class"
    units = cluster.usable_free_units(
        {c.memory_mib: demand.need(c, contract) for c in classes},
        whole_gpus=bool(demand.whole_gpus),
        cpu_milli=demand.cpu_milli,
        memory_request_mib=demand.memory_mib,
    )
    usable = {c.memory_mib: _share_of(units[c.memory_mib], c, contract) for c in classes}
    best = min(classes, key=lambda c: (-usable[c.memory_mib], *_free_share_key(c, contract)))
    if usable[best.memory_mib] > 0:
        return best, "largest free share on nodes where the pod fits now"
    return best, "largest free share (no node has room now)"


def _pod_requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory MiB) the scheduler counts for the pod: the larger of its regular
    containers' sum and its largest init container. Unreadable quantities count as 0: the API
    server validates them, and class choice is only a preference."""

    def of(container: Mapping[str, Any]) -> tuple[int, int]:
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu = parsing.request_quantity(requests.get("cpu", 0)) * 1000
        memory = parsing.request_quantity(requests.get("memory", 0)) / 2**20
        return int(cpu), int(memory)

    regular = [of(c) for c in spec.get("containers") or ()]
    init = [of(c) for c in spec.get("initContainers") or ()]
    cpu = max(sum(c for c, _ in regular), max((c for c, _ in init), default=0))
    mem = max(sum(m for _, m in regular), max((m for _, m in init), default=0))
    return cpu, mem


def _class_note(gpu_class: cluster_.GpuClass) -> dict[str, Any]:
    return {"classMemoryMiB": gpu_class.memory_mib, "products": sorted(gpu_class.products)}


# --- node affinity -------------------------------------------------------------------------


def merge_node_affinity(
    affinity: Mapping[str, Any] | None,
    required: Sequence[Mapping[str, Any]],
    preferred: Sequence[Mapping[str, Any]],
) -> dict[str, Any] | None:
    """The pod's affinity with `required` matchExpressions ANDed into every required
    nodeSelectorTerm (or forming the only one) and `preferred` terms appended; None when
    nothing changes. Expressions and terms already present are not added again."""
    if not required and not preferred:
        return None
    affinity = dict(affinity or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    changed = False
    if required:
        selector = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = [dict(t or {}) for t in selector.get("nodeSelectorTerms") or ()] or [{}]
        for term in terms:
            expressions = list(term.get("matchExpressions") or ())
            for expression in required:
                if expression not in expressions:
                    expressions.append(dict(expression))
                    changed = True
            term["matchExpressions"] = expressions
        selector["nodeSelectorTerms"] = terms
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = selector
    if preferred:
        existing = list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ())
        for preference in preferred:
            if preference not in existing:
                existing.append(dict(preference))
                changed = True
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = existing
    if not changed:
        return None
    affinity["nodeAffinity"] = node_affinity
    return affinity


# --- the patch -----------------------------------------------------------------------------


def json_pointer(*parts: str | int) -> str:
    """RFC 6901 pointer: "~" and "/" inside a part are escaped ("gpuslice.io/decision" -> "gpuslice.io~1decision")."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


@dataclasses.dataclass
class _Conversion:
    """Collected while converting one pod; turned into patch ops at the end."""

    kind: str
    resource: str
    container_units: dict[tuple[str, int], int]  # (field, index) -> units of `resource`
    decision: dict[str, Any]
    required: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    steering_request: steering.Request | None = None
    drop_nvidia_gpu: bool = True


def _container_resources(container: Mapping[str, Any], resource: str, units: int) -> dict[str, Any]:
    resources = dict(container.get("resources") or {})
    value = str(units)
    for part in ("requests", "limits"):
        entries = {k: v for k, v in (resources.get(part) or {}).items() if k != contract_.NVIDIA_GPU}
        entries[resource] = value  # extended resources: requests must equal limits
        resources[part] = entries
    return resources


def _build_patch(
    pod: Mapping[str, Any], conversion: _Conversion, settings: config.Config, contract: contract_.Contract
) -> tuple[list[dict[str, Any]], list[str]]:
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    patch: list[dict[str, Any]] = []
    warnings: list[str] = []
    for (field, index), units in conversion.container_units.items():
        container = spec[field][index]
        patch.append(
            {
                "op": "add",
                "path": f"/spec/{field}/{index}/resources",  # fixed names: nothing to escape
                "value": _container_resources(container, conversion.resource, units),
            }
        )

    current_scheduler = spec.get("schedulerName")
    scheduler = settings.scheduler_name or (DEFAULT_SCHEDULER if current_scheduler == KAI_SCHEDULER else "")
    if scheduler and scheduler != current_scheduler:
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler})
        conversion.decision["schedulerName"] = scheduler
        if current_scheduler:
            conversion.decision["schedulerNameWas"] = current_scheduler
        if current_scheduler == KAI_SCHEDULER:
            warnings.append(f"gpuslice: schedulerName {KAI_SCHEDULER} rewritten to {scheduler}")

    required = list(conversion.required)
    preferred: list[dict[str, Any]] = []
    if settings.steering.enabled and conversion.steering_request is not None:
        request = conversion.steering_request
        if not settings.steering.cpu_pods:
            # Keeping whole nodes free for the largest pods only pays when CPU-only pods keep off
            # them too; otherwise they land there and take the CPU (docs/steering.md, "Tuning").
            request = dataclasses.replace(request, largest_node_gpus=0)
        steer_required, steer_preferred = steering.placement_affinity(request, contract)
        required.extend(steer_required)
        preferred.extend(steer_preferred)
    affinity = merge_node_affinity(spec.get("affinity"), required, preferred)
    if affinity is not None:
        patch.append({"op": "add", "path": "/spec/affinity", "value": affinity})

    ops, notes = decision_.patch_ops(metadata, contract.decision_annotation, conversion.decision)
    return patch + ops, warnings + notes


# --- the conversions -----------------------------------------------------------------------


def _find_container(spec: Mapping[str, Any], name: str | None) -> tuple[str, int, Mapping[str, Any]]:
    """The container the share goes to: the one the annotation names; else the first container
    carrying KAI's nvidia.com/gpu placeholder (regular containers first, then init containers);
    else the first regular container. Going by the placeholder, not the position, keeps the share on
    the GPU container when another webhook inserts a sidecar in front of it."""
    if name is None:
        every = list(_containers(spec))  # regular containers first
        regular = [entry for entry in every if entry[0] == "containers"]
        if not regular:
            raise _Denied("the pod has no containers to give the GPU share to")
        for entry in every:
            if _nvidia_gpus(entry[2]) is not None:
                return entry
        return regular[0]
    containers = list(_containers(spec))
    for entry in containers:
        if entry[2].get("name") == name:
            return entry
    names = parsing.cut(", ".join(str(c.get("name")) for _, _, c in containers) or "none")
    raise _Denied(
        f"annotation {contract_.KAI_GPU_FRACTION_CONTAINER_NAME}={parsing.quote(name)} names no container of the pod "
        f"(containers: {names}); accepted: the name of one of them"
    )


def _check_placeholder(container: Mapping[str, Any], share_annotation: str) -> None:
    value = _nvidia_gpus(container)
    if value is None or str(value).strip() == "1":
        return
    raise _Denied(
        f"container {parsing.quote(container.get('name'))} requests {contract_.NVIDIA_GPU}: "
        f"{parsing.cut(str(value))} next to annotation "
        f"{share_annotation}: a share cannot be combined with whole GPUs; remove {contract_.NVIDIA_GPU} "
        "(a value of 1 is accepted as KAI's placeholder and removed)"
    )


def _memory_conversion(
    mib: int,
    cluster: cluster_.ClusterView,
    products: frozenset[str] | None,
    settings: config.Config,
    contract: contract_.Contract,
) -> tuple[int, list[dict[str, Any]], dict[str, Any], steering.Request]:
    """(units, required pin expressions, decision notes, steering request) for gpu-memory."""
    units = contract_.units_for_mib(mib, contract.unit_mib)
    classes = _candidate_classes(cluster, products)
    if not classes:
        largest = settings.default_gpu_memory_mib
        if units > contract.units_per_gpu(largest):
            raise _Denied(
                f"annotation {contract_.KAI_GPU_MEMORY}={mib} MiB is larger than any known GPU "
                f"(no GPU nodes seen; assumed {largest} MiB, defaultGpuMemoryMiB)"
            )
        return units, [], {"classMemoryMiB": None, "rule": "memory"}, steering.Request(units=units)
    fitting = [c for c in classes if contract.units_per_gpu(c.memory_mib) >= units]
    if not fitting:
        sizes = ", ".join(f"{c.memory_mib} MiB" for c in classes)
        raise _Denied(
            f"annotation {contract_.KAI_GPU_MEMORY}: {mib} MiB ({units} units of {contract.unit_mib} MiB) "
            f"is larger than any known GPU (GPU memory: {sizes}); accepted: at most "
            f"{max(contract.units_per_gpu(c.memory_mib) for c in classes) * contract.unit_mib} MiB"
        )
    required = []
    if len(fitting) < len(cluster.classes()):
        # Some GPUs are too small: keep the pod off their nodes even without steering labels.
        values = [str(c.memory_mib) for c in fitting]
        required.append({"key": contract.label_gpu_memory_mib, "operator": "In", "values": values})
    notes = {
        "classMemoryMiB": [c.memory_mib for c in fitting] if len(fitting) > 1 else fitting[0].memory_mib,
        "products": sorted({p for c in fitting for p in c.products}),
        "rule": "memory",
    }
    per_gpu = contract.units_per_gpu(fitting[0].memory_mib) if len(fitting) == 1 else 0
    largest = max(c.max_gpus_per_node for c in fitting)
    return units, required, notes, steering.Request(units=units, units_per_gpu=per_gpu, largest_node_gpus=largest)


def _fraction_basis(
    cluster: cluster_.ClusterView,
    products: frozenset[str] | None,
    settings: config.Config,
    contract: contract_.Contract,
    demand: _Demand,
) -> tuple[int, list[dict[str, Any]], dict[str, Any], int]:
    """(GPU memory a fraction is taken of, pin expressions, decision notes, GPUs of the class's
    largest node or 0)."""
    classes = _candidate_classes(cluster, products)
    if not classes:
        return (
            settings.default_gpu_memory_mib,
            [],
            {"classMemoryMiB": settings.default_gpu_memory_mib, "rule": "defaultGpuMemoryMiB (no GPU nodes seen)"},
            0,
        )
    best, rule = _best_class(classes, contract, cluster, demand)
    pin = {"key": contract.label_gpu_memory_mib, "operator": "In", "values": [str(best.memory_mib)]}
    return best.memory_mib, [pin], {**_class_note(best), "rule": rule}, best.max_gpus_per_node


def _annotated(
    pod: Mapping[str, Any],
    annotations: Mapping[str, Any],
    settings: config.Config,
    contract: contract_.Contract,
    cluster: cluster_.ClusterView,
) -> _Conversion | None:
    spec = pod.get("spec") or {}
    fraction_text = annotations.get(contract_.KAI_GPU_FRACTION)
    memory_text = annotations.get(contract_.KAI_GPU_MEMORY)
    devices_text = annotations.get(contract_.KAI_GPU_FRACTION_NUM_DEVICES)
    isolation = annotations.get(contract.isolation_annotation)

    if fraction_text is not None and memory_text is not None:
        raise _Denied(
            f"annotations {contract_.KAI_GPU_FRACTION}={parsing.quote(fraction_text)} and {contract_.KAI_GPU_MEMORY}="
            f"{parsing.quote(memory_text)} are both set; accepted: exactly one of them"
        )
    share = contract_.KAI_GPU_FRACTION if fraction_text is not None else contract_.KAI_GPU_MEMORY
    has_share = fraction_text is not None or memory_text is not None
    if devices_text is not None:
        if not has_share:
            raise _Denied(
                f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}={parsing.quote(devices_text)} needs a share: add "
                f"{contract_.KAI_GPU_FRACTION} or {contract_.KAI_GPU_MEMORY}"
            )
        if _parse_num_devices(devices_text) > 1:
            raise _Denied(
                f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}={parsing.quote(devices_text)} is not supported: "
                "kubelet "
                "tells the device plugin only which device IDs a container gets, so N shares on N distinct GPUs "
                "cannot be told from one request spilling across GPUs, and the plugin could not keep them apart; "
                f"use one pod per GPU share, or request whole GPUs with {contract_.NVIDIA_GPU}: N"
            )
    if isolation is not None and isolation != ISOLATION_MIG:
        raise _Denied(
            f"annotation {contract.isolation_annotation}={parsing.quote(isolation)} is not known; "
            f"accepted: {ISOLATION_MIG!r}"
        )
    if not has_share:
        if isolation is not None:
            raise _Denied(
                f"annotation {contract.isolation_annotation}={parsing.quote(isolation)} needs a share: add "
                f"{contract_.KAI_GPU_FRACTION} or {contract_.KAI_GPU_MEMORY}"
            )
        return None  # only gpu-fraction-container-name: nothing to convert

    if any(_has_gpuslice_resource(c, contract) for _, _, c in _containers(spec)):
        # Already converted (reinvocation, where the placeholder is gone and a sidecar may now come
        # first) or written by hand: leave the pod alone.
        return None
    field, index, container = _find_container(spec, annotations.get(contract_.KAI_GPU_FRACTION_CONTAINER_NAME))
    _check_placeholder(container, share)
    fraction = parse_fraction(fraction_text) if fraction_text is not None else None
    memory_mib = parse_memory_mib(memory_text) if memory_text is not None else None
    products = _selected_products(spec, contract)
    target = (field, index)
    base = {"container": container.get("name"), "annotation": share}

    if isolation == ISOLATION_MIG:
        if fraction is not None:
            demand = _Demand(fraction, 0, *_pod_requests(spec))
            try:
                basis, _, notes, _ = _fraction_basis(cluster, products, settings, contract, demand)
            except _Denied:  # a product only MIG-mode GPUs carry: no shared class to take it from
                basis, _, notes, _ = _fraction_basis(cluster, None, settings, contract, demand)
            need = math.ceil(fraction * basis - 1e-9)
            base.update(fraction=fraction, **notes)
        else:
            assert memory_mib is not None
            need = memory_mib
        profiles = cluster.mig_profiles()
        if not profiles:
            raise _Denied(
                f"annotation {contract.isolation_annotation}={parsing.quote(isolation)}: no MIG profile is known in "
                "the cluster "
                "(no node publishes MIG devices); remove the annotation to share a GPU by memory"
            )
        fitting = sorted((mib, profile) for profile, mib in profiles.items() if mib >= need)
        if not fitting:
            biggest = max(profiles.items(), key=lambda item: item[1])
            raise _Denied(
                f"annotation {share}: {need} MiB is larger than any MIG profile in the cluster "
                f"(largest: {biggest[0]} with {biggest[1]} MiB); accepted: at most {biggest[1]} MiB with "
                f"{contract.isolation_annotation}: {ISOLATION_MIG}"
            )
        mib, profile = fitting[0]
        resource = contract.mig_resource(profile)
        decision = {
            **base,
            "resource": resource,
            "units": 1,
            "memoryMiB": mib,
            "requestedMiB": need,
            "migProfile": profile,
            "rule": "smallest MIG profile that holds the request",
        }
        return _Conversion(
            KIND_MIG, resource, {target: 1}, decision, steering_request=steering.Request(mig_profile=profile)
        )

    resource = contract.gpu_memory_resource
    if memory_mib is not None:
        units, required, notes, request = _memory_conversion(memory_mib, cluster, products, settings, contract)
        decision = {
            **base,
            "resource": resource,
            "units": units,
            "memoryMiB": units * contract.unit_mib,
            "requestedMiB": memory_mib,
            **notes,
        }
        return _Conversion(KIND_MEMORY, resource, {target: units}, decision, required, request)

    assert fraction is not None
    basis, required, notes, largest = _fraction_basis(
        cluster, products, settings, contract, _Demand(fraction, 0, *_pod_requests(spec))
    )
    per_gpu = contract.units_per_gpu(basis)
    units = fraction_units(fraction, per_gpu)
    decision = {
        **base,
        "resource": resource,
        "units": units,
        "memoryMiB": units * contract.unit_mib,
        "fraction": fraction,
        **notes,
    }
    request = steering.Request(units=units, units_per_gpu=per_gpu, whole_gpus=fraction == 1, largest_node_gpus=largest)
    return _Conversion(KIND_FRACTION, resource, {target: units}, decision, required, request)


def _whole_gpus(
    pod: Mapping[str, Any], settings: config.Config, contract: contract_.Contract, cluster: cluster_.ClusterView
) -> _Conversion | None:
    spec = pod.get("spec") or {}
    counts: dict[tuple[str, int], int] = {}
    names: dict[str, int] = {}
    for field, index, container in _containers(spec):
        value = _nvidia_gpus(container)
        if value is None or _has_gpuslice_resource(container, contract):
            continue
        count = _gpu_count(value, f"container {parsing.quote(container.get('name'))}")
        if count:
            counts[(field, index)] = count
            names[str(container.get("name"))] = count
    if not counts:
        return None
    # Regular containers run together; init containers one at a time before them.
    regular = sum(n for (field, _), n in counts.items() if field == "containers")
    init = max((n for (field, _), n in counts.items() if field == "initContainers"), default=0)
    gpus = max(regular, init)
    classes = _candidate_classes(cluster, _selected_products(spec, contract))
    required: list[dict[str, Any]] = []
    if classes:
        fitting = [c for c in classes if c.max_gpus_per_node >= gpus]
        if not fitting:
            raise _Denied(
                f"{contract_.NVIDIA_GPU}: {gpus} GPUs in one pod, but no gpuslice node has that many "
                f"(most on one node: {max(c.max_gpus_per_node for c in classes)})"
            )
        best, rule = _best_class(fitting, contract, cluster, _Demand(0.0, gpus, *_pod_requests(spec)))
        memory, largest = best.memory_mib, best.max_gpus_per_node
        required.append({"key": contract.label_gpu_memory_mib, "operator": "In", "values": [str(memory)]})
        notes = {**_class_note(best), "rule": rule}
    else:
        memory, largest = settings.default_gpu_memory_mib, 0
        notes = {"classMemoryMiB": memory, "rule": "defaultGpuMemoryMiB (no GPU nodes seen)"}
    per_gpu = contract.units_per_gpu(memory)
    container_units = {key: n * per_gpu for key, n in counts.items()}
    resource = contract.gpu_memory_resource
    decision = {
        "containers": names,
        "resource": resource,
        "units": sum(container_units.values()),
        "memoryMiB": sum(container_units.values()) * contract.unit_mib,
        "gpus": gpus,
        **notes,
    }
    request = steering.Request(
        units=per_gpu, gpus=gpus, whole_gpus=True, units_per_gpu=per_gpu, largest_node_gpus=largest
    )
    return _Conversion(KIND_WHOLE_GPUS, resource, container_units, decision, required, request)


_TRIGGERS_STATIC = (
    contract_.KAI_GPU_FRACTION,
    contract_.KAI_GPU_MEMORY,
    contract_.KAI_GPU_FRACTION_NUM_DEVICES,
)


def _wants_conversion(annotations: Mapping[str, Any], isolation_key: str) -> bool:
    for key in _TRIGGERS_STATIC:
        if key in annotations:
            return True
    return isolation_key in annotations


def _asks_for_no_device(pod: Mapping[str, Any], contract: contract_.Contract) -> bool:
    """True for a pod the scheduler may place anywhere and that only competes for CPU and memory
    beside the GPUs: none of the annotations the webhook reads, no extended resource in any
    container, not pinned to a node (nodeName, DaemonSet), no node preferences of its own (they
    stay undiluted; this also makes reinvocation a no-op), and not opted out by label."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    if contract.isolation_annotation in annotations or any(k in annotations for k in contract_.KAI_ANNOTATIONS):
        return False
    if spec.get("nodeName") or (metadata.get("labels") or {}).get(contract.label_pod_cpu_steering) == "off":
        return False
    owners = metadata.get("ownerReferences") or ()
    if any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" for o in owners):
        return False
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    if node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"):
        return False
    for _, _, container in _containers(spec):
        for amounts in _resource_maps(container):
            if any(name not in _PLAIN_RESOURCES and not name.startswith("hugepages-") for name in amounts):
                return False
    return True


def _steer_cpu_pod(pod: Mapping[str, Any], settings: config.Config, contract: contract_.Contract) -> Outcome:
    """A pod that asks for no device: prefer nodes without a fully free GPU (steering.cpuPods)."""
    if not (settings.steering.enabled and settings.steering.cpu_pods) or not _asks_for_no_device(pod, contract):
        return _UNCHANGED
    affinity = merge_node_affinity((pod.get("spec") or {}).get("affinity"), (), steering.cpu_pod_preferences(contract))
    if affinity is None:
        return _UNCHANGED
    return Outcome(allowed=True, patch=[{"op": "add", "path": "/spec/affinity", "value": affinity}], kind=KIND_CPU_POD)


def _dra_steering(
    pod: Mapping[str, Any], conversion: _Conversion, settings: config.Config, contract: contract_.Contract
) -> list[dict[str, Any]]:
    """DRA mode: the allocator keeps every share on one GPU by itself but scores no node by what is
    left on it, so the steering's preferred terms (never its required ones, which exist for
    kubelet's sake in device-plugin mode) are what makes the stock scheduler pack."""
    if not settings.steering.enabled or conversion.steering_request is None:
        return []
    request = conversion.steering_request
    if not settings.steering.cpu_pods:
        request = dataclasses.replace(request, largest_node_gpus=0)  # as in _build_patch
    _, preferred = steering.placement_affinity(request, contract)
    affinity = merge_node_affinity((pod.get("spec") or {}).get("affinity"), (), preferred)
    return [] if affinity is None else [{"op": "add", "path": "/spec/affinity", "value": affinity}]


def mutate(pod: Mapping[str, Any], *, settings: config.Config, cluster: cluster_.ClusterView) -> Outcome:
    """Convert one pod (a Pod object as JSON) or say why it is refused."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    contract = settings.contract
    wants_conversion = _wants_conversion(annotations, contract.isolation_annotation)
    if settings.dra.enabled and dra_claims.already_converted(pod):
        return _UNCHANGED  # DRA mode, reinvoked: the pod references its claim already
    try:
        if wants_conversion:
            conversion = _annotated(pod, annotations, settings, contract, cluster)
        elif settings.convert_whole_gpus:
            conversion = _whole_gpus(pod, settings, contract, cluster)
        else:
            conversion = None
    except _Denied as denied:
        return Outcome(allowed=False, message=str(denied))
    if conversion is None:
        # Annotated but nothing to convert (already converted, container name only): leave it.
        return _UNCHANGED if wants_conversion else _steer_cpu_pod(pod, settings, contract)
    # The pod no longer requests nvidia.com/gpu, so Kubernetes adds no toleration for GPU taints.
    toleration_ops, added = tolerations.patch_ops(pod.get("spec") or {}, settings.converted_pod_tolerations)
    if added:
        conversion.decision["tolerationsAdded"] = added
    if settings.dra.enabled:  # DRA mode: a ResourceClaim instead of extended resources (docs/dra.md)
        need = dra_claims.need_from_conversion(conversion, contract, pod)
        claims = dra_claims.build(pod, need, settings, namespace=metadata.get("namespace") or "")
        objects = (claims.template,)
        patch = claims.patch + toleration_ops + _dra_steering(pod, conversion, settings, contract)
        return Outcome(True, patch, "", claims.decision, claims.warnings, conversion.kind, objects)
    patch, warnings = _build_patch(pod, conversion, settings, contract)
    return Outcome(
        allowed=True,
        patch=patch + toleration_ops,
        decision=conversion.decision,
        warnings=tuple(warnings),
        kind=conversion.kind,
    )
