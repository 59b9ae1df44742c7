"""Node affinity that steers pods (issue 6): for a converted pod, required terms so it is only
considered for nodes where it fits on one GPU (or where enough whole GPUs are free), and
preferred terms that make even the default scheduler pack; for a pod that asks for no device,
preferred terms that keep its CPU off nodes whose GPUs are still whole.

Pure functions over the contract's label keys (published by gpuslice.deviceplugin.labels); the
patch building (webhook/patches.py) calls `placement_affinity`, and CPU-pod steering
(webhook/cpupods.py) `cpu_pod_preferences` with `steering.cpuPods`, when `steering.enabled`, and
merge the result into the pod's affinity. Imports only gpuslice.contract.

Why the preferred terms look like this (docs/steering.md has the full argument):
- kube-scheduler sums the weights of the preferred terms a node matches, normalises so the best
  feasible node gets 100, and multiplies by NodeAffinity's plugin weight 2. The default profile's
  other scores (LeastAllocated and BalancedAllocation on cpu/memory, weight 1 each) spread pods
  and can add up to 200 points.
- Weights are graded in disjoint ranges so a node matches at most one term of each family, and
  every "fits a partly used GPU" grade outweighs every "fewer free GPUs" grade: a share never
  breaks a fully free GPU when a partly used one (anywhere) fits.
- A first term that every feasible node matches (weight 100), and packing terms of at most 30,
  keep the normalised lead of the best-packing node below LeastAllocated's range: GPU packing
  breaks ties and leads, but a node whose CPU is nearly exhausted can still lose to one with CPU
  left. In the trace replay, GPUs on nodes without CPU are the largest loss, and this compressed
  form allocated more than full-strength packing (docs/steering.md, "Tuning").
- With `steering.cpuPerGpuMilli`, two terms for the node's CPU balance (unrequested CPU less that
  much per free GPU, published by the plugin): the CPU a GPU pod leaves should still match the
  GPUs it leaves, or they stay idle (docs/steering.md, "CPU beside the GPUs").
- Few terms (at most 11), in a fixed order: each costs the scheduler time on every node.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from gpuslice import contract as contract_

__all__ = ["WEIGHTS", "Request", "cpu_pod_preferences", "placement_affinity"]


@dataclasses.dataclass(frozen=True)
class Request:
    """What the webhook converted the pod to."""

    units: int = 0  # gpu-memory units per GPU (0 for MIG)
    gpus: int = 1  # >1 only for whole GPUs, and for MIG devices: how many of the profile
    whole_gpus: bool = False
    mig_profile: str | None = None  # resource-form profile for MIG isolation
    units_per_gpu: int = 0  # units of one GPU of the class the pod is pinned to (0: unknown)
    largest_node_gpus: int = 0  # GPUs of the largest node of the pod's class(es) (0: unknown)
    # The pod's CPU request (-1: not considered). Read by the CPU balance terms only, which are
    # built per pod; not part of the request's identity, so the cached terms are shared by pods
    # of any CPU request.
    cpu_milli: int = dataclasses.field(default=-1, compare=False)
    memory_mib: int = dataclasses.field(default=-1, compare=False)  # idem, read by the host fit term only
    cpu_per_gpu_milli: int = 0  # steering.cpuPerGpuMilli: CPU expected per GPU (0: no CPU balance terms)


@dataclasses.dataclass(frozen=True)
class Weights:
    """Preferred-term weights (kube-scheduler accepts 1..100 each)."""

    # Every feasible node. Against it the packing terms below are small: the best-packing node
    # leads a feasible node that matches no packing term by at most 2 x 100 x 30/130 = 46 points,
    # less than LeastAllocated's 100, so cpu/memory headroom can still overrule GPU packing (GPUs
    # on a node without CPU left are lost for good: the largest loss in the trace replay).
    fits: int = 100
    # A share fits a partly used GPU, by slack left on the node's largest partly used block.
    tight_fit: int = 30  # slack < 1/10 GPU
    close_fit: int = 20  # slack < 1/4 GPU
    loose_fit: int = 14  # any partly used GPU fits
    # No partly used GPU fits: fewer fully free GPUs left (protects whole GPUs for whole-GPU pods).
    one_free_gpu: int = 9  # 0 or 1 fully free GPU
    few_free_gpus: int = 4  # 2 or 3
    # Whole GPUs: the node's free GPUs fit the request exactly, or nearly.
    exact_gpus: int = 30
    near_gpus: int = 15  # one or two GPUs more than asked
    # A pod smaller than the largest node of its class: not on such a node while it is entirely
    # free (the largest multi-GPU pods need whole free nodes; FGD protects them the same way).
    keep_whole_node: int = 30
    # CPU beside the GPUs: the node's CPU left after the pod matches its free GPUs (the node's
    # balance label lands within a quarter of `cpuPerGpuMilli` of the pod's need, or within one;
    # the ranges nest, so a close match scores both, 22). As large as the GPU fit grades on purpose:
    # where CPU is what strands GPUs (the trace), a node left with CPU for its free GPUs may win
    # over a tighter GPU fit.
    cpu_balance_close: int = 15
    cpu_balance_near: int = 7
    # Whole GPUs that take every fully free GPU of a node: the node whose free memory they fill
    # most (`_host_fit`). As large as the close CPU balance; it decides among nodes of equal GPU fit.
    host_fit: int = 15
    # MIG: the last free slices of the profile on the node go first.
    last_mig: int = 30
    few_mig: int = 15
    # Memory-aware placement score (NVML): lowest, so it orders nodes only among equal fits.
    score_high: int = 4  # score >= 70 (below every step between fit grades, the smallest is 5)
    score_mid: int = 2  # 40 <= score < 70
    # A pod that asks for no device. Nodes without gpuslice GPUs first: their CPU serves no GPU.
    # Then gpuslice nodes without a fully free GPU, at full strength against a node with whole
    # GPUs free (normalised, 50 becomes 100 where no CPU-only node is a candidate): a CPU-only pod
    # there takes the CPU that the whole-GPU pods those GPUs wait for will need (FGD scores CPU
    # pods the same way).
    cpu_pod_cpu_node: int = 100
    cpu_pod_no_free_gpu: int = 50
    # With steering.cpuPodsNearlyFullMiB (N): before those, the nodes where less than N of GPU
    # memory is left free, whose CPU the GPU pods still to come can use least; the less left the
    # better: below N/4, below N/2, below N (docs/steering.md).
    cpu_pod_nearly_full: tuple[int, int, int] = (90, 80, 70)


WEIGHTS = Weights()

# Slack grades for shares, as fractions of one GPU: tight below 1/10, close below 1/4.
_TIGHT_SLACK_DIVISOR = 10
_CLOSE_SLACK_DIVISOR = 4


def placement_affinity(
    request: Request, contract: contract_.Contract
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(required matchExpressions, preferred scheduling terms) for the pod's node affinity.

    Required expressions are ANDed into every existing required nodeSelectorTerm (or form one);
    preferred terms are appended to preferredDuringSchedulingIgnoredDuringExecution. The lists
    are the caller's; the terms in them are shared between calls and must not be changed.
    """
    required, preferred = _placement_terms(request, contract)  # cached: cpu_milli is not compared
    return list(required), [*preferred, *_cpu_balance(request, contract), *_host_fit(request, contract)]


