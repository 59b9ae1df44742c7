"""DRA mode of the webhook: a converted pod gets a ResourceClaim (through a ResourceClaimTemplate)
of the gpuslice DRA driver instead of extended resources. Pure: no I/O, no clock.

The mutation parses and checks the annotations exactly as in device-plugin mode (same denials,
same class choice, same unit rounding); what it decided reaches this module as a `Need`:
  gpu-memory / gpu-fraction -> one request of class gpu-share.<prefix>, count 1, with
                               capacity.requests["gpu.<prefix>/memory"] = the share (whole
                               units), and no selector in the request or its class (only our
                               shared GPUs have that capacity): a GPU class chosen is the pod's
                               required node affinity on the class label, as in device-plugin
                               mode (webhook/patches.py, affinity_ops), so the allocator never
                               evaluates the nodes of other classes (where DRA mode's scheduling
                               time goes: docs/dra.md, "Scheduling cost");
  whole GPUs (nvidia.com/gpu: N with convertWholeGpus) -> one request of N devices of class
                               gpu-share.<prefix> asking a tag of 1 (gpu.<prefix>/m<MiB>, or
                               gpu.<prefix>/whole for any GPU) and no memory: each takes its
                               whole GPU (the memory's default), and the allocator picks GPUs
                               by a capacity, not a CEL selector; as a prioritized list over the GPU
                               classes known (the class device-plugin mode would pin first, then
                               the others largest first, then any GPU), so that a class whose
                               labels lag never keeps the pod waiting while another has GPUs
                               free, the N GPUs alike in memory (a matchAttribute constraint);
                               largest first: a whole GPU is granted whole on any class, and
                               the small GPUs are left to the shares (on the trace, the T4s
                               with the most CPU per GPU, which CPU-hungry shares need);
  <prefix>/isolation: mig   -> one request of class mig.<prefix> selecting the profile; with
                               <prefix>/mig-or-share: "true" a prioritized list instead: that
                               MIG request (subrequest "mig"), else a share (class
                               gpu-share.<prefix>) of at least the profile's memory in whole
                               units (subrequest "share", shaped as every share). Either way one
                               request, so the container's claim reference and its CDI device do
                               not depend on which was taken (the plugin names devices by the
                               base request).
  gpu-fraction by a pod without a controller, with several GPU classes known -> a prioritized
                               list instead: the share of the class chosen (the pin of device-
                               plugin mode), else the same fraction of each other class's GPU
                               whose free GPUs have the CPU the pod asks per GPU (shares.py),
                               each alternative asking its class's tag (gpu.<prefix>/m<MiB>) at 0
                               beside its memory: the tag consumes nothing and only that class's
                               GPUs carry it, so no CEL selector; the pod's required node affinity
                               then names every class of the list (webhook/patches.py);
  gpu-fraction-num-devices: N -> the share's request with count N: the capacity is taken on each
                               device, and a distinctAttribute constraint on the GPU's uuid keeps
                               the N on distinct GPUs (the allocator may place several shares of
                               one claim on one GPU otherwise). One request, not N: its CDI device
                               lists all N GPUs, where N requests' CDI devices would each set
                               NVIDIA_VISIBLE_DEVICES and the container would see only one GPU.
One request per converted container; each container references its own request through
`resources.claims`, and the pod gets `spec.resourceClaims: [{name: gpuslice,
resourceClaimTemplateName: <template>}]`. KAI's `nvidia.com/gpu` placeholder is removed.

The template is named by its content (`gpuslice-<what>-<hash>`), so every pod asking for the same
thing in a namespace shares one, and the name changes whenever the content would (templates are
immutable). The webhook creates it before answering (webhook/claim_templates.py; why there and
not elsewhere: docs/dra.md, "Where the claim templates come from").

May import gpuslice.{config,contract} and the webhook's conversions, decision and patches modules.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gpuslice import config as config_
from gpuslice import contract as contract_
from gpuslice.webhook import conversions, patches
from gpuslice.webhook import decision as decision_

__all__ = [
    "CLAIM_NAME",
    "API_VERSION",
    "MAX_ALTERNATIVES",
    "SUBREQUEST_MIG",
    "SUBREQUEST_SHARE",
    "ContainerNeed",
    "Need",
    "already_converted",
    "build",
    "need_from_conversion",
    "template_name",
]

API_VERSION = "resource.k8s.io/v1"
# A prioritized list (firstAvailable) holds at most this many alternatives (the API's limit).
MAX_ALTERNATIVES = 8
CLAIM_NAME = "gpuslice"  # the pod's resourceClaims entry (and the containers' claims reference)
# mig-or-share's alternatives: allocation results name them "<request>/mig" or "<request>/share".
SUBREQUEST_MIG = "mig"
SUBREQUEST_SHARE = "share"


@dataclasses.dataclass(frozen=True)
class ContainerNeed:
    """What one container needs: a share of one GPU, whole GPUs, or a MIG device."""

    field: str  # "containers" or "initContainers"
    index: int
    memory_mib: int = 0  # a share of one GPU (whole units)
    gpus: int = 0  # whole GPUs
    mig_profile: str = ""
    devices: int = 1  # the share of `memory_mib` on each of this many distinct GPUs (gpu-fraction-num-devices)
    or_memory_mib: int = 0  # the MIG device, else a share of this much (mig-or-share); 0: the MIG device only
    # A fraction that may take any of several GPU classes, in order: (class memory MiB, share MiB
    # on its GPU); the first is the class chosen (`memory_mib` of it). Empty: no other class.
    classes: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Need:
    kind: str
    containers: tuple[ContainerNeed, ...]
    replaces: tuple[str, ...] = ()  # other systems' resource names the containers lose (Conversion.replaces)
    # whole GPUs: the GPU classes (memoryMiB) preferred, in order; empty: any
    gpu_memory_mib: tuple[int, ...] = ()
    decision: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Claims:
    """The template to create in the pod's namespace and the JSON patch of the pod."""

    template: dict[str, Any]
    patch: list[dict[str, Any]]
    decision: dict[str, Any]
    warnings: tuple[str, ...] = ()


