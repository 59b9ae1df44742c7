"""Reading the KAI-style annotations a pod asks for a share of a GPU with (gpu-fraction or
gpu-memory, optionally `<prefix>/isolation: mig`, and in DRA mode gpu-fraction-num-devices: the
same share on N distinct GPUs, or `<prefix>/mig-or-share: "true"` beside MIG isolation: the MIG
slice, else a share of its memory), and the container the share goes to. Every combination that
cannot be honoured is refused here, before any class is chosen, with a message naming the
annotation, the value and the accepted forms. Pure.

May import gpuslice.contract and the webhook's parsing and pods modules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuslice import contract as contract_
from gpuslice.webhook import parsing, pods

__all__ = ["ISOLATION_MIG", "Share", "parse_fraction", "parse_memory_mib", "read", "wanted"]

ISOLATION_MIG = "mig"

# Any of these (or the isolation annotation) makes the pod one to convert; the container name alone does not.
_TRIGGERS = (
    contract_.KAI_GPU_FRACTION,
    contract_.KAI_GPU_MEMORY,
    contract_.KAI_GPU_FRACTION_NUM_DEVICES,
)


@dataclasses.dataclass(frozen=True)
class Share:
    """A checked request for a share of one GPU."""

    annotation: str  # the annotation that sets it: gpu-fraction or gpu-memory
    fraction: float | None  # exactly one of fraction and memory_mib is set
    memory_mib: int | None
    mig: bool  # <prefix>/isolation: mig
    field: str  # where the container is: "containers" or "initContainers", and its index
    index: int
    container: Mapping[str, Any]
    devices: int = 1  # gpu-fraction-num-devices: the share on each of this many distinct GPUs (DRA mode only)
    or_share: bool = False  # <prefix>/mig-or-share: "true": the MIG slice, else a share (DRA mode only)


def wanted(annotations: Mapping[str, Any], contract: contract_.Contract) -> bool:
    """The pod carries an annotation that asks for a conversion (valid or not)."""
    for key in _TRIGGERS:
        if key in annotations:
            return True
    return contract.isolation_annotation in annotations or contract.mig_or_share_annotation in annotations


_FRACTION_NAME = f"annotation {contract_.KAI_GPU_FRACTION}"
_MEMORY_NAME = f"annotation {contract_.KAI_GPU_MEMORY}"


def parse_fraction(text: Any) -> float:
    """The gpu-fraction value, or parsing.Invalid naming what is wrong."""
    return parsing.fraction(_FRACTION_NAME, text)


def parse_memory_mib(text: Any) -> int:
    """The gpu-memory value in MiB (rounded up), or parsing.Invalid naming what is wrong."""
    return parsing.memory_mib(_MEMORY_NAME, text)


def read(
    spec: Mapping[str, Any],
    annotations: Mapping[str, Any],
    contract: contract_.Contract,
    *,
    distinct_gpus: bool = False,
    alternatives: bool = False,
) -> Share | None:
    """The share the annotations ask for; None when there is nothing to convert (only a container
    name, or a container already carries a gpuslice resource); parsing.Invalid when refused.
    `distinct_gpus`: the mode can keep N shares on N distinct GPUs (DRA mode), so
    gpu-fraction-num-devices above 1 is accepted. `alternatives`: the mode can ask for one device
    else another (DRA's prioritized list), so mig-or-share "true" is accepted."""
    fraction_text = annotations.get(contract_.KAI_GPU_FRACTION)
    memory_text = annotations.get(contract_.KAI_GPU_MEMORY)
    devices_text = annotations.get(contract_.KAI_GPU_FRACTION_NUM_DEVICES)
    isolation = annotations.get(contract.isolation_annotation)
    or_share_text = annotations.get(contract.mig_or_share_annotation)

    if fraction_text is not None and memory_text is not None:
        raise parsing.Invalid(
            f"annotations {contract_.KAI_GPU_FRACTION}={parsing.quote(fraction_text)} and {contract_.KAI_GPU_MEMORY}="
            f"{parsing.quote(memory_text)} are both set; accepted: exactly one of them"
        )
    share = contract_.KAI_GPU_FRACTION if fraction_text is not None else contract_.KAI_GPU_MEMORY
    has_share = fraction_text is not None or memory_text is not None
    if devices_text is not None and not has_share:
        raise parsing.Invalid(
            f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}={parsing.quote(devices_text)} needs a share: add "
            f"{contract_.KAI_GPU_FRACTION} or {contract_.KAI_GPU_MEMORY}"
        )
    devices = _parse_num_devices(devices_text, distinct_gpus) if devices_text is not None else 1
    if isolation is not None and isolation != ISOLATION_MIG:
        raise parsing.Invalid(
            f"annotation {contract.isolation_annotation}={parsing.quote(isolation)} is not known; "
            f"accepted: {ISOLATION_MIG!r}"
        )
    or_share = False
    if or_share_text is not None:
        or_share = _parse_mig_or_share(or_share_text, isolation, (devices, devices_text), contract, alternatives)
    if devices > 1 and isolation == ISOLATION_MIG:
        raise parsing.Invalid(
            f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}={parsing.quote(devices_text)} next to "
            f"{contract.isolation_annotation}={parsing.quote(isolation)} is not supported: a MIG share is one MIG "
            "device; use one pod per MIG device, or request N devices of a profile with nvidia.com/mig-<profile>: N"
        )
    if not has_share:
        if isolation is not None:
            raise parsing.Invalid(
                f"annotation {contract.isolation_annotation}={parsing.quote(isolation)} needs a share: add "
                f"{contract_.KAI_GPU_FRACTION} or {contract_.KAI_GPU_MEMORY}"
            )
        return None  # only gpu-fraction-container-name: nothing to convert

    every = list(pods.containers(spec))
    if any([pods.has_gpuslice_resource(c, contract) for _, _, c in every]):
        # Already converted (reinvocation, where the placeholder is gone and a sidecar may now come
        # first) or written by hand: leave the pod alone.
        return None
    field, index, container = _find_container(every, annotations.get(contract_.KAI_GPU_FRACTION_CONTAINER_NAME))
    _check_placeholder(container, share)
    fraction = parse_fraction(fraction_text) if fraction_text is not None else None
    memory_mib = parse_memory_mib(memory_text) if memory_text is not None else None
    return Share(share, fraction, memory_mib, isolation == ISOLATION_MIG, field, index, container, devices, or_share)


