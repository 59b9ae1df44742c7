"""The preferred-term weights of every steering family, in one table: each family's weight band is
a row of it (webhook/steering/families.py), so the ranges that must not overlap are read side by
side. Why the weights are what they are: webhook/steering/__init__.py and docs/steering.md.
Imports nothing of gpuslice."""

from __future__ import annotations

import dataclasses

__all__ = ["WEIGHTS", "Weights"]


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
    # most (`families.HostFit`). As large as the close CPU balance; it decides among nodes of equal GPU fit.
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
