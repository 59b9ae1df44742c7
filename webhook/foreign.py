"""Pods written for another GPU system's resource names, converted to gpuslice's or refused with
what to write instead (with `convertWholeGpus`, which also converts `nvidia.com/gpu: N`). Pure.

  nvidia.com/mig-<profile>: N    NVIDIA's device plugin in its mixed MIG strategy (as KAI and
                                 HAMi document it) -> <prefix>/mig-<profile>: N, the same profile
                                 (NVIDIA's and gpuslice's profile names are the same)
  nvidia.com/gpumem: M           HAMi, beside nvidia.com/gpu: 1 -> a share of M MiB of one GPU,
                                 as the gpu-memory annotation asks
  nvidia.com/gpumem-percentage: P  HAMi -> P % of one GPU, as gpu-fraction: P/100 asks
  nvidia.com/gpucores, HAMi memory on more than one GPU -> refused: gpuslice caps no SMs per pod
                                 (MPS does, from the memory share) and keeps a share on one GPU

May import gpuslice.{config,contract} and the webhook's pure modules.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.webhook import annotations as annotations_
from gpuslice.webhook import answerinputs, conversions, parsing, pods, steering

__all__ = [
    "HAMI_CORES",
    "HAMI_MEMORY",
    "HAMI_MEMORY_PERCENTAGE",
    "NVIDIA_MIG_PREFIX",
    "REPLACED_BY_A_SHARE",
    "hami_share",
    "mig_conversion",
    "names_in",
]

NVIDIA_MIG_PREFIX = "nvidia.com/mig-"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
_HAMI = (HAMI_MEMORY, HAMI_MEMORY_PERCENTAGE, HAMI_CORES)
_HAMI_NAMES = frozenset(_HAMI)
_is_nvidia_mig = operator.methodcaller("startswith", NVIDIA_MIG_PREFIX)  # for resource names (strings)
REPLACED_BY_A_SHARE = (contract_.NVIDIA_GPU, *_HAMI)  # removed from a container a HAMi share is converted for
_HOW_TO_SHARE = (
    f"write the share as annotation {contract_.KAI_GPU_MEMORY}: <MiB> or {contract_.KAI_GPU_FRACTION}: <0..1> "
    f"on the pod (with at most {contract_.NVIDIA_GPU}: 1 on the container)"
)


def _amounts(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's resource amounts, limits winning over requests as the API server defaults them."""
    requests, limits = pods.resource_maps(container)
    return {**requests, **limits}


def _where(container: Mapping[str, Any]) -> str:
    return f"container {parsing.quote(container.get('name'))}"


def names_in(spec: Mapping[str, Any], contract: contract_.Contract) -> list[str]:
    """Other systems' resource names (not nvidia.com/gpu) the pod's unconverted containers ask for.
    Every converted pod and every pod asking for nvidia.com/gpu is looked at, nearly all of them
    without such a name: each resource map is checked by set and C-level prefix tests first."""
    found: list[str] = []
    for _, _, container in pods.containers(spec):
        for amounts in pods.resource_maps(container):
            if amounts and (not _HAMI_NAMES.isdisjoint(amounts) or any(map(_is_nvidia_mig, amounts))):
                if pods.has_gpuslice_resource(container, contract):
                    break
                found += [n for n in amounts if (n in _HAMI_NAMES or _is_nvidia_mig(n)) and n not in found]
    return sorted(found)


# --- NVIDIA's MIG resources ---------------------------------------------------------------------


def mig_conversion(
    spec: Mapping[str, Any], settings: config.Config, inputs: answerinputs.Inputs
) -> conversions.Conversion | None:
    """The conversion of the pod's nvidia.com/mig-<profile> requests; None when it has none."""
    contract = settings.contract
    found: list[tuple[str, int, Mapping[str, Any], str, int]] = []
    for field, index, container in pods.containers(spec):
        if pods.has_gpuslice_resource(container, contract):
            continue
        for name, value in _amounts(container).items():
            if isinstance(name, str) and name.startswith(NVIDIA_MIG_PREFIX):
                count = parsing.count(f"{name} of {_where(container)}", value, forms="a whole number of MIG devices")
                if count:
                    found.append((field, index, container, name, count))
    if not found:
        return None
    names = sorted({name for *_, name, _ in found})
    if len(names) > 1 or len({(f, i) for f, i, *_ in found}) > 1:
        raise parsing.Invalid(
            f"the pod asks for {', '.join(names)} in {len({(f, i) for f, i, *_ in found})} container(s): gpuslice "
            "converts one MIG profile for one container per pod; split the pod, or request "
            f"{contract.mig_resource_prefix}<profile> for each container yourself"
        )
    field, index, container, name, count = found[0]
    suffix = name[len(NVIDIA_MIG_PREFIX) :]
    resource = f"{contract.mig_resource_prefix}{suffix}"
    profiles = {contract_.mig_resource_suffix(p): p for p in inputs.mig_profiles()}
    if profiles and suffix not in profiles:
        raise parsing.Invalid(
            f"{name} of {_where(container)}: no node of the cluster offers MIG profile {parsing.quote(suffix)}; "
            f"offered: {', '.join(sorted(profiles.values()))} (as {contract.mig_resource_prefix}<profile> or "
            f"{NVIDIA_MIG_PREFIX}<profile>), or share a GPU by memory: {_HOW_TO_SHARE}"
        )
    whole = [c for _, _, c in pods.containers(spec) if pods.nvidia_gpus(c) is not None]
    if whole:
        raise parsing.Invalid(
            f"{_where(whole[0])} requests {contract_.NVIDIA_GPU} beside {name} of {_where(container)}: MIG devices "
            f"and whole GPUs cannot be mixed in one pod; remove {contract_.NVIDIA_GPU}, or split the pod"
        )
    profile = profiles.get(suffix, suffix)
    decision = {
        "container": container.get("name"),
        "converted": name,
        "resource": resource,
        "units": count,
        "migProfile": profile,
        "rule": "NVIDIA's MIG resource, same profile",
    }
    memory = inputs.mig_profiles().get(profile)
    if memory is not None:
        decision["memoryMiB"] = memory * count
    return conversions.Conversion(
        conversions.KIND_MIG,
        resource,
        {(field, index): count},
        decision,
        steering_request=steering.Request(mig_profile=profile, gpus=count),
        replaces=(name,),
    )