# Built once per distinct request: the terms depend only on it and the contract, and the pods of
# one Deployment or Job all ask alike (building them was a tenth of an admission's CPU).
@functools.lru_cache(maxsize=1024)
def _placement_terms(request: Request, contract: contract_.Contract) -> tuple[list, list]:
    if request.mig_profile:
        return _mig(request.mig_profile, max(1, request.gpus), contract)
    if request.whole_gpus:
        if request.gpus < 1:
            raise ValueError(f"a whole-GPU request needs at least 1 GPU, got {request.gpus}")
        return _whole_gpus(request.gpus, request.largest_node_gpus, contract)
    if request.units < 1:
        raise ValueError(f"a shared-GPU request needs at least 1 memory unit, got {request.units}")
    return _share(request, contract)


# --- the three kinds of request -----------------------------------------------------------


def _share(request: Request, contract: contract_.Contract) -> tuple[list, list]:
    units, units_per_gpu = request.units, request.units_per_gpu
    required = [_gt(contract.label_free_block_units, units - 1)]
    if units_per_gpu > units:
        tight = max(1, units_per_gpu // _TIGHT_SLACK_DIVISOR)
        close = max(tight + 1, units_per_gpu // _CLOSE_SLACK_DIVISOR)
    else:  # GPU size unknown (or the share is a whole GPU's worth): grade by the request itself
        tight = max(1, units // 4)
        close = max(tight + 1, units)
    partial = contract.label_free_partial_block_units
    preferred = [
        _term(WEIGHTS.fits, *required),
        _term(WEIGHTS.tight_fit, _gt(partial, units - 1), _lt(partial, units + tight)),
        _term(
            WEIGHTS.close_fit,
            _gt(partial, units + tight - 1),
            _lt(partial, units + close),
        ),
        _term(WEIGHTS.loose_fit, _gt(partial, units + close - 1)),
        # Only where no partly used GPU fits (the pod must open a free GPU): the fewer free GPUs
        # the node has, the better; whole free GPUs are what whole-GPU pods need.
        _term(WEIGHTS.one_free_gpu, _lt(partial, units), _lt(contract.label_free_gpus, 2)),
        _term(
            WEIGHTS.few_free_gpus,
            _lt(partial, units),
            _gt(contract.label_free_gpus, 1),
            _lt(contract.label_free_gpus, 4),
        ),
        *_keep_whole_nodes(1, request.largest_node_gpus, contract),
        *_score_terms(contract),
    ]
    return required, preferred


def _whole_gpus(gpus: int, largest_node_gpus: int, contract: contract_.Contract) -> tuple[list, list]:
    free_gpus = contract.label_free_gpus
    required = [_gt(free_gpus, gpus - 1)]
    preferred = [
        _term(WEIGHTS.fits, *required),
        _term(WEIGHTS.exact_gpus, _lt(free_gpus, gpus + 1)),
        _term(WEIGHTS.near_gpus, _gt(free_gpus, gpus), _lt(free_gpus, gpus + 3)),
        *_keep_whole_nodes(gpus, largest_node_gpus, contract),
        *_score_terms(contract),
    ]
    return required, preferred


def _keep_whole_nodes(gpus: int, largest_node_gpus: int, contract: contract_.Contract) -> list[dict[str, Any]]:
    """Every node but a largest one with all its GPUs free, for a pod smaller than such a node.
    Smaller nodes always match (they can never host the largest pods); a largest node matches
    once one of its GPUs is in use, so small pods fill broken nodes first."""
    if largest_node_gpus <= gpus:
        return []
    return [_term(WEIGHTS.keep_whole_node, _lt(contract.label_free_gpus, largest_node_gpus))]


def _cpu_balance(request: Request, contract: contract_.Contract) -> list[dict[str, Any]]:
    """Terms for the nodes where the CPU the pod leaves matches the GPUs it leaves free.

    The plugin publishes each node's balance b = unrequested CPU - cpuPerGpuMilli x free GPUs
    (free units counted in GPUs) as two labels, spare = max(b, 0) and short = max(-b, 0). A pod
    taking g GPUs and c millicores moves b by need = c - cpuPerGpuMilli x g; after it, b is
    nearest 0 on the nodes where b was nearest `need`. A pod hungry for CPU thus goes where CPU is
    in excess (it would strand GPUs where CPU is short), a frugal one where CPU is short (it would
    leave CPU nothing can use where CPU is plentiful), and neither leaves a node's remaining GPUs
    without the CPU their pods will ask for: GPUs on a node whose CPU is gone stay idle for good,
    the largest loss in the trace replays (docs/steering.md, "CPU beside the GPUs")."""
    per_gpu = request.cpu_per_gpu_milli
    if per_gpu <= 0 or request.cpu_milli < 0 or request.mig_profile:
        return []
    if request.whole_gpus:
        gpus: float = request.gpus
    elif request.units_per_gpu > 0:
        gpus = request.units / request.units_per_gpu
    else:  # a gpu-memory share that several GPU sizes fit: its share of a GPU is not known
        return []
    need = request.cpu_milli - round(per_gpu * gpus)
    if abs(need) > _MAX_BOUND:  # an absurd request (the API server refuses it): no terms,
        return []  # rather than Gt/Lt values beyond the int64 the API server reads them as
    # Not on a largest node with every GPU free, for a pod smaller than one: the balance must not
    # undo what keeping whole nodes free does (on such a node b is about 0, which matches the
    # many pods asking about cpuPerGpuMilli per GPU).
    keep = [_lt(contract.label_free_gpus, request.largest_node_gpus)] if request.largest_node_gpus > gpus else []
    spare, short = contract.label_spare_cpu_milli, contract.label_short_cpu_milli
    return [
        _term(WEIGHTS.cpu_balance_close, *_balance_within(need, per_gpu // 4, spare, short), *keep),
        _term(WEIGHTS.cpu_balance_near, *_balance_within(need, per_gpu, spare, short), *keep),
    ]


def _host_fit(request: Request, contract: contract_.Contract) -> list[dict[str, Any]]:
    """For whole GPUs: the nodes where the pod takes every fully free GPU and at least two thirds
    of the free memory (free memory at most 3/2 of its request).

    After such a pod the node's memory serves only CPU pods and shares on partly used GPUs, so the
    less it leaves the better; and the nodes with memory to spare are the only ones the most
    memory-hungry pods fit (in the trace, 8-GPU pods asking 640-720 GiB fit only the 768 GiB G3
    nodes; 8-GPU pods asking 256-320 GiB fit the 384 GiB G2 nodes as well). Without the term,
    LeastAllocated sends a whole-node pod to the node with the most memory free: the wrong one."""
    if not request.whole_gpus or request.memory_mib <= 0:
        return []
    bound = request.memory_mib * 3 // 2
    if bound > _MAX_BOUND:  # an absurd request: no term rather than a value beyond int64
        return []
    return [_host_fit_term(request.gpus, bound, contract.label_free_gpus, contract.label_free_memory_mib)]


# Keyed by the label names, not the contract, as `_balance_within`.
@functools.lru_cache(maxsize=1024)
def _host_fit_term(gpus: int, bound: int, free_gpus: str, free_memory: str) -> dict[str, Any]:
    return _term(WEIGHTS.host_fit, _lt(free_gpus, gpus + 1), _lt(free_memory, bound + 1))


_MAX_BOUND = 10**15  # a million times the largest node's CPU (millicores) or memory (MiB); far inside int64


# Keyed by the label names, not the contract: hashing a frozen dataclass costs a Python call.
@functools.lru_cache(maxsize=4096)
def _balance_within(need: int, slack: int, spare: str, short: str) -> tuple[dict[str, Any], ...]:
    """Expressions matching a node whose balance b (`spare` label - `short` label) is within
    `slack` of `need`."""
    low, high = need - slack, need + slack
    if low > 0:  # b > 0: short is 0, spare is b
        return _gt(spare, low - 1), _lt(spare, high + 1)
    if high < 0:  # b < 0: spare is 0, short is -b
        return _gt(short, -high - 1), _lt(short, -low + 1)
    return _lt(spare, high + 1), _lt(short, -low + 1)


def _mig(profile: str, devices: int, contract: contract_.Contract) -> tuple[list, list]:
    free = contract.label_mig_free(profile)
    required = [_gt(free, devices - 1)]
    preferred = [
        _term(WEIGHTS.fits, *required),
        _term(WEIGHTS.last_mig, _lt(free, 2)),
        _term(WEIGHTS.few_mig, _gt(free, 1), _lt(free, 4)),
    ]
    return required, preferred


def cpu_pod_preferences(contract: contract_.Contract, nearly_full_mib: int = 0) -> list[dict[str, Any]]:
    """Preferred terms for a pod that asks for no device: a node without gpuslice GPUs (the label
    is absent), then a node where no GPU is fully free, over a node with whole GPUs free; with
    `nearly_full_mib` (steering.cpuPodsNearlyFullMiB), a node without a fully free GPU and with
    less GPU memory than that free goes before the other nodes without a fully free GPU, the less
    it has free the sooner (below a quarter, a half, the whole of `nearly_full_mib`).

    In the trace replay CPU is what strands GPUs: CPU-only pods spread by LeastAllocated land on
    nodes whose GPUs are still free and take the CPU their future pods need (docs/steering.md).
    The terms match disjoint nodes, so a node scores at most one weight. The list is the
    caller's; the terms in it are shared between calls and must not be changed."""
    return list(_cpu_pod_terms(contract, nearly_full_mib))


@functools.lru_cache(maxsize=8)
def _cpu_pod_terms(contract: contract_.Contract, nearly_full_mib: int) -> list[dict[str, Any]]:
    free_gpus = contract.label_free_gpus
    cpu_node = _term(WEIGHTS.cpu_pod_cpu_node, {"key": free_gpus, "operator": "DoesNotExist"})
    if nearly_full_mib <= 0:
        return [cpu_node, _term(WEIGHTS.cpu_pod_no_free_gpu, _lt(free_gpus, 1))]
    # Fewer free units than hold nearly_full_mib: free x unit < nearly_full_mib; graded below a
    # quarter and a half of that (bounds that coincide with few units are taken once).
    below = -(-nearly_full_mib // contract.unit_mib)
    bounds = sorted({-(-below // 4), -(-below // 2), below})
    weights = WEIGHTS.cpu_pod_nearly_full[-len(bounds) :]
    free_units = contract.label_free_units
    terms, low = [cpu_node], 0
    for bound, weight in zip(bounds, weights, strict=True):
        at_least = [_gt(free_units, low - 1)] if low else []
        terms.append(_term(weight, _lt(free_gpus, 1), *at_least, _lt(free_units, bound)))
        low = bound
    terms.append(_term(WEIGHTS.cpu_pod_no_free_gpu, _lt(free_gpus, 1), _gt(free_units, below - 1)))
    return terms


def _score_terms(contract: contract_.Contract) -> list[dict[str, Any]]:
    score = contract.label_placement_score
    return [
        _term(WEIGHTS.score_high, _gt(score, 69)),
        _term(WEIGHTS.score_mid, _gt(score, 39), _lt(score, 70)),
    ]


# --- nodeSelector building blocks ---------------------------------------------------------


def _gt(key: str, value: int) -> dict[str, Any]:
    return {"key": key, "operator": "Gt", "values": [str(value)]}


def _lt(key: str, value: int) -> dict[str, Any]:
    return {"key": key, "operator": "Lt", "values": [str(value)]}


def _term(weight: int, *expressions: dict[str, Any]) -> dict[str, Any]:
    return {"weight": weight, "preference": {"matchExpressions": list(expressions)}}
