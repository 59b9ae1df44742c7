"""The steering families: each a small object that says which request fields it reads (`reads`),
which weights of the table its terms carry (`band`, rows of webhook/steering/weights.py) and
which terms it writes for a request (`required`, `preferred`). webhook/steering/__init__.py
composes them per kind of request; each has its own test (tests/webhook/steering/test_families.py).

Families read nothing but their arguments: no cluster state reaches them except as an argument
their caller read through the answer seam (webhook/answerinputs.py), as the CPU-pod band is.
Imports only gpuslice.contract and the steering package's exprs, request and weights modules.
"""

from __future__ import annotations

import functools
from typing import ClassVar

from gpuslice import contract as contract_
from gpuslice.webhook.steering.exprs import MAX_BOUND, Expression, Term, gt, lt, term
from gpuslice.webhook.steering.request import Request
from gpuslice.webhook.steering.weights import WEIGHTS

__all__ = [
    "CPU_BALANCE",
    "CPU_PODS",
    "FEASIBLE",
    "FREE_GPUS",
    "HOST_FIT",
    "KEEP_WHOLE_NODE",
    "MIG_FIT",
    "PLACEMENT_SCORE",
    "SHARE_FIT",
    "WHOLE_GPU_FIT",
    "CpuPods",
    "Family",
]


class Family:
    """One family of terms for a converted pod's request."""

    band: ClassVar[tuple[str, ...]] = ()  # the `Weights` fields its preferred terms carry
    reads: ClassVar[frozenset[str]] = frozenset()  # the `Request` fields its terms depend on

    @property
    def weights(self) -> tuple[int, ...]:
        return tuple(getattr(WEIGHTS, name) for name in self.band)

    def required(self, request: Request, contract: contract_.Contract) -> list[Expression]:
        """Required expressions (ANDed into the pod's required node affinity)."""
        return []

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        raise NotImplementedError


class Feasible(Family):
    """The nodes where the request fits now: required, and as the first preferred term (weight
    100), which every feasible node matches; against it the packing terms are small."""

    band = ("fits",)
    reads = frozenset({"units", "gpus", "whole_gpus", "mig_profile"})

    def required(self, request: Request, contract: contract_.Contract) -> list[Expression]:
        if request.mig_profile:  # that many free slices of the profile
            return [gt(contract.label_mig_free(request.mig_profile), max(1, request.gpus) - 1)]
        if request.whole_gpus:  # that many fully free GPUs
            return [gt(contract.label_free_gpus, request.gpus - 1)]
        return [gt(contract.label_free_block_units, request.units - 1)]  # a GPU with the units free

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        return [term(WEIGHTS.fits, *self.required(request, contract))]


# Slack grades for shares, as fractions of one GPU: tight below 1/10, close below 1/4.
_TIGHT_SLACK_DIVISOR = 10
_CLOSE_SLACK_DIVISOR = 4


