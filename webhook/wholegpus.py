"""Converting whole GPUs (`convertWholeGpus`): a pod without share annotations whose containers
request `nvidia.com/gpu: N` gets N GPUs' worth of units of one GPU class instead, pinned to that
class, so whole-GPU and shared pods are counted in the same resource. Pure.

May import gpuslice.{config,contract,podrequests} and the webhook's pure modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuslice import config, podrequests
from gpuslice.webhook import answerinputs, classchoice, conversions, parsing, pods, steering

__all__ = ["convert"]


def convert(
    spec: Mapping[str, Any], settings: config.Config, inputs: answerinputs.Inputs
) -> conversions.Conversion | None:
    """The conversion of the pod's nvidia.com/gpu requests; None when it has none (or they are
    converted already); parsing.Invalid for a count that is not a whole number or too many GPUs."""
    contract = settings.contract
    counts: dict[tuple[str, int], int] = {}
    names: dict[str, int] = {}
    by_container: dict[int, int] = {}  # id(container) -> its GPUs
    for field, index, container in pods.containers(spec):
        value = pods.nvidia_gpus(container)
        if value is None or pods.has_gpuslice_resource(container, contract):
            continue
        count = pods.gpu_count(value, f"container {parsing.quote(container.get('name'))}")
        if count:
            counts[(field, index)] = count
            names[str(container.get("name"))] = count
            by_container[id(container)] = count
    if not counts:
        return None
    # As the scheduler adds them up: containers and sidecars together, other init containers alone.
    gpus = podrequests.container_total(spec, lambda c: {"gpus": by_container.get(id(c), 0)}).get("gpus", 0)
    products = pods.selected_products(spec, contract)
    demand = classchoice.Demand(0.0, gpus, *pods.requests(spec))
    choice = classchoice.for_whole_gpus(inputs, products, settings, demand)
    per_gpu = contract.units_per_gpu(choice.memory_mib)
    container_units = {key: n * per_gpu for key, n in counts.items()}
    resource = contract.gpu_memory_resource
    decision = {
        "containers": names,
        "resource": resource,
        "units": sum(container_units.values()),
        "memoryMiB": sum(container_units.values()) * contract.unit_mib,
        "gpus": gpus,
        **choice.notes,
    }
    request = steering.Request(
        units=per_gpu,
        gpus=gpus,
        whole_gpus=True,
        units_per_gpu=per_gpu,
        largest_node_gpus=choice.largest_node_gpus,
        cpu_milli=demand.cpu_milli,
        memory_mib=demand.memory_mib,
        cpu_per_gpu_milli=settings.steering.cpu_per_gpu_milli,
    )
    return conversions.Conversion(
        conversions.KIND_WHOLE_GPUS, resource, container_units, decision, choice.required, request
    )
