"""The node labels the device plugin publishes: pure functions from a node's GPUs and what
kubelet has allocated to label keys and values (keys from gpuslice.contract).

Static labels (product, memory, GPU count, MIG profiles and their memory) let the webhook learn
the cluster's GPU classes. Steering labels (largest free block on one GPU, largest free block on a
partly used GPU, fully free GPUs, free MIG devices, placement score) let the stock scheduler
filter out nodes where a pod cannot fit on one GPU, and prefer the node where it fits best.
The simulator labels its nodes with these same functions. Every count is written, and read back
by `over_promises`, through gpuslice.labelcodec, the codec the webhook and the pacer read with.

May import gpuslice.{contract,labelcodec} and gpuslice.node.inventory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from gpuslice import contract as contract_
from gpuslice import labelcodec
from gpuslice.node import inventory

__all__ = [
    "capacity_keys",
    "cpu_balance_labels",
    "cpu_per_free_gpu_labels",
    "headroom_labels",
    "node_labels",
    "over_promises",
    "static_labels",
    "steering_labels",
]


def static_labels(node: inventory.NodeInventory, contract: contract_.Contract) -> dict[str, str]:
    """Labels that change only when the hardware or MIG layout changes."""
    labels: dict[str, str] = {}
    shared = node.memory_gpus
    if shared:
        model, _ = Counter(g.model for g in shared).most_common(1)[0]
        labels[contract.label_gpu_product] = contract_.label_value(model)
        labels[contract.label_gpu_memory_mib] = labelcodec.count_value(min(g.memory_mib for g in shared))
        labels[contract.label_gpu_count] = labelcodec.count_value(len(shared))
    memory = {
        profile: min(m.memory_mib for m in node.mig_devices() if m.profile == profile)
        for profile in node.mig_profiles()
    }
    labels.update(labelcodec.mig_memory_labels(contract, memory))
    return labels


def steering_labels(
    contract: contract_.Contract,
    *,
    free_units_by_gpu: Mapping[str, int],
    units_by_gpu: Mapping[str, int],
    free_mig_by_profile: Mapping[str, int],
    placement_score: int | None = None,
) -> dict[str, str]:
    """Labels that follow allocations: what the scheduler needs to keep pods on one GPU."""
    fully_free = [g for g, free in free_units_by_gpu.items() if free == units_by_gpu[g]]
    # A partly used GPU still has room but is no longer whole: shares should go there first.
    partial = [free for g, free in free_units_by_gpu.items() if 0 < free < units_by_gpu[g]]
    count = labelcodec.count_value
    labels = {
        contract.label_free_block_units: count(max(free_units_by_gpu.values(), default=0)),
        contract.label_free_partial_block_units: count(max(partial, default=0)),
        contract.label_free_units: count(sum(free_units_by_gpu.values())),
        contract.label_free_gpus: count(len(fully_free)),
    }
    for profile, free in free_mig_by_profile.items():
        labels[contract.label_mig_free(profile)] = count(free)
    if placement_score is not None:
        labels[contract.label_placement_score] = count(max(0, min(100, placement_score)))
    return labels


def node_labels(
    node: inventory.NodeInventory,
    contract: contract_.Contract,
    *,
    allocated: Mapping[str, int] | None = None,
    allocated_mig: frozenset[str] | set[str] = frozenset(),
    placement_score: int | None = None,
    headroom: tuple[int, int] | None = None,
    cpu_per_gpu_milli: int = 0,
) -> dict[str, str]:
    """Every gpuslice label of a node. `allocated`: GPU UUID -> memory units in use;
    `allocated_mig`: UUIDs of MIG devices in use; `headroom`: (CPU millicores, memory MiB) of
    the node's allocatable that its pods have not requested, when known; `cpu_per_gpu_milli`
    (`steering.cpuPerGpuMilli`, 0: none): with the headroom, the CPU balance labels."""
    allocated = allocated or {}
    units = {g.uuid: contract.units_per_gpu(g.memory_mib) for g in node.memory_gpus}
    # Clamped: a stale or foreign record must never publish negative or impossible free counts.
    free = {g: max(0, min(n, n - allocated.get(g, 0))) for g, n in units.items()}
    free_mig: Counter[str] = Counter()
    for mig in node.mig_devices():
        free_mig[mig.profile] += 0 if mig.uuid in allocated_mig else 1
    labels = static_labels(node, contract)
    labels.update(
        steering_labels(
            contract,
            free_units_by_gpu=free,
            units_by_gpu=units,
            free_mig_by_profile=dict(free_mig),
            placement_score=placement_score,
        )
    )
    if headroom is not None:
        labels.update(headroom_labels(contract, *headroom))
        if units:
            free_gpus = sum(free[g] / n for g, n in units.items() if n)
            labels.update(cpu_per_free_gpu_labels(contract, headroom[0], free_gpus))
            if cpu_per_gpu_milli > 0:
                labels.update(cpu_balance_labels(contract, headroom[0] - round(cpu_per_gpu_milli * free_gpus)))
    return labels


_MAX_COUNT = 10**labelcodec.MAX_COUNT_DIGITS - 1  # the largest count a label holds


def cpu_per_free_gpu_labels(contract: contract_.Contract, free_cpu_milli: int, free_gpus: float) -> dict[str, str]:
    """The node's unrequested CPU per free GPU (0 when no GPU memory is free), capped at what a
    count label holds. A share placed where it asks at most this much per GPU leaves the node's
    other free GPUs at least as much CPU each as before (webhook/patches.py, DRA fallbacks)."""
    per_gpu = round(max(0, free_cpu_milli) / free_gpus) if free_gpus > 0 else 0
    return {contract.label_cpu_per_free_gpu_milli: labelcodec.count_value(min(per_gpu, _MAX_COUNT))}


def cpu_balance_labels(contract: contract_.Contract, balance_milli: int) -> dict[str, str]:
    """The node's CPU beyond (or, negative, short of) what its free GPUs are expected to need, as
    two labels, since a label value cannot be negative. A GPU pod is steered to where what it
    leaves matches the GPUs it leaves (webhook/steering/); both are always written, so that
    a node's keys do not change with the sign."""
    return {
        contract.label_spare_cpu_milli: labelcodec.count_value(max(0, balance_milli)),
        contract.label_short_cpu_milli: labelcodec.count_value(max(0, -balance_milli)),
    }