def _parse_mig_or_share(
    text: Any, isolation: Any, devices: tuple[int, Any], contract: contract_.Contract, alternatives: bool
) -> bool:
    """mig-or-share: a boolean, beside `isolation: mig` only (it widens a MIG request; alone it
    would mean nothing). "true" needs a mode that can say "else" (DRA); "false" is the plain MIG
    request in either mode. What both modes refuse, they refuse in the same words."""
    name = f"annotation {contract.mig_or_share_annotation}"
    wants = parsing.boolean(name, text)
    isolation_mig = f"{contract.isolation_annotation}: {ISOLATION_MIG}"
    if isolation != ISOLATION_MIG:
        raise parsing.Invalid(
            f"{name}={parsing.quote(text)} needs {isolation_mig}: it lets a MIG request fall back to a share of a "
            f"GPU, and without MIG isolation there is none to fall back from; add {isolation_mig} or remove "
            f"{contract.mig_or_share_annotation}"
        )
    if not wants:
        return False
    if not alternatives:
        raise parsing.Invalid(
            f"{name}={parsing.quote(text)} is not supported in device-plugin mode: a pod's extended resources "
            'cannot say "this, else that" (the scheduler needs every resource a pod requests), so the pod '
            f"would wait for its MIG slice anyway; remove the annotation to wait for a MIG slice, remove "
            f"{contract.isolation_annotation} as well to take a share, or run gpuslice in DRA mode, which supports it"
        )
    if devices[0] > 1:
        raise parsing.Invalid(
            f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}={parsing.quote(devices[1])} next to "
            f"{name}={parsing.quote(text)} is not supported: the MIG choice is one MIG device; for a share on N GPUs "
            f"remove {contract.isolation_annotation} and {contract.mig_or_share_annotation}"
        )
    return True


