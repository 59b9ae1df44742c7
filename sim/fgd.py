"""Fragmentation Gradient Descent (FGD), the policy of Weng et al., "Beware of Fragmentation"
(USENIX ATC'23), written from the paper's definitions, to measure the paper's baseline under the
same replay protocol and metrics as gpuslice (docs/simulator.md, "What the comparison with the FGD
paper compares").

The paper's model, not gpuslice's: no webhook, no kubelet, no device plugin. A node has CPU,
memory and GPUs with a free share each (in milli of a GPU); a pod gets exactly the share it asks
for (continuous shares), so granted == requested here.

- A node's **fragmentation for a task type** m is the free GPU capacity on it that m cannot use:
  all its free GPU when m does not fit the node (CPU, GPU model, or GPU: no single GPU with m's
  share free / fewer than m's count of wholly free GPUs) or asks for no GPU at all; otherwise the
  free share of every GPU whose free share is below min(m's share, one GPU). **Memory is not part
  of it**: the paper's simulator describes task types and nodes by CPU and GPUs only (its
  `PodResource` and `NodeResource` have no memory), so memory binds only through the filter below.
- The node's **expected fragmentation** weights the task types by their popularity in the target
  workload: a type is a (CPU, GPU count, share, GPU models) of the trace's pod list, weighted by
  its pod count; `popularity` below 1 keeps only the most common types that together hold that
  share of the pods (the paper's `podPopularityThreshold`).
- **FGD** places each pod on the node and GPU(s) whose placement increases the expected
  fragmentation least, among the nodes the default scheduler's filters pass (CPU, memory, GPU
  model, the share on one GPU / the count of whole free GPUs). Every feasible node is scored, as
  the paper's simulator configures it (percentage_of_nodes_to_score 100); less is the stock
  scheduler's sampling.
- **The score is an integer**, as any kube-scheduler score plugin's: 0..100 per node, the growth
  (in GPUs, popularity as shares) through a falling sigmoid and truncated, as the paper's plugin
  maps it; nodes with the same integer are tied. `scored=False` ranks by the exact growth.
- **Ties** between nodes: `fixed` gives them to the lexicographically smallest node name (the
  paper's kube-scheduler fork), `random` picks uniformly among them with the seed's generator (the
  stock kube-scheduler). Ties between GPUs of one node go to the lowest index.

Fragmentation is kept in integers (milli x pod counts), so exact ties are exact. State is numpy arrays
over nodes x GPUs; a pod costs a few vector operations over its candidate placements.

May import numpy and gpuslice.sim.replay / trace / node (for the Result and the placement records)
and gpuslice.sim.scheduler (its node-sampling constants).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpuslice.sim import node as node_
from gpuslice.sim import replay, scheduler, trace

__all__ = [
    "CONFIGURATION_NAMES",
    "TIE_BREAKS",
    "Mix",
    "Policy",
    "State",
    "fragmentation",
    "policies",
    "replay_fgd",
    "workload_mix",
]

CONFIGURATION_NAMES = ("fgd-fixed-ties", "fgd-random-ties")
TIE_BREAKS = ("fixed", "random")
WHOLE = 1000  # milli of one GPU
MAX_NODE_SCORE = 100  # kube-scheduler's


@dataclasses.dataclass(frozen=True)
class Mix:
    """The target workload's task types (one row each) and how many pods of each it has."""

    cpu_milli: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray  # per GPU; 0 for CPU-only types
    gpu_spec: tuple[tuple[str, ...], ...]  # allowed GPU models per type, empty = any
    count: np.ndarray  # pods of the type: the popularity weight (a share would only scale it)

    def __len__(self) -> int:
        return len(self.count)


# Every task type weighed. The paper's scripts configure podPopularityThreshold 95 (the most common
# types holding 95 % of the pods), but its published results are reproduced closer with every type
# (docs/simulator.md, "FGD in the model"); --fgd-popularity-threshold 95 gives the scripts' setting.
POPULARITY_THRESHOLD = 1.0


