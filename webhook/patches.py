"""Building the JSON patch of a converted pod (device-plugin mode): each converted container's
requests and limits, the scheduler name, the node affinity (the class pin ANDed into the pod's
own required terms, the steering terms added; `affinity_ops`, which DRA mode uses too), the
pacer's scheduling gate when pacing is on and a pacer is alive, and the decision annotation. Pure.

May import gpuslice.{config,contract,labelcodec} and the webhook's conversions, decision and steering modules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice import config, labelcodec
from gpuslice import contract as contract_
from gpuslice.webhook import conversions, steering
from gpuslice.webhook import decision as decision_

__all__ = [
    "DEFAULT_SCHEDULER",
    "KAI_SCHEDULER",
    "build",
    "affinity_ops",
    "gate_ops",
    "json_pointer",
    "merge_node_affinity",
    "merge_node_affinity_any_of",
    "scheduler_ops",
]

KAI_SCHEDULER = "kai-scheduler"
DEFAULT_SCHEDULER = "default-scheduler"


def build(
    pod: Mapping[str, Any], conversion: conversions.Conversion, settings: config.Config, *, pacer_absent: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """(patch ops, warnings for kubectl) for `conversion`; notes what it changed in its decision.
    With pacing on the pod is gated while a pacer is alive (`pacer_absent` ""); else the decision
    says why it is not (`notGated`)."""
    contract = settings.contract
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
                "value": _container_resources(container, conversion.resource, units, conversion.replaces),
            }
        )

    scheduler_patch, scheduler_warnings = scheduler_ops(spec, settings, conversion.decision)
    patch += scheduler_patch
    warnings += scheduler_warnings

    patch += affinity_ops(spec, conversion, settings)

    gate = gate_ops(spec, settings, pacer_absent=pacer_absent)
    if gate:
        patch += gate
        conversion.decision["gated"] = contract.pacing_gate
    elif settings.pacing.enabled and pacer_absent:
        conversion.decision["notGated"] = pacer_absent

    ops, notes = decision_.patch_ops(metadata, contract.decision_annotation, conversion.decision)
    return patch + ops, warnings + notes


def gate_ops(spec: Mapping[str, Any], settings: config.Config, *, pacer_absent: str) -> list[dict[str, Any]]:
    """The pacer's scheduling gate added to the pod's, with pacing on in device-plugin mode while a
    pacer is alive (`pacer_absent` ""); none when the pod has it already (reinvocation), and none
    for a pod that names its node, which the API server would refuse with a gate."""
    if not settings.pacing.enabled or settings.dra.enabled or pacer_absent or spec.get("nodeName"):
        return []
    gate = settings.contract.pacing_gate
    gates = spec.get("schedulingGates")
    if gates is not None and not isinstance(gates, list):
        return []  # not a list: kube-apiserver cannot send it; nothing safe to add to
    if not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]}]
    if any(isinstance(g, Mapping) and g.get("name") == gate for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}}]


def scheduler_ops(
    spec: Mapping[str, Any], settings: config.Config, decision: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The scheduler a converted pod goes to: `schedulerName` from the configuration, else the
    default scheduler instead of KAI's (which would not place the converted resources). Noted in
    `decision`; (patch ops, warnings)."""
    current = spec.get("schedulerName")
    scheduler = settings.scheduler_name or (DEFAULT_SCHEDULER if current == KAI_SCHEDULER else "")
    if not scheduler or scheduler == current:
        return [], []
    decision["schedulerName"] = scheduler
    if current:
        decision["schedulerNameWas"] = current
    warnings = [f"gpuslice: schedulerName {KAI_SCHEDULER} rewritten to {scheduler}"] if current == KAI_SCHEDULER else []
    return [{"op": "add", "path": "/spec/schedulerName", "value": scheduler}], warnings