# --- HAMi's resources -----------------------------------------------------------------------------


def hami_share(spec: Mapping[str, Any], contract: contract_.Contract) -> annotations_.Share | None:
    """The share of one GPU HAMi's resources ask for, as the annotations would ask for it; None
    when the pod uses none of them; parsing.Invalid for what gpuslice cannot honour."""
    found = []
    for field, index, container in pods.containers(spec):
        amounts = _amounts(container)
        if any(key in amounts for key in _HAMI) and not pods.has_gpuslice_resource(container, contract):
            found.append((field, index, container, amounts))
    if not found:
        return None
    if len(found) > 1:
        raise parsing.Invalid(
            f"containers {', '.join(parsing.quote(c.get('name')) for _, _, c, _ in found)} ask for HAMi GPU shares: "
            f"gpuslice gives a pod one share of one GPU; use one pod per share, and {_HOW_TO_SHARE}"
        )
    field, index, container, amounts = found[0]
    where = _where(container)
    if HAMI_CORES in amounts:
        raise parsing.Invalid(
            f"{HAMI_CORES}={parsing.quote(amounts[HAMI_CORES])} of {where}: gpuslice does not cap a pod's GPU cores; "
            f"remove {HAMI_CORES} (with mps.enabled the MPS server caps each pod's SMs at its memory share) and "
            f"{_HOW_TO_SHARE}"
        )
    gpus = amounts.get(contract_.NVIDIA_GPU)
    count = 1 if gpus is None else pods.gpu_count(gpus, where)
    if count != 1:
        raise parsing.Invalid(
            f"{where} asks for {contract_.NVIDIA_GPU}: {count} with HAMi's per-GPU memory: gpuslice keeps a share on "
            f"one GPU; use one pod per GPU share, or whole GPUs with {contract_.NVIDIA_GPU}: N alone"
        )
    memory, percentage = amounts.get(HAMI_MEMORY), amounts.get(HAMI_MEMORY_PERCENTAGE)
    if memory is not None and percentage is not None:
        raise parsing.Invalid(
            f"{where} sets both {HAMI_MEMORY} and {HAMI_MEMORY_PERCENTAGE}; accepted: one of them ({_HOW_TO_SHARE})"
        )
    if memory is not None:
        mib = _mib(f"{HAMI_MEMORY} of {where}", memory)
        return annotations_.Share(HAMI_MEMORY, None, mib, False, field, index, container)
    forms = "a whole percentage from 1 to 100"
    value = parsing.count(f"{HAMI_MEMORY_PERCENTAGE} of {where}", percentage, forms=forms)
    if not 1 <= value <= 100:
        raise parsing.Invalid(f"{HAMI_MEMORY_PERCENTAGE} of {where}={parsing.quote(percentage)}; accepted: {forms}")
    return annotations_.Share(HAMI_MEMORY_PERCENTAGE, value / 100, None, False, field, index, container)


def _mib(name: str, value: Any) -> int:
    """HAMi's memory amount: a number of MiB, written as any quantity of that number (the API server
    canonicalises `3000` to `3k` before admission, and HAMi reads it as 3000 MiB)."""
    forms = "a whole number of MiB, such as 3000"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise parsing.Invalid(f"{name}={parsing.quote(value)} is not a number; accepted: {forms}")
    amount = parsing.request_quantity(value)
    if amount <= 0 or amount != amount.to_integral_value():
        raise parsing.Invalid(f"{name}={parsing.quote(value)} is not a whole number above 0; accepted: {forms}")
    return int(amount)
