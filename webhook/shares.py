"""Converting a share of one GPU (annotations.Share: gpu-fraction, gpu-memory, or either with MIG
isolation) into a Conversion: the units of GPU memory (or the MIG device) for the container, the
class pin and the steering request, with the decision notes that explain them. Pure.

  gpu-memory: "2000"       -> ceil(2000 / unit) units, kept off GPUs too small for it
  gpu-fraction: "0.5"      -> floor(0.5 x the units of one GPU of the class chosen), pinned to it;
                           in DRA mode, for a pod without a controller, that class first, else
                           the same fraction of another class's GPU (`other_classes`)
  <prefix>/isolation: mig  -> one device of the smallest MIG profile that holds the memory;
                           with mig-or-share "true" (DRA mode) else a share of that profile's
                           memory in whole units (the decision's `orShareMiB`)
  gpu-fraction-num-devices: N (DRA mode) -> the same share on each of N distinct GPUs: the
                           decision's units and memoryMiB are the N shares' sum (what the promises
                           count), the container's units one share

May import gpuslice.{config,contract} and the webhook's pure modules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.webhook import annotations as annotations_
from gpuslice.webhook import answerinputs, classchoice, conversions, dra_claims, parsing, pods, steering

__all__ = ["convert"]


def convert(
    share: annotations_.Share, spec: Mapping[str, Any], settings: config.Config, inputs: answerinputs.Inputs
) -> conversions.Conversion:
    """The conversion of `share` (the pod's `spec` for its selected products and requests);
    parsing.Invalid when no GPU in the cluster can hold it."""
    products = pods.selected_products(spec, settings.contract)
    base = {"container": share.container.get("name"), "annotation": share.annotation}
    if share.mig:
        return _mig(share, spec, products, base, settings, inputs)
    if share.memory_mib is not None:
        conversion = _memory(share, share.memory_mib, spec, products, base, settings, inputs)
    else:
        assert share.fraction is not None
        conversion = _fraction(share, share.fraction, spec, products, base, settings, inputs)
    return _on_devices(conversion, share.devices, settings.contract)


def _on_devices(
    conversion: conversions.Conversion, devices: int, contract: contract_.Contract
) -> conversions.Conversion:
    """The share taken on `devices` distinct GPUs: the decision counts all of them, so the
    promises hold what the pod takes (the steering request stays one share: terms per GPU)."""
    if devices == 1:
        return conversion
    units = devices * conversion.decision["units"]
    conversion.decision.update(units=units, memoryMiB=units * contract.unit_mib, numDevices=devices)
    conversion.devices = devices
    return conversion


def _fraction(
    share: annotations_.Share,
    fraction: float,
    spec: Mapping[str, Any],
    products: frozenset[str] | None,
    base: dict[str, Any],
    settings: config.Config,
    inputs: answerinputs.Inputs,
) -> conversions.Conversion:
    contract = settings.contract
    demand = classchoice.Demand(fraction, 0, *pods.requests(spec))
    choice = classchoice.for_fraction(inputs, products, settings, demand, share.devices)
    per_gpu = contract.units_per_gpu(choice.memory_mib)
    units = conversions.fraction_units(fraction, per_gpu)
    resource = contract.gpu_memory_resource
    decision = {
        **base,
        "resource": resource,
        "units": units,
        "memoryMiB": units * contract.unit_mib,
        "fraction": fraction,
        **choice.notes,
    }
    request = steering.Request(
        units=units,
        units_per_gpu=per_gpu,
        whole_gpus=fraction == 1,
        largest_node_gpus=choice.largest_node_gpus,
        cpu_milli=demand.cpu_milli,
        cpu_per_gpu_milli=settings.steering.cpu_per_gpu_milli,
    )
    others: tuple[tuple[int, int], ...] = ()
    if settings.dra.enabled and share.devices == 1 and not inputs.owner:
        others = _other_classes(fraction, choice.memory_mib, choice.candidates, contract)
        if others and demand.cpu_milli > 0:
            # Another class only where its free GPUs come with the CPU the pod asks per GPU: else
            # the pod would use up CPU its node's other GPUs need, and leave them idle for good.
            rich = inputs.classes_with_cpu(tuple([m for m, _ in others]), demand.cpu_per_gpu_milli())
            others = tuple([o for o in others if o[0] in rich])
        if others:
            decision["otherClassesMiB"] = [memory for memory, _ in others]
    return conversions.Conversion(
        conversions.KIND_FRACTION,
        resource,
        {(share.field, share.index): units},
        decision,
        choice.required,
        request,
        other_classes=others,
    )


def _other_classes(
    fraction: float, chosen_mib: int, classes: Sequence[int], contract: contract_.Contract
) -> tuple[tuple[int, int], ...]:
    """(class memory MiB, units) of the classes (memory MiB of each) a fraction may take in DRA
    mode besides the one chosen, smallest GPU first. The class is chosen at admission from what is free then; in a
    burst the scheduler reaches the pod minutes later, when that class may be full and another
    not: the claim's prioritized list lets the allocator take the fraction of whichever GPU is
    free (a class's tag asked at 0 keeps each alternative on its class). A pod of a controller
    keeps its owner's class instead, so that replicas get alike GPUs (webhook/classchoice.py)."""
    memories = sorted(set(classes) - {chosen_mib})[: dra_claims.MAX_ALTERNATIVES - 1]
    return tuple((m, conversions.fraction_units(fraction, contract.units_per_gpu(m))) for m in memories)


def _memory(
    share: annotations_.Share,
    mib: int,
    spec: Mapping[str, Any],
    products: frozenset[str] | None,
    base: dict[str, Any],
    settings: config.Config,
    inputs: answerinputs.Inputs,
) -> conversions.Conversion:
    contract = settings.contract
    units = contract_.units_for_mib(mib, contract.unit_mib)
    required, notes, per_gpu, largest = classchoice.for_memory(mib, units, inputs, products, settings)
    resource = contract.gpu_memory_resource
    decision = {
        **base,
        "resource": resource,
        "units": units,
        "memoryMiB": units * contract.unit_mib,
        "requestedMiB": mib,
        **notes,
    }
    per_gpu_cpu = settings.steering.cpu_per_gpu_milli
    # The CPU balance terms need the share of one GPU, unknown when GPUs of several sizes fit:
    # then the requests are not read (steering.families.CpuBalance).
    cpu_milli = pods.requests(spec)[0] if per_gpu > 0 and per_gpu_cpu > 0 else -1
    request = steering.Request(
        units=units,
        units_per_gpu=per_gpu,
        largest_node_gpus=largest,
        cpu_milli=cpu_milli,
        cpu_per_gpu_milli=per_gpu_cpu,
    )
    return conversions.Conversion(
        conversions.KIND_MEMORY, resource, {(share.field, share.index): units}, decision, required, request
    )


def _mig(
    share: annotations_.Share,
    spec: Mapping[str, Any],
    products: frozenset[str] | None,
    base: dict[str, Any],
    settings: config.Config,
    inputs: answerinputs.Inputs,
) -> conversions.Conversion:
    """One device of the smallest MIG profile that holds the share (a fraction is taken of the
    GPU class a shared fraction would get)."""
    contract = settings.contract
    isolation = f"{contract.isolation_annotation}: {annotations_.ISOLATION_MIG}"
    if share.fraction is not None:
        demand = classchoice.Demand(share.fraction, 0, *pods.requests(spec))
        try:
            choice = classchoice.for_fraction(inputs, products, settings, demand)
        except parsing.Invalid:  # a product only MIG-mode GPUs carry: no shared class to take it from
            choice = classchoice.for_fraction(inputs, None, settings, demand)
        need = math.ceil(share.fraction * choice.memory_mib - 1e-9)
        base.update(fraction=share.fraction, **choice.notes)
    else:
        assert share.memory_mib is not None
        need = share.memory_mib
    profiles = inputs.mig_profiles()
    if not profiles:
        raise parsing.Invalid(
            f"annotation {contract.isolation_annotation}={parsing.quote(annotations_.ISOLATION_MIG)}: no MIG profile "
            "is known in the cluster "
            "(no node publishes MIG devices); remove the annotation to share a GPU by memory"
        )
    fitting = sorted((mib, profile) for profile, mib in profiles.items() if mib >= need)
    if not fitting:
        biggest = max(profiles.items(), key=lambda item: item[1])
        raise parsing.Invalid(
            f"annotation {share.annotation}: {need} MiB is larger than any MIG profile in the cluster "
            f"(largest: {biggest[0]} with {biggest[1]} MiB); accepted: at most {biggest[1]} MiB with {isolation}"
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
    if share.or_share:
        # The MIG slice stays the first choice, and the decision's units are its (a MIG slice
        # promises nothing), as a whole-GPU list records its preferred class; the share holds at
        # least what the slice would, rounded up to whole units as every share is.
        decision["orShareMiB"] = contract_.units_for_mib(mib, contract.unit_mib) * contract.unit_mib
    return conversions.Conversion(
        conversions.KIND_MIG,
        resource,
        {(share.field, share.index): 1},
        decision,
        steering_request=steering.Request(mig_profile=profile),
    )