def headroom_labels(contract: contract_.Contract, free_cpu_milli: int, free_memory_mib: int) -> dict[str, str]:
    """The node's unrequested CPU and memory: lets the webhook pin a share to a GPU class whose
    nodes can still run it, not one whose free GPUs are stranded behind exhausted CPUs."""
    return {
        contract.label_free_cpu_milli: labelcodec.count_value(max(0, free_cpu_milli)),
        contract.label_free_memory_mib: labelcodec.count_value(max(0, free_memory_mib)),
    }


def capacity_keys(node: inventory.NodeInventory, contract: contract_.Contract) -> frozenset[str]:
    """Keys of the labels that say how much the node has (GPU memory and count, MIG device memory)
    and how much of it is free. The webhook reads a free count against the totals, and a node with
    totals but no free counts as fully free, so these are written, and removed, together."""
    keys = set(node_labels(node, contract)) - {contract.label_gpu_product}
    return frozenset(keys)


def over_promises(written: Mapping[str, str], change: Mapping[str, str | None], contract: contract_.Contract) -> bool:
    """Whether `change` (label -> new value, None: removed) lowers a label that says how much the
    node has free: the labels `written` so far promise capacity the node no longer has. The
    largest free block, free whole GPUs and free MIG devices are what the webhook's required
    affinity filters on: every pod the scheduler sends by a higher value is one kubelet refuses.
    The free total, the partly used block and the CPU and memory headroom steer its preferences
    (webhook/steering/): a pod placed by their old values goes where the node's last pods have
    already gone, which costs packing (0.5-0.7 points on gpushare40 at the replay's pace,
    docs/benchmarks.md), and the pacer reads a node as lagging until its free total counts every
    pod bound to it (pacer/ledger.py). So anything taken is written at once; what is given back
    (a release only under-promises) waits for the rate limit."""
    watched = (
        contract.label_free_block_units,
        contract.label_free_gpus,
        contract.label_free_units,
        contract.label_free_partial_block_units,
        contract.label_free_cpu_milli,
        contract.label_free_memory_mib,
    )
    for key, value in change.items():
        if key not in watched and contract.mig_profile_of_label(key) is None:
            continue
        try:
            if value is None or labelcodec.count_of(key, value) < labelcodec.count_of(key, written.get(key, "0")):
                return True
        except labelcodec.Malformed:
            return True
    return False