def workload_mix(pods: Sequence[trace.TracePod], *, popularity: float = POPULARITY_THRESHOLD) -> Mix:
    """The typical task types of a pod list: pods with the same CPU, GPU count, share and models
    are one type; the most common types are taken one by one until they hold `popularity` of the
    pods, each weighted by its count."""
    if not 0 < popularity <= 1:
        raise ValueError(f"popularity must be in (0, 1], got {popularity}")
    counts: collections.Counter[tuple[int, int, int, tuple[str, ...]]] = collections.Counter(
        (p.cpu_milli, p.num_gpu, p.gpu_milli if p.num_gpu else 0, p.gpu_spec if p.num_gpu else ()) for p in pods
    )
    if not counts:
        raise ValueError("the target workload has no pods")
    # Most common first; equal counts larger first by CPU, share, GPU count, models (the paper's order).
    ranked = sorted(counts, key=lambda k: (counts[k], k[0], k[2], k[1], "|".join(k[3])), reverse=True)
    wanted, held, keys = popularity * sum(counts.values()), 0, []
    for key in ranked:
        if held >= wanted:
            break
        keys.append(key)
        held += counts[key]
    keys.sort()
    return Mix(
        cpu_milli=np.array([k[0] for k in keys], dtype=np.int64),
        num_gpu=np.array([k[1] for k in keys], dtype=np.int64),
        gpu_milli=np.array([k[2] for k in keys], dtype=np.int64),
        gpu_spec=tuple(k[3] for k in keys),
        count=np.array([counts[k] for k in keys], dtype=np.int64),
    )


@dataclasses.dataclass(frozen=True)
class Policy:
    """One FGD configuration: its name, how it breaks ties and the workload it expects."""

    name: str
    tie_break: str  # fixed | random
    mix: Mix
    scored: bool = True  # nodes ranked by a kube-scheduler integer score (False: by the exact growth)
    # kube-scheduler's percentageOfNodesToScore: 100 (the paper's configuration) scores every
    # feasible node; 0 is the stock scheduler's adaptive default (scheduler.Scheduler.nodes_to_find).
    percentage_of_nodes_to_score: int = 100

    def __post_init__(self) -> None:
        if self.tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {', '.join(TIE_BREAKS)}, got {self.tie_break!r}")


def policies(
    pods: Sequence[trace.TracePod],
    *,
    percentage_of_nodes_to_score: int = 100,
    scored: bool = True,
    popularity: float = POPULARITY_THRESHOLD,
) -> dict[str, Policy]:
    """The FGD configurations, expecting the typical task types of `pods` (the trace's own pod list)."""
    mix = workload_mix(pods, popularity=popularity)
    return {
        f"fgd-{tie}-ties": Policy(f"fgd-{tie}-ties", tie, mix, scored, percentage_of_nodes_to_score)
        for tie in TIE_BREAKS
    }


def fragmentation(free_milli: Sequence[int], cpu_free: int, model: str, mix: Mix) -> np.ndarray:
    """One node's fragmentation for each task type of `mix`, in milli of a GPU (the paper's F_n(m))."""
    models = _ModelCodes(mix, [model])
    free = np.asarray([list(free_milli)], dtype=np.int64)
    return _fragmentation(free, np.array([cpu_free]), np.array([models.code(model)]), mix, models)[0]


class _ModelCodes:
    """GPU models as small integers, and which task types each model satisfies."""

    def __init__(self, mix: Mix, models: Sequence[str]) -> None:
        self.codes = {m: i for i, m in enumerate(dict.fromkeys(models))}
        allowed = np.ones((len(mix), len(self.codes)), dtype=bool)
        for t, spec in enumerate(mix.gpu_spec):
            if spec:
                allowed[t] = [m in spec for m in self.codes]
        self.allowed = allowed  # [type, model]

    def code(self, model: str) -> int:
        return self.codes[model]


def _fragmentation(free: np.ndarray, cpu: np.ndarray, model: np.ndarray, mix: Mix, models: _ModelCodes) -> np.ndarray:
    """F[state, type] for states given as free[state, gpu] (milli; a missing GPU is 0), CPU, model."""
    total = free.sum(axis=1)
    widest = free.max(axis=1, initial=0)
    whole_free = (free >= WHOLE).sum(axis=1)
    gpu_fits = np.where(
        mix.num_gpu[None, :] <= 1,
        widest[:, None] >= mix.gpu_milli[None, :],
        whole_free[:, None] >= mix.num_gpu[None, :],
    )
    fits = gpu_fits & (cpu[:, None] >= mix.cpu_milli[None, :]) & models.allowed[:, model].T
    # The free share of each GPU too small for the type's share (a whole GPU for multi-GPU types);
    # computed once per distinct share, the types index into it.
    needs, need_of_type = np.unique(np.minimum(mix.gpu_milli, WHOLE), return_inverse=True)
    stranded = np.stack([np.where(free < need, free, 0).sum(axis=1) for need in needs], axis=1)
    usable = fits & (mix.num_gpu[None, :] > 0)
    return np.where(usable, stranded[:, need_of_type], total[:, None])