class ShareFit(Family):
    """A share fits a partly used GPU, graded by the slack it leaves on the node's largest partly
    used block: tight (below a tenth of a GPU), close (a quarter), loose (any)."""

    band = ("tight_fit", "close_fit", "loose_fit")
    reads = frozenset({"units", "units_per_gpu"})

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        units, units_per_gpu = request.units, request.units_per_gpu
        if units_per_gpu > units:
            tight = max(1, units_per_gpu // _TIGHT_SLACK_DIVISOR)
            close = max(tight + 1, units_per_gpu // _CLOSE_SLACK_DIVISOR)
        else:  # GPU size unknown (or the share is a whole GPU's worth): grade by the request itself
            tight = max(1, units // 4)
            close = max(tight + 1, units)
        partial = contract.label_free_partial_block_units
        return [
            term(WEIGHTS.tight_fit, gt(partial, units - 1), lt(partial, units + tight)),
            term(WEIGHTS.close_fit, gt(partial, units + tight - 1), lt(partial, units + close)),
            term(WEIGHTS.loose_fit, gt(partial, units + close - 1)),
        ]


class FreeGpus(Family):
    """Only where no partly used GPU fits (the share must open a free GPU): the fewer fully free
    GPUs the node has, the better; whole free GPUs are what whole-GPU pods need."""

    band = ("one_free_gpu", "few_free_gpus")
    reads = frozenset({"units"})

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        partial, free_gpus = contract.label_free_partial_block_units, contract.label_free_gpus
        units = request.units
        return [
            term(WEIGHTS.one_free_gpu, lt(partial, units), lt(free_gpus, 2)),
            term(WEIGHTS.few_free_gpus, lt(partial, units), gt(free_gpus, 1), lt(free_gpus, 4)),
        ]


class WholeGpuFit(Family):
    """Whole GPUs: the node's fully free GPUs fit the request exactly, or with one or two more."""

    band = ("exact_gpus", "near_gpus")
    reads = frozenset({"gpus"})

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        free_gpus, gpus = contract.label_free_gpus, request.gpus
        return [
            term(WEIGHTS.exact_gpus, lt(free_gpus, gpus + 1)),
            term(WEIGHTS.near_gpus, gt(free_gpus, gpus), lt(free_gpus, gpus + 3)),
        ]


class KeepWholeNode(Family):
    """Every node but a largest one with all its GPUs free, for a pod smaller than such a node
    (a share counts as one GPU). Smaller nodes always match (they can never host the largest
    pods); a largest node matches once one of its GPUs is in use, so small pods fill broken nodes
    first. No term without a largest node (`largest_node_gpus` 0)."""

    band = ("keep_whole_node",)
    reads = frozenset({"gpus", "whole_gpus", "largest_node_gpus"})

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        gpus = request.gpus if request.whole_gpus else 1
        if request.largest_node_gpus <= gpus:
            return []
        return [term(WEIGHTS.keep_whole_node, lt(contract.label_free_gpus, request.largest_node_gpus))]


class PlacementScore(Family):
    """The memory-aware placement score (NVML) the plugin publishes: the lowest weights, so it
    orders nodes only among equal fits."""

    band = ("score_high", "score_mid")
    reads = frozenset()

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        score = contract.label_placement_score
        return [term(WEIGHTS.score_high, gt(score, 69)), term(WEIGHTS.score_mid, gt(score, 39), lt(score, 70))]


class MigFit(Family):
    """MIG: the nodes with the last free slices of the profile go first."""

    band = ("last_mig", "few_mig")
    reads = frozenset({"mig_profile"})

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        free = contract.label_mig_free(request.mig_profile or "")
        return [term(WEIGHTS.last_mig, lt(free, 2)), term(WEIGHTS.few_mig, gt(free, 1), lt(free, 4))]


class CpuBalance(Family):
    """The nodes where the CPU the pod leaves matches the GPUs it leaves free (with
    `steering.cpuPerGpuMilli`; not for MIG, nor for a gpu-memory share several GPU sizes fit).

    The plugin publishes each node's balance b = unrequested CPU - cpuPerGpuMilli x free GPUs
    (free units counted in GPUs) as two labels, spare = max(b, 0) and short = max(-b, 0). A pod
    taking g GPUs and c millicores moves b by need = c - cpuPerGpuMilli x g; after it, b is
    nearest 0 on the nodes where b was nearest `need`. A pod hungry for CPU thus goes where CPU is
    in excess (it would strand GPUs where CPU is short), a frugal one where CPU is short (it would
    leave CPU nothing can use where CPU is plentiful), and neither leaves a node's remaining GPUs
    without the CPU their pods will ask for: GPUs on a node whose CPU is gone stay idle for good,
    the largest loss in the trace replays (docs/steering.md, "CPU beside the GPUs"). Per pod: it
    reads the pod's CPU, which is not part of the request's identity."""

    band = ("cpu_balance_close", "cpu_balance_near")
    reads = frozenset(
        {"cpu_per_gpu_milli", "cpu_milli", "mig_profile", "whole_gpus", "gpus", "units", "units_per_gpu"}
        | {"largest_node_gpus"}
    )

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
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
        if abs(need) > MAX_BOUND:  # an absurd request (the API server refuses it): no terms,
            return []  # rather than Gt/Lt values beyond the int64 the API server reads them as
        # Not on a largest node with every GPU free, for a pod smaller than one: the balance must
        # not undo what keeping whole nodes free does (on such a node b is about 0, which matches
        # the many pods asking about cpuPerGpuMilli per GPU).
        largest = request.largest_node_gpus
        keep = [lt(contract.label_free_gpus, largest)] if largest > gpus else []
        spare, short = contract.label_spare_cpu_milli, contract.label_short_cpu_milli
        return [
            term(WEIGHTS.cpu_balance_close, *_balance_within(need, per_gpu // 4, spare, short), *keep),
            term(WEIGHTS.cpu_balance_near, *_balance_within(need, per_gpu, spare, short), *keep),
        ]


# Keyed by the label names, not the contract: hashing a frozen dataclass costs a Python call.
@functools.lru_cache(maxsize=4096)
def _balance_within(need: int, slack: int, spare: str, short: str) -> tuple[Expression, ...]:
    """Expressions matching a node whose balance b (`spare` label - `short` label) is within
    `slack` of `need`."""
    low, high = need - slack, need + slack
    if low > 0:  # b > 0: short is 0, spare is b
        return gt(spare, low - 1), lt(spare, high + 1)
    if high < 0:  # b < 0: spare is 0, short is -b
        return gt(short, -high - 1), lt(short, -low + 1)
    return lt(spare, high + 1), lt(short, -low + 1)


class HostFit(Family):
    """For whole GPUs: the nodes where the pod takes every fully free GPU and at least two thirds
    of the free memory (free memory at most 3/2 of its request).

    After such a pod the node's memory serves only CPU pods and shares on partly used GPUs, so the
    less it leaves the better; and the nodes with memory to spare are the only ones the most
    memory-hungry pods fit (in the trace, 8-GPU pods asking 640-720 GiB fit only the 768 GiB G3
    nodes; 8-GPU pods asking 256-320 GiB fit the 384 GiB G2 nodes as well). Without the term,
    LeastAllocated sends a whole-node pod to the node with the most memory free: the wrong one.
    Per pod: it reads the pod's memory, which is not part of the request's identity."""

    band = ("host_fit",)
    reads = frozenset({"whole_gpus", "memory_mib", "gpus"})

    def preferred(self, request: Request, contract: contract_.Contract) -> list[Term]:
        if not request.whole_gpus or request.memory_mib <= 0:
            return []
        bound = request.memory_mib * 3 // 2
        if bound > MAX_BOUND:  # an absurd request: no term rather than a value beyond int64
            return []
        return [_host_fit_term(request.gpus, bound, contract.label_free_gpus, contract.label_free_memory_mib)]


# Keyed by the label names, not the contract, as `_balance_within`.
@functools.lru_cache(maxsize=1024)
def _host_fit_term(gpus: int, bound: int, free_gpus: str, free_memory: str) -> Term:
    return term(WEIGHTS.host_fit, lt(free_gpus, gpus + 1), lt(free_memory, bound + 1))


class CpuPods:
    """A pod that asks for no device: a node without gpuslice GPUs (the label is absent), then a
    node where no GPU is fully free, over a node with whole GPUs free; with `nearly_full_mib`
    (steering.cpuPodsNearlyFullMiB, while its band is on: webhook/cpupods.py reads that through
    the answer seam), a node without a fully free GPU and with less GPU memory than that free goes
    before the other nodes without a fully free GPU, the less it has free the sooner (below a
    quarter, a half, the whole of `nearly_full_mib`). The terms match disjoint nodes, so a node
    scores at most one weight."""

    band: ClassVar[tuple[str, ...]] = ("cpu_pod_cpu_node", "cpu_pod_nearly_full", "cpu_pod_no_free_gpu")

    @property
    def weights(self) -> tuple[int, ...]:
        """The band's weights, the nearly-full grades one by one."""
        out: list[int] = []
        for name in self.band:
            value = getattr(WEIGHTS, name)
            out.extend(value if isinstance(value, tuple) else (value,))
        return tuple(out)

    def preferred(self, contract: contract_.Contract, nearly_full_mib: int) -> list[Term]:
        free_gpus = contract.label_free_gpus
        cpu_node = term(WEIGHTS.cpu_pod_cpu_node, {"key": free_gpus, "operator": "DoesNotExist"})
        if nearly_full_mib <= 0:
            return [cpu_node, term(WEIGHTS.cpu_pod_no_free_gpu, lt(free_gpus, 1))]
        # Fewer free units than hold nearly_full_mib: free x unit < nearly_full_mib; graded below
        # a quarter and a half of that (bounds that coincide with few units are taken once).
        below = -(-nearly_full_mib // contract.unit_mib)
        bounds = sorted({-(-below // 4), -(-below // 2), below})
        weights = WEIGHTS.cpu_pod_nearly_full[-len(bounds) :]
        free_units = contract.label_free_units
        terms, low = [cpu_node], 0
        for bound, weight in zip(bounds, weights, strict=True):
            at_least = [gt(free_units, low - 1)] if low else []
            terms.append(term(weight, lt(free_gpus, 1), *at_least, lt(free_units, bound)))
            low = bound
        terms.append(term(WEIGHTS.cpu_pod_no_free_gpu, lt(free_gpus, 1), gt(free_units, below - 1)))
        return terms


FEASIBLE = Feasible()
SHARE_FIT = ShareFit()
FREE_GPUS = FreeGpus()
WHOLE_GPU_FIT = WholeGpuFit()
KEEP_WHOLE_NODE = KeepWholeNode()
PLACEMENT_SCORE = PlacementScore()
MIG_FIT = MigFit()
CPU_BALANCE = CpuBalance()
HOST_FIT = HostFit()
CPU_PODS = CpuPods()