_NUM_DEVICES_FORMS = 'a positive integer, a GPU count such as "1"'


def _parse_num_devices(text: Any, distinct_gpus: bool) -> int:
    """N of gpu-fraction-num-devices: 1 in device-plugin mode; in DRA mode at most the devices one
    claim can hold (a larger N than any node has GPUs is admitted: the pod waits, as whole GPUs wait
    on a busy cluster). What both modes refuse, they refuse in the same words."""
    name = f"annotation {contract_.KAI_GPU_FRACTION_NUM_DEVICES}"
    value = parsing.count(name, text, forms=_NUM_DEVICES_FORMS)
    if value == 0:
        raise parsing.Invalid(f"{name}={parsing.quote(text)} is not a positive integer; accepted: {_NUM_DEVICES_FORMS}")
    if value > 1 and not distinct_gpus:
        raise parsing.Invalid(
            f"{name}={parsing.quote(text)} is not supported in device-plugin mode: kubelet tells the device plugin "
            "only which device IDs a container gets, so N shares on N distinct GPUs cannot be told from one "
            "request spilling across GPUs, and the plugin could not keep them apart; use one pod per GPU share, "
            f"request whole GPUs with {contract_.NVIDIA_GPU}: N, or run gpuslice in DRA mode, which supports it"
        )
    if value > contract_.DRA_MAX_DEVICES_PER_CLAIM:
        raise parsing.Invalid(
            f"{name}={parsing.quote(text)} is more GPUs than one ResourceClaim can hold; accepted: a positive "
            f"integer up to {contract_.DRA_MAX_DEVICES_PER_CLAIM}"
        )
    return value


def _find_container(
    every: list[tuple[str, int, Mapping[str, Any]]], name: str | None
) -> tuple[str, int, Mapping[str, Any]]:
    """The container the share goes to: the one the annotation names; else the first container
    carrying KAI's nvidia.com/gpu placeholder (regular containers first, then init containers);
    else the first regular container. Going by the placeholder, not the position, keeps the share on
    the GPU container when another webhook inserts a sidecar in front of it."""
    if name is None:  # `every`: pods.containers, regular containers first
        regular = [entry for entry in every if entry[0] == "containers"]
        if not regular:
            raise parsing.Invalid("the pod has no containers to give the GPU share to")
        for entry in every:
            if pods.nvidia_gpus(entry[2]) is not None:
                return entry
        return regular[0]
    for entry in every:
        if entry[2].get("name") == name:
            return entry
    names = parsing.cut(", ".join(str(c.get("name")) for _, _, c in every) or "none")
    raise parsing.Invalid(
        f"annotation {contract_.KAI_GPU_FRACTION_CONTAINER_NAME}={parsing.quote(name)} names no container of the pod "
        f"(containers: {names}); accepted: the name of one of them"
    )


def _check_placeholder(container: Mapping[str, Any], share_annotation: str) -> None:
    value = pods.nvidia_gpus(container)
    if value is None or str(value).strip() == "1":
        return
    raise parsing.Invalid(
        f"container {parsing.quote(container.get('name'))} requests {contract_.NVIDIA_GPU}: "
        f"{parsing.cut(str(value))} next to annotation "
        f"{share_annotation}: a share cannot be combined with whole GPUs; remove {contract_.NVIDIA_GPU} "
        "(a value of 1 is accepted as KAI's placeholder and removed)"
    )