class State:
    """The nodes' free CPU, memory and per-GPU shares, and each node's expected fragmentation."""

    def __init__(
        self,
        nodes: Sequence[trace.TraceNode],
        mix: Mix,
        *,
        scored: bool = True,
        percentage_of_nodes_to_score: int = 100,
    ) -> None:
        self.names = [n.name for n in nodes]
        self.mix = mix
        self.scored = scored  # rank nodes by the integer score, not by the exact growth
        self.percentage = percentage_of_nodes_to_score
        self.next_start = 0  # kube-scheduler's nextStartNodeIndex
        self.models = _ModelCodes(mix, [n.model for n in nodes])
        width = max((n.gpus for n in nodes), default=0)
        self.free = np.zeros((len(nodes), max(width, 1)), dtype=np.int64)
        for i, n in enumerate(nodes):
            self.free[i, : n.gpus] = WHOLE
        self.cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.memory = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.model = np.array([self.models.code(n.model) for n in nodes], dtype=np.int64)
        self.name_rank = np.argsort(np.argsort(np.array(self.names, dtype=object)))  # 0 = smallest name
        self.expected = self._expected(self.free, self.cpu, self.model)

    def _expected(self, free: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> np.ndarray:
        """Expected fragmentation per state: sum over types of count x F (milli x pods)."""
        return _fragmentation(free, cpu, model, self.mix, self.models) @ self.mix.count

    def feasible(self, pod: trace.TracePod) -> tuple[np.ndarray, dict[str, int]]:
        """Nodes the default scheduler's filters pass, and per failed filter how many nodes it stopped."""
        checks = {
            "Insufficient cpu": self.cpu >= pod.cpu_milli,
            "Insufficient memory": self.memory >= pod.memory_mib,
        }
        if pod.num_gpu:
            if pod.gpu_spec:
                wanted = [self.models.codes[m] for m in pod.gpu_spec if m in self.models.codes]
                checks["didn't match the pod's GPU model"] = np.isin(self.model, wanted)
            if pod.num_gpu == 1:
                checks["no GPU with the share free"] = self.free.max(axis=1) >= pod.gpu_milli
            else:
                checks["too few whole free GPUs"] = (self.free >= WHOLE).sum(axis=1) >= pod.num_gpu
        ok = np.ones(len(self.names), dtype=bool)
        for mask in checks.values():
            ok &= mask
        return ok, {reason: int((~mask).sum()) for reason, mask in checks.items() if (~mask).any()}

    def candidates(self, pod: trace.TracePod, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Placements to weigh: (node per candidate, free[candidate, gpu] after the placement). A
        share goes on one GPU with room (one candidate per distinct free share: equal GPUs place alike);
        whole GPUs take the lowest-indexed wholly free ones; a CPU-only pod leaves the GPUs as they are."""
        free = self.free[nodes]
        if pod.num_gpu == 0:
            return nodes, free.copy()
        if pod.num_gpu == 1:
            room = free >= pod.gpu_milli
            g = np.arange(free.shape[1])
            same_earlier = (free[:, :, None] == free[:, None, :]) & (g[None, None, :] < g[None, :, None])
            room &= ~(same_earlier & room[:, None, :]).any(axis=2)
            rows, gpus = np.nonzero(room)
            after = free[rows].copy()
            after[np.arange(len(rows)), gpus] -= pod.gpu_milli
            return nodes[rows], after
        whole = free >= WHOLE
        taken = whole & (np.cumsum(whole, axis=1) <= pod.num_gpu)
        return nodes, free - np.where(taken, WHOLE, 0)

    def choose(self, pod: trace.TracePod, tie_break: str, rng: np.random.Generator) -> tuple[int, np.ndarray] | None:
        """(node, its GPUs' free shares after the placement) of least expected-fragmentation growth."""
        ok, _ = self.feasible(pod)
        nodes = self._scored_nodes(ok)
        if len(nodes) == 0:
            return None
        owner, after = self.candidates(pod, nodes)
        grown = self._expected(after, self.cpu[owner] - pod.cpu_milli, self.model[owner]) - self.expected[owner]
        if self.scored:
            # A kube-scheduler score plugin answers an integer 0..100 per node: the growth in GPUs
            # (popularity as shares, so / the pod count) through a falling sigmoid, truncated.
            growth_gpus = grown / (self.mix.count.sum() * WHOLE)
            rank = np.floor(MAX_NODE_SCORE / (1.0 + np.exp(np.clip(growth_gpus, -700, 700))))
        else:
            rank = -grown
        tied = np.flatnonzero(rank == rank.max())
        tied_nodes = np.unique(owner[tied])  # a node's first best candidate is its lowest GPU
        if len(tied_nodes) == 1:
            node = int(tied_nodes[0])
        elif tie_break == "fixed":
            node = int(tied_nodes[np.argmin(self.name_rank[tied_nodes])])
        else:
            node = int(tied_nodes[rng.integers(len(tied_nodes))])
        first = tied[np.flatnonzero(owner[tied] == node)[0]]
        return node, after[first]

    def _scored_nodes(self, feasible: np.ndarray) -> np.ndarray:
        """The feasible nodes kube-scheduler scores: all, or the first enough of them from where the
        last cycle stopped (as scheduler.Scheduler does)."""
        if not feasible.any():
            return np.flatnonzero(feasible)
        wanted = scheduler.nodes_to_find(len(feasible), self.percentage)
        nodes, self.next_start = scheduler.sample_feasible(feasible, self.next_start, wanted)
        return np.sort(nodes)

    def bind(self, node: int, pod: trace.TracePod, free_after: np.ndarray) -> None:
        self.free[node] = free_after
        self.cpu[node] -= pod.cpu_milli
        self.memory[node] -= pod.memory_mib
        i = [node]
        self.expected[node] = self._expected(self.free[i], self.cpu[i], self.model[i])[0]


def replay_fgd(
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    policy: Policy,
    *,
    seed: int,
    placements: bool = False,
    progress: Callable[[int], object] | None = None,
) -> replay.Result:
    """Place `arrivals` in order with FGD; pods never leave, nothing is retried (replay.replay's protocol).
    Granted and requested are the same: a pod holds exactly the share it asked for."""
    started = time.perf_counter()
    started_cpu = time.process_time()
    state = State(
        nodes, policy.mix, scored=policy.scored, percentage_of_nodes_to_score=policy.percentage_of_nodes_to_score
    )
    rng = np.random.default_rng(seed)
    capacity = replay.gpu_capacity_milli(nodes)
    arrived_after = np.zeros(len(arrivals), dtype=np.int64)
    allocated_after = np.zeros(len(arrivals), dtype=np.int64)
    arrived = allocated = placed = failed = 0
    failure_reasons: collections.Counter[str] = collections.Counter()
    records: list[dict[str, Any]] | None = [] if placements else None
    reported = 0
    for i, pod in enumerate(arrivals):
        if progress is not None and i - reported >= replay.PROGRESS_STEP:
            progress(i - reported)
            reported = i
        arrived += pod.gpu_demand_milli
        choice = state.choose(pod, policy.tie_break, rng)
        if choice is None:
            failed += 1
            _, stopped = state.feasible(pod)
            message = f"0/{len(nodes)} nodes are available: " + ", ".join(
                f"{count} {reason}" for reason, count in sorted(stopped.items())
            )
            failure_reasons[message] += 1
            if records is not None:
                records.append(replay.placement_record(pod, "unschedulable", message=message))
        else:
            node, free_after = choice
            held = state.free[node] - free_after
            state.bind(node, pod, free_after)
            placed += 1
            allocated += pod.gpu_demand_milli
            if records is not None:
                records.append(
                    replay.placement_record(
                        pod,
                        "placed",
                        node=state.names[node],
                        shares=_shares(nodes[node], held),
                        granted_gpus=pod.gpu_demand_milli / WHOLE,
                    )
                )
        arrived_after[i] = arrived
        allocated_after[i] = allocated
    if progress is not None:
        progress(len(arrivals) - reported)
    total_gpus = capacity // WHOLE
    gpus = np.concatenate([state.free[i, : n.gpus] for i, n in enumerate(nodes)]) if total_gpus else np.zeros(0)
    granted_gpus = allocated / WHOLE
    curve = replay.allocation_curve(arrived_after, allocated_after, capacity)
    return replay.Result(
        name=policy.name,
        pods=len(arrivals),
        placed_pods=placed,
        failed_pods=failed,
        admission_failures=0,
        denied_pods=0,
        gpu_allocation_ratio=allocated / capacity if capacity else 0.0,
        allocation_curve=curve,
        requested_allocation_ratio=allocated / capacity if capacity else 0.0,
        requested_allocation_curve=list(curve),
        gpus_over_requested=0,
        total_gpus=total_gpus,
        unallocated_gpus=total_gpus - granted_gpus,
        fragmented_gpus=float(gpus[gpus < WHOLE].sum() / WHOLE),  # free share left on GPUs holding a pod
        idle_gpus=int((gpus >= WHOLE).sum()),
        runtime_s=time.perf_counter() - started,
        cpu_s=time.process_time() - started_cpu,
        failure_reasons=dict(failure_reasons.most_common(5)),
        placements=records,
    )


def _shares(node: trace.TraceNode, held: np.ndarray) -> list[node_.GpuShare]:
    """What a pod holds per GPU, as placement records: milli of a 1000-milli GPU (unit 1 'MiB' of 1000)."""
    return [
        node_.GpuShare(
            uuid=f"{node.name}/gpu{g}", units=int(milli), total_units=WHOLE, unit_mib=1, gpu_memory_mib=WHOLE
        )
        for g, milli in enumerate(held[: node.gpus])
        if milli
    ]