def already_converted(pod: Mapping[str, Any]) -> bool:
    """The pod already references the gpuslice claim (reinvocation, or written by hand)."""
    claims = (pod.get("spec") or {}).get("resourceClaims") or ()
    return any(isinstance(c, Mapping) and c.get("name") == CLAIM_NAME for c in claims)


def need_from_conversion(
    conversion: conversions.Conversion,
    contract: contract_.Contract,
    pod: Mapping[str, Any],
    classes: Sequence[int] = (),
) -> Need:
    """The Need of a device-plugin-mode conversion: units become MiB, GPU-class pins on the
    <prefix>/gpu.memory-mib node label become the preferred GPU memories of whole GPUs: the pinned
    class first, then the other `classes` (GPU memory of the classes known whose largest node has
    enough GPUs), largest first. A share's pin stays on the pod (its required node affinity)."""
    decision = dict(conversion.decision)
    memories: tuple[int, ...] = ()
    if conversion.kind == conversions.KIND_WHOLE_GPUS:
        pinned = [
            int(v)
            for expression in conversion.required or ()
            if expression.get("key") == contract.label_gpu_memory_mib and expression.get("operator") == "In"
            for v in expression.get("values") or ()
        ]
        # Preference order, no repeats; room left for "any" within the API's 8 alternatives.
        memories = tuple(dict.fromkeys([*pinned, *sorted(classes, reverse=True)]))[: MAX_ALTERNATIVES - 1]
    spec = pod.get("spec") or {}
    needs = []
    for (field, index), units in conversion.container_units.items():
        if conversion.kind == conversions.KIND_MIG:  # `units`: MIG devices (more than one: NVIDIA's MIG names)
            profile, or_share = str(decision.get("migProfile", "")), int(decision.get("orShareMiB", 0))
            needs.append(ContainerNeed(field, index, gpus=units, mig_profile=profile, or_memory_mib=or_share))
        elif conversion.kind == conversions.KIND_WHOLE_GPUS:
            name = str(spec[field][index].get("name"))
            needs.append(ContainerNeed(field, index, gpus=int(decision["containers"][name])))
        else:
            memory_mib = units * contract.unit_mib
            alternatives: tuple[tuple[int, int], ...] = ()
            if conversion.other_classes:
                chosen = (int(decision["classMemoryMiB"]), memory_mib)
                alternatives = (chosen, *((m, u * contract.unit_mib) for m, u in conversion.other_classes))
            needs.append(
                ContainerNeed(field, index, memory_mib=memory_mib, devices=conversion.devices, classes=alternatives)
            )
    return Need(
        kind=conversion.kind,
        containers=tuple(needs),
        replaces=conversion.replaces,
        gpu_memory_mib=memories,
        decision=decision,
    )