def affinity_ops(
    spec: Mapping[str, Any], conversion: conversions.Conversion, settings: config.Config
) -> list[dict[str, Any]]:
    """The pod's node affinity: the GPU-class pin and the steering's required expressions ANDed
    into its own required terms, the steering's preferred terms added; no op when nothing changes.

    The same in DRA mode, where the allocator keeps every share on one GPU by itself but scores no
    node by what is left on it: the preferred terms are what makes the stock scheduler pack, and
    the required ones are there for the scheduler's sake rather than kubelet's: the NodeAffinity
    filter keeps the pod off the nodes that cannot take it before the DRA allocator evaluates each
    of their devices, which it would do for every pod at every retry (docs/dra.md, "Scheduling
    cost"). Labels that lag allocations are optimistic (the allocator still decides); labels that
    lag a release keep a pod waiting until the plugin relabels its node, which requeues it. Two
    exceptions there: whole GPUs carry their class as their claim's first alternative, not a pin;
    a MIG slice-else-share keeps no required term (a node with no slice free takes the share); a
    fraction that may take other classes (`Conversion.other_classes`) gets one required term per
    class of its list (the first class's, then `_fallback_terms`; the preferred terms are its first
    class's: the pod packs there, and goes elsewhere when that class has no room)."""
    required, preferred = _steering_terms(conversion, settings)
    pin: Sequence[Mapping[str, Any]] = conversion.required
    if settings.dra.enabled:
        if conversion.decision.get("orShareMiB"):
            pin, required = (), []
        elif conversion.kind == conversions.KIND_WHOLE_GPUS:
            pin = ()
        elif conversion.other_classes:
            chosen: list[Mapping[str, Any]] = [*pin, *required]
            alternatives: list[Sequence[Mapping[str, Any]]] = [chosen, *_fallback_terms(conversion, settings)]
            every = merge_node_affinity_any_of(spec.get("affinity"), alternatives, preferred)
            return [{"op": "add", "path": "/spec/affinity", "value": every}]
    affinity = merge_node_affinity(spec.get("affinity"), [*pin, *required], preferred)
    return [] if affinity is None else [{"op": "add", "path": "/spec/affinity", "value": affinity}]


def _fallback_terms(conversion: conversions.Conversion, settings: config.Config) -> list[list[dict[str, Any]]]:
    """The required expressions of each class a fraction may fall back to: the class, room for its
    share there, and, for a pod that asks CPU, a node whose free GPUs have at least the CPU the pod
    asks per GPU. The webhook lists a class only where its free GPUs have that much on average
    (`Inputs.classes_with_cpu`); a class mixes nodes of several CPU sizes, and a CPU-hungry share
    on a node with little CPU per GPU takes the CPU its other GPUs need, which then stay idle."""
    contract = settings.contract
    request = conversion.steering_request
    cpu_per_gpu: list[dict[str, Any]] = []
    if request is not None and request.cpu_milli > 0:
        asked = math.ceil(request.cpu_milli / float(conversion.decision["fraction"]))
        label = contract.label_cpu_per_free_gpu_milli
        cpu_per_gpu = [{"key": label, "operator": "Gt", "values": [labelcodec.count_value(asked - 1)]}]
    terms = []
    for memory, units in conversion.other_classes:
        pin = {"key": contract.label_gpu_memory_mib, "operator": "In", "values": [labelcodec.count_value(memory)]}
        room: list[dict[str, Any]] = []
        if request is not None:
            share = dataclasses.replace(conversion, steering_request=dataclasses.replace(request, units=units))
            room = _steering_terms(share, settings)[0]
        terms.append([pin, *room, *cpu_per_gpu])
    return terms


def _steering_terms(
    conversion: conversions.Conversion, settings: config.Config
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(required expressions, preferred terms) of the steering for this conversion."""
    if not settings.steering.enabled or conversion.steering_request is None:
        return [], []
    request = conversion.steering_request
    if not settings.steering.cpu_pods:
        # Keeping whole nodes free for the largest pods only pays when CPU-only pods keep off
        # them too; otherwise they land there and take the CPU (docs/steering.md, "Tuning").
        request = dataclasses.replace(request, largest_node_gpus=0)
    required, preferred = steering.placement_affinity(request, settings.contract)
    return list(required), list(preferred)


def merge_node_affinity_any_of(
    affinity: Mapping[str, Any] | None,
    alternatives: Sequence[Sequence[Mapping[str, Any]]],
    preferred: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The pod's affinity where a node must match one of its own required nodeSelectorTerms and
    one of `alternatives` (lists of matchExpressions): one term per pair, since terms are ORed
    and the expressions of a term ANDed; `preferred` terms appended as by `merge_node_affinity`."""
    base = merge_node_affinity(affinity, [], preferred) or dict(affinity or {})
    node_affinity = dict(base.get("nodeAffinity") or {})
    selector = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = []
    for own in [dict(t or {}) for t in selector.get("nodeSelectorTerms") or ()] or [{}]:
        expressions = list(own.get("matchExpressions") or ())
        for alternative in alternatives:
            added = [dict(e) for e in alternative if e not in expressions]
            terms.append({**own, "matchExpressions": [*expressions, *added]})
    selector["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = selector
    return {**base, "nodeAffinity": node_affinity}


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


def json_pointer(*parts: str | int) -> str:
    """RFC 6901 pointer: "~" and "/" inside a part are escaped ("gpuslice.io/decision" -> "gpuslice.io~1decision")."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _container_resources(
    container: Mapping[str, Any], resource: str, units: int, replaces: tuple[str, ...] = ()
) -> dict[str, Any]:
    resources = dict(container.get("resources") or {})
    value = str(units)
    for part in ("requests", "limits"):
        entries = {
            k: v for k, v in (resources.get(part) or {}).items() if k != contract_.NVIDIA_GPU and k not in replaces
        }
        entries[resource] = value  # extended resources: requests must equal limits
        resources[part] = entries
    return resources
