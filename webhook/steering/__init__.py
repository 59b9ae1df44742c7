"""Node affinity that steers pods (issue 6): for a converted pod, required terms so it is only
considered for nodes where it fits on one GPU (or where enough whole GPUs are free), and
preferred terms that make even the default scheduler pack; for a pod that asks for no device,
preferred terms that keep its CPU off nodes whose GPUs are still whole.

Each family of terms is one object (webhook/steering/families.py: what it reads, its weight band,
the terms it writes); this module composes them per kind of request. Pure, over the contract's
label keys (published by gpuslice.node.labels); the patch building (webhook/patches.py)
calls `placement_affinity`, and CPU-pod steering (webhook/cpupods.py) `cpu_pod_preferences` with
`steering.cpuPods`, when `steering.enabled`, and merge the result into the pod's affinity. The
package imports only gpuslice.contract; no family sees the cluster view (import-linter contract
"steering": what they need of the cluster is an argument, read through webhook/answerinputs.py).

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

import functools
from typing import Any

from gpuslice import contract as contract_
from gpuslice.webhook.steering import families
from gpuslice.webhook.steering.request import IDENTITY, Request
from gpuslice.webhook.steering.weights import WEIGHTS, Weights

__all__ = ["CACHED", "PER_POD", "WEIGHTS", "Request", "Weights", "cpu_pod_preferences", "placement_affinity"]

# The families of each kind of request, in the order their terms are written (each term costs the
# scheduler time on every node: at most 11 in all). Their terms depend on the request's identity
# alone, so they are built once per distinct request.
SHARE: tuple[families.Family, ...] = (
    families.FEASIBLE,
    families.SHARE_FIT,
    families.FREE_GPUS,
    families.KEEP_WHOLE_NODE,
    families.PLACEMENT_SCORE,
)
WHOLE_GPUS: tuple[families.Family, ...] = (
    families.FEASIBLE,
    families.WHOLE_GPU_FIT,
    families.KEEP_WHOLE_NODE,
    families.PLACEMENT_SCORE,
)
MIG: tuple[families.Family, ...] = (families.FEASIBLE, families.MIG_FIT)
CACHED = frozenset([*SHARE, *WHOLE_GPUS, *MIG])
# Written after those, per pod: they read the pod's CPU and memory requests.
PER_POD = (families.CPU_BALANCE, families.HOST_FIT)
assert all(f.reads <= IDENTITY for f in CACHED), "a family built once per request reads only its identity"


def placement_affinity(
    request: Request, contract: contract_.Contract
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(required matchExpressions, preferred scheduling terms) for the pod's node affinity.

    Required expressions are ANDed into every existing required nodeSelectorTerm (or form one);
    preferred terms are appended to preferredDuringSchedulingIgnoredDuringExecution. The lists
    are the caller's; the terms in them are shared between calls and must not be changed.
    """
    required, preferred = _placement_terms(request, contract)  # cached: cpu_milli is not compared
    # The PER_POD families, written out (a loop costs this per-admission path a few hundred ns).
    return list(required), [
        *preferred,
        *families.CPU_BALANCE.preferred(request, contract),
        *families.HOST_FIT.preferred(request, contract),
    ]


# Built once per distinct request: the terms depend only on it and the contract, and the pods of
# one Deployment or Job all ask alike (building them was a tenth of an admission's CPU).
@functools.lru_cache(maxsize=1024)
def _placement_terms(request: Request, contract: contract_.Contract) -> tuple[list, list]:
    kind: tuple[families.Family, ...]
    if request.mig_profile:
        kind = MIG
    elif request.whole_gpus:
        if request.gpus < 1:
            raise ValueError(f"a whole-GPU request needs at least 1 GPU, got {request.gpus}")
        kind = WHOLE_GPUS
    else:
        if request.units < 1:
            raise ValueError(f"a shared-GPU request needs at least 1 memory unit, got {request.units}")
        kind = SHARE
    required = [e for family in kind for e in family.required(request, contract)]
    preferred = [t for family in kind for t in family.preferred(request, contract)]
    return required, preferred


def cpu_pod_preferences(contract: contract_.Contract, nearly_full_mib: int = 0) -> list[dict[str, Any]]:
    """Preferred terms for a pod that asks for no device (`families.CpuPods`); `nearly_full_mib`:
    steering.cpuPodsNearlyFullMiB while its band is on, else 0.

    In the trace replay CPU is what strands GPUs: CPU-only pods spread by LeastAllocated land on
    nodes whose GPUs are still free and take the CPU their future pods need (docs/steering.md).
    The list is the caller's; the terms in it are shared between calls and must not be changed."""
    return list(_cpu_pod_terms(contract, nearly_full_mib))


@functools.lru_cache(maxsize=8)
def _cpu_pod_terms(contract: contract_.Contract, nearly_full_mib: int) -> list[dict[str, Any]]:
    return families.CPU_PODS.preferred(contract, nearly_full_mib)