def _mig_selectors(container: ContainerNeed, contract: contract_.Contract) -> list[dict[str, Any]]:
    attributes = f'device.attributes["{contract.dra_driver}"]'
    return [{"cel": {"expression": f'{attributes}.{contract_.DRA_ATTR_MIG_PROFILE} == "{container.mig_profile}"'}}]


def request_name(container: ContainerNeed, single: bool) -> str:
    """'gpu' for the only request; 'c0', 'i1' (containers[0], initContainers[1]) otherwise."""
    return "gpu" if single else f"{'i' if container.field == 'initContainers' else 'c'}{container.index}"


def _whole_gpus(need: Need, container: ContainerNeed, contract: contract_.Contract, name: str) -> dict[str, Any]:
    """N whole GPUs: the first GPU class of `need.gpu_memory_mib` that has them, else any GPU. Of
    the share class, asking a GPU's tag and no memory, so each takes its GPU whole (the memory's
    default) and the allocator picks by a capacity, not a CEL selector (contract.DRA_TAG_WHOLE)."""

    def tagged(tag: str) -> dict[str, Any]:
        return _share_class({tag: "1"}, contract, container.gpus)

    if not need.gpu_memory_mib:
        return {"name": name, "exactly": tagged(contract.dra_tag_whole)}
    alternatives = [{"name": f"m{memory}", **tagged(contract.dra_tag_memory(memory))} for memory in need.gpu_memory_mib]
    return {"name": name, "firstAvailable": [*alternatives, {"name": "any", **tagged(contract.dra_tag_whole)}]}


def _constraints(need: Need, contract: contract_.Contract) -> list[dict[str, Any]]:
    """Several whole GPUs of one container alike in memory (one class), whichever alternative is
    taken; a share on several GPUs on distinct ones (whole GPUs are distinct already: a device
    without capacity asked is taken whole)."""
    single = len(need.containers) == 1
    constraints: list[dict[str, Any]] = []
    for container in need.containers:
        name = request_name(container, single)
        if container.gpus > 1 and not container.mig_profile:
            attribute = f"{contract.dra_driver}/{contract_.DRA_ATTR_MEMORY_MIB}"
            constraints.append({"requests": [name], "matchAttribute": attribute})
        elif container.devices > 1:
            constraints.append(
                {"requests": [name], "distinctAttribute": f"{contract.dra_driver}/{contract_.DRA_ATTR_UUID}"}
            )
    return constraints


def _share_class(requests: Mapping[str, str], contract: contract_.Contract, count: int) -> dict[str, Any]:
    """`count` devices of the share class, each consuming `requests` (memory, or a tag)."""
    return {
        "deviceClassName": contract.dra_share_device_class,
        "allocationMode": "ExactCount",
        "count": count,
        "capacity": {"requests": dict(requests)},
    }


def _share(contract: contract_.Contract, memory_mib: int, count: int = 1) -> dict[str, Any]:
    """`memory_mib` of each of `count` GPUs (whole units: the request policy's step)."""
    return _share_class({contract.dra_capacity_memory: f"{memory_mib}Mi"}, contract, count)


def _exactly(container: ContainerNeed, contract: contract_.Contract) -> dict[str, Any]:
    """A share of `memory_mib` (on `devices` GPUs), or `gpus` MIG devices of the profile."""
    if container.mig_profile:
        return {
            "deviceClassName": contract.dra_mig_device_class,
            "allocationMode": "ExactCount",
            "count": container.gpus or 1,
            "selectors": _mig_selectors(container, contract),
        }
    return _share(contract, container.memory_mib, container.devices)


def _any_class(container: ContainerNeed, contract: contract_.Contract) -> list[dict[str, Any]]:
    """The fraction's share of each class's GPU, the class chosen first: each alternative asks its
    class's tag at 0, which consumes nothing and keeps it on GPUs of that class (only they carry
    the tag; contract.DRA_TAG_MEMORY_PREFIX), with no CEL selector."""
    return [
        {
            "name": f"m{memory}",
            **_share_class(
                {contract.dra_capacity_memory: f"{share}Mi", contract.dra_tag_memory(memory): "0"}, contract, 1
            ),
        }
        for memory, share in container.classes
    ]


def _mig_or_share(mig: dict[str, Any], memory_mib: int, contract: contract_.Contract) -> list[dict[str, Any]]:
    """The MIG device, else a share of `memory_mib` on any GPU that holds it: the allocator keeps
    the share off GPUs too small by their request policy, so no class selector is needed."""
    return [{"name": SUBREQUEST_MIG, **mig}, {"name": SUBREQUEST_SHARE, **_share(contract, memory_mib)}]


def _requests(need: Need, contract: contract_.Contract) -> list[dict[str, Any]]:
    single = len(need.containers) == 1
    requests = []
    for container in need.containers:
        name = request_name(container, single)
        if container.gpus and not container.mig_profile:
            requests.append(_whole_gpus(need, container, contract, name))
        elif container.classes:
            requests.append({"name": name, "firstAvailable": _any_class(container, contract)})
        elif container.or_memory_mib:
            mig = _exactly(container, contract)
            requests.append({"name": name, "firstAvailable": _mig_or_share(mig, container.or_memory_mib, contract)})
        else:
            requests.append({"name": name, "exactly": _exactly(container, contract)})
    return requests


def _describe(need: Need) -> str:
    """A readable part of the template name: 'mem-2048mi', 'mem-2048mi-x2' (on 2 GPUs), 'mem-2048mi-or-2' (or a
    share of 2 other classes), 'gpus-2', 'mig-1g.10gb', 'mig-1g.10gb-or-mem-9728mi'."""
    parts = []
    for container in need.containers:
        if container.mig_profile:
            parts.append(f"mig-{container.mig_profile.replace('+', '.')}")
            if container.or_memory_mib:
                parts.append(f"or-mem-{container.or_memory_mib}mi")
        elif container.gpus:
            parts.append(f"gpus-{container.gpus}")
        elif container.classes:
            parts.append(f"mem-{container.memory_mib}mi-or-{len(container.classes) - 1}")
        else:
            parts.append(f"mem-{container.memory_mib}mi" + (f"-x{container.devices}" if container.devices > 1 else ""))
    return "-".join(parts)[:40].rstrip("-.")


def template_name(spec: Mapping[str, Any], need: Need) -> str:
    """'gpuslice-mem-2048mi-<10 hex of the spec's SHA-256>': same content, same name."""
    digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]
    return f"gpuslice-{_describe(need)}-{digest}"


def _container_resources(
    container: Mapping[str, Any], claim_request: str | None, replaces: tuple[str, ...] = ()
) -> dict[str, Any]:
    resources = dict(container.get("resources") or {})
    for part in ("requests", "limits"):
        if part in resources:
            entries = {
                k: v for k, v in (resources[part] or {}).items() if k != contract_.NVIDIA_GPU and k not in replaces
            }
            if entries:
                resources[part] = entries
            else:
                del resources[part]
    reference: dict[str, str] = {"name": CLAIM_NAME}
    if claim_request:
        reference["request"] = claim_request
    claims = [c for c in resources.get("claims") or () if c.get("name") != CLAIM_NAME]
    resources["claims"] = [*claims, reference]
    return resources


def build(pod: Mapping[str, Any], need: Need, settings: config_.Config, *, namespace: str = "") -> Claims:
    """The template and the pod patch for `need` (the mutation has checked the annotations)."""
    contract = settings.contract
    spec = pod.get("spec") or {}
    metadata = pod.get("metadata") or {}
    devices: dict[str, Any] = {"requests": _requests(need, contract)}
    constraints = _constraints(need, contract)
    if constraints:
        devices["constraints"] = constraints
    claim_spec = {"devices": devices}
    name = template_name(claim_spec, need)
    template_metadata: dict[str, Any] = {"name": name, "labels": {contract.dra_template_label: "webhook"}}
    if namespace:
        template_metadata["namespace"] = namespace
    template = {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": template_metadata,
        "spec": {"metadata": {"labels": {contract.dra_template_label: "webhook"}}, "spec": claim_spec},
    }
    patch: list[dict[str, Any]] = []
    single = len(need.containers) == 1
    for container in need.containers:
        target = spec[container.field][container.index]
        patch.append(
            {
                "op": "add",
                "path": f"/spec/{container.field}/{container.index}/resources",
                "value": _container_resources(
                    target, None if single else request_name(container, single), need.replaces
                ),
            }
        )
    entry = {"name": CLAIM_NAME, "resourceClaimTemplateName": name}
    if spec.get("resourceClaims"):
        patch.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    else:
        patch.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})

    decision = {**need.decision, "mode": "dra", "claimTemplate": name}
    decision.pop("resource", None)  # no extended resource; `units` stays: the webhook's promises count it
    scheduler_patch, warnings = patches.scheduler_ops(spec, settings, decision)
    patch += scheduler_patch
    ops, notes = decision_.patch_ops(metadata, contract.decision_annotation, decision)
    return Claims(template=template, patch=patch + ops, decision=decision, warnings=(*warnings, *notes))
