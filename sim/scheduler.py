"""A model of the stock kube-scheduler for the resources and labels gpuslice uses: the
NodeResourcesFit filter (cpu, memory, extended resources), required and preferred node affinity
(In, NotIn, Exists, DoesNotExist, Gt, Lt), the scoring strategies LeastAllocated, MostAllocated and
RequestedToCapacityRatio, NodeResourcesBalancedAllocation, the adaptive percentage of nodes to score
and the random choice among equal top scores. Formulas and weights: kube-scheduler-scoring.md
(our reference notes) and docs/simulator.md.

Speed: state lives in numpy arrays over nodes (allocatable and requested per resource, label values
as category codes and integers), so one pod is a handful of vector operations; Python objects are
touched only for the chosen node. Imports numpy, gpuslice.quantity (the one quantity parser),
gpuslice.podrequests (the one rule for what a pod requests) and gpuslice.affinity (the one node
affinity matcher: the vectorised filter here is tested against it).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuslice import affinity, podrequests, quantity

__all__ = [
    "MAX_NODE_SCORE",
    "Cluster",
    "Decision",
    "PodRequest",
    "PodSpecError",
    "Profile",
    "Scheduler",
    "binpack_profile",
    "default_profile",
    "nodes_to_find",
    "read_pod",
    "sample_feasible",
]

MAX_NODE_SCORE = 100
# Containers without a cpu / memory request count as this much for scoring (kube's NonZeroRequested).
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
# Below this many nodes kube-scheduler scores every feasible node.
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5

CPU = "cpu"
MEMORY = "memory"


class PodSpecError(ValueError):
    """The pod cannot be read: a bad quantity or affinity, named in the message."""


# --- what the scheduler reads from a pod -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodRequest:
    name: str
    requests: Mapping[str, int]  # cpu in milli, memory in bytes, extended resources in units
    nonzero_cpu: int
    nonzero_memory: int
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    required_terms: tuple[tuple[affinity.Requirement, ...], ...] | None = None  # ORed terms of ANDed requirements
    preferred_terms: tuple[tuple[int, tuple[affinity.Requirement, ...]], ...] = ()
    scheduler_name: str = "default-scheduler"
    # Per-container requests of extended resources, for kubelet's device manager.
    container_devices: tuple[tuple[str, Mapping[str, int]], ...] = ()


def _amount(resource: str, value: Any, where: str) -> int:
    try:
        parsed = quantity.parse(value)
    except quantity.QuantityError:
        raise PodSpecError(f"{where}: {resource} quantity {value!r} is not a Kubernetes quantity") from None
    if parsed < 0:
        raise PodSpecError(f"{where}: {resource} quantity {value!r} is negative")
    if resource == CPU:
        return math.ceil(parsed * 1000)
    return math.ceil(parsed)


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, int]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    # The API server defaults an unset request to the limit; extended resources are limits-only.
    merged = {**limits, **requests}
    return {name: _amount(name, value, where) for name, value in merged.items()}


def _keys(amounts: Any) -> set[str]:
    return {str(k) for k in amounts} if isinstance(amounts, Mapping) else set()


def read_pod(pod: Mapping[str, Any]) -> PodRequest:
    """What kube-scheduler reads from a pod manifest (requests, node selector, node affinity).

    Requests are counted by gpuslice.podrequests, the rule the webhook, labeller and pacer share
    (sidecars, pod-level requests, overhead); for scoring, a container's missing CPU or memory
    request counts as kube's non-zero default, before pod-level requests replace the sum."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    name = metadata.get("name", "?")
    init_names = {c.get("name") for c in spec.get("initContainers") or () if isinstance(c, Mapping)}
    by_name: dict[str, dict[str, int]] = {}  # the API server keeps container names unique in a pod

    def parsed(container: Mapping[str, Any]) -> dict[str, int]:
        key = container.get("name")
        if isinstance(key, str) and key in by_name:
            return by_name[key]
        kind = "init container" if key in init_names else "container"
        amounts = _container_requests(container, f"pod {name} {kind} {key}")
        if isinstance(key, str):
            by_name[key] = amounts
        return amounts

    def nonzero(container: Mapping[str, Any]) -> dict[str, int]:
        amounts = parsed(container)
        return {CPU: amounts.get(CPU, DEFAULT_MILLI_CPU_REQUEST), MEMORY: amounts.get(MEMORY, DEFAULT_MEMORY_REQUEST)}

    def read(resource: str, value: Any) -> int:
        return _amount(resource, value, f"pod {name} pod-level requests or overhead")

    pod_level = spec.get("resources")
    pod_level_requests = pod_level.get("requests") if isinstance(pod_level, Mapping) else None
    names = _keys(pod_level_requests) | _keys(spec.get("overhead"))
    totals = podrequests.new_pod(spec, parsed, read, names)
    nonzero_totals = podrequests.new_pod(spec, nonzero, read, names)
    devices = []
    for container in spec.get("containers") or ():
        extended = {r: n for r, n in parsed(container).items() if r not in (CPU, MEMORY, "ephemeral-storage") and n > 0}
        if extended:
            devices.append((str(container.get("name")), extended))

    try:
        required_terms = affinity.required_terms(spec, checked=True)
    except affinity.AffinityError as exc:
        raise PodSpecError(f"pod {name} required node affinity: {exc}") from None
    preferred = []
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    for entry in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ():
        weight = int(entry.get("weight", 0))
        if not 1 <= weight <= 100:
            raise PodSpecError(f"pod {name}: preferred node affinity weight must be 1..100, got {weight}")
        try:
            preferred.append((weight, affinity.term(entry.get("preference") or {}, checked=True)))
        except affinity.AffinityError as exc:
            raise PodSpecError(f"pod {name} preferred node affinity: {exc}") from None
    return PodRequest(
        name=name,
        requests={r: n for r, n in totals.items() if n > 0},
        nonzero_cpu=nonzero_totals[CPU],
        nonzero_memory=nonzero_totals[MEMORY],
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        required_terms=required_terms,
        preferred_terms=tuple(preferred),
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        container_devices=tuple(devices),
    )


# --- scheduling profiles --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Profile:
    """One KubeSchedulerConfiguration profile, as far as it differs between nodes here.

    TaintToleration, PodTopologySpread, InterPodAffinity and ImageLocality give every node the same
    score in the simulator (no taints, spread constraints, pod affinity or images), so they are left out.
    """

    name: str
    strategy: str = "LeastAllocated"  # or MostAllocated, RequestedToCapacityRatio
    resources: tuple[tuple[str, int], ...] = ((CPU, 1), (MEMORY, 1))
    # RequestedToCapacityRatio shape: (utilization 0..100, score 0..10) points.
    shape: tuple[tuple[int, int], ...] = ((0, 0), (100, 10))
    balanced_resources: tuple[str, ...] = (CPU, MEMORY)
    fit_weight: int = 1
    balanced_weight: int = 1
    affinity_weight: int = 2
    # 0: kube-scheduler's adaptive default (50% - nodes/125, at least 5%); 100: score every feasible node.
    percentage_of_nodes_to_score: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in ("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"):
            raise ValueError(f"profile {self.name}: unknown scoring strategy {self.strategy!r}")
        if any(not 1 <= w <= 100 for _, w in self.resources):
            raise ValueError(f"profile {self.name}: resource weights must be 1..100")


def default_profile(**overrides: Any) -> Profile:
    return Profile(name="default-scheduler", **overrides)


def binpack_profile(gpu_memory_resource: str, strategy: str = "MostAllocated", **overrides: Any) -> Profile:
    """The chart's `gpuslice-binpack` profile: cpu 1, memory 1, gpu-memory 10."""
    return Profile(
        name="gpuslice-binpack",
        strategy=strategy,
        resources=((CPU, 1), (MEMORY, 1), (gpu_memory_resource, 10)),
        **overrides,
    )


# --- cluster state ---------------------------------------------------------------------------


class _Labels:
    """Node labels as columns: a category code per value (In/NotIn/Exists) and an integer (Gt/Lt).

    `match` is gpuslice.affinity's Requirement.matches over every node at once (tests hold the
    two equal): a label is an integer for Gt/Lt when affinity.integer reads one."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.codes: dict[str, np.ndarray] = {}
        self.ints: dict[str, np.ndarray] = {}
        self.numeric: dict[str, np.ndarray] = {}  # whether the node's label is an integer
        self.vocab: dict[str, dict[str, int]] = {}
        self.of_node: list[dict[str, str]] = [{} for _ in range(count)]

    def _column(self, key: str) -> None:
        self.codes[key] = np.full(self.count, -1, dtype=np.int32)
        self.ints[key] = np.zeros(self.count, dtype=np.int64)
        self.numeric[key] = np.zeros(self.count, dtype=bool)
        self.vocab[key] = {}

    def set(self, node: int, labels: Mapping[str, str]) -> None:
        old = self.of_node[node]
        for key in old.keys() - labels.keys():
            self.codes[key][node] = -1
            self.numeric[key][node] = False
        for key, value in labels.items():
            if old.get(key) == value:
                continue
            if key not in self.codes:
                self._column(key)
            vocab = self.vocab[key]
            self.codes[key][node] = vocab.setdefault(value, len(vocab))
            number = affinity.integer(value)
            self.numeric[key][node] = number is not None
            self.ints[key][node] = 0 if number is None else number
        self.of_node[node] = dict(labels)

    def match(self, requirement: affinity.Requirement, names: Sequence[str]) -> np.ndarray:
        if requirement.field:
            if requirement.key != affinity.NODE_NAME_FIELD or requirement.operator not in ("In", "NotIn"):
                return np.zeros(self.count, dtype=bool)
            hit = np.isin(np.asarray(names), requirement.values)
            return hit if requirement.operator == "In" else ~hit
        key, operator = requirement.key, requirement.operator
        if key not in self.codes:
            return np.full(self.count, operator in ("NotIn", "DoesNotExist"))
        codes = self.codes[key]
        if operator in ("In", "NotIn"):
            vocab = self.vocab[key]
            wanted = [vocab[v] for v in requirement.values if v in vocab]
            hit = np.isin(codes, wanted) if wanted else np.zeros(self.count, dtype=bool)
            return hit if operator == "In" else ~hit
        if operator == "Exists":
            return codes >= 0
        if operator == "DoesNotExist":
            return codes < 0
        bound = affinity.integer(requirement.values[0]) if len(requirement.values) == 1 else None
        if operator not in ("Gt", "Lt") or bound is None:
            return np.zeros(self.count, dtype=bool)
        ints = self.ints[key]
        return self.numeric[key] & (ints > bound if operator == "Gt" else ints < bound)


class Cluster:
    """Nodes as the scheduler's cache sees them: allocatable, requested and labels."""

    def __init__(
        self,
        names: Sequence[str],
        allocatable: Sequence[Mapping[str, int]],
        labels: Sequence[Mapping[str, str]],
    ) -> None:
        if not (len(names) == len(allocatable) == len(labels)):
            raise ValueError("names, allocatable and labels must have one entry per node")
        self.names = list(names)
        self.count = len(names)
        resources = [CPU, MEMORY] + sorted({r for a in allocatable for r in a} - {CPU, MEMORY})
        self.column = {r: i for i, r in enumerate(resources)}
        self.allocatable = np.zeros((self.count, len(resources)), dtype=np.int64)
        for i, amounts in enumerate(allocatable):
            for resource, amount in amounts.items():
                self.allocatable[i, self.column[resource]] = amount
        self.requested = np.zeros_like(self.allocatable)
        # cpu and memory as scoring counts them (NonZeroRequested).
        self.nonzero = np.zeros((self.count, 2), dtype=np.int64)
        self.labels = _Labels(self.count)
        for i, node_labels in enumerate(labels):
            self.labels.set(i, node_labels)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def set_labels(self, node: int, labels: Mapping[str, str]) -> None:
        self.labels.set(node, labels)

    def headroom(self, node: int) -> tuple[int, int]:
        """(CPU millicores, memory MiB) of the node's allocatable that no pod has requested."""
        free = self.allocatable[node] - self.requested[node]
        return int(free[self.column[CPU]]), int(free[self.column[MEMORY]]) // 2**20

    def bind(self, node: int, pod: PodRequest) -> None:
        """Account the pod on the node (kube-scheduler's assume, then the bind)."""
        for resource, amount in pod.requests.items():
            column = self.column.get(resource)
            if column is not None:
                self.requested[node, column] += amount
        self.nonzero[node, 0] += pod.nonzero_cpu
        self.nonzero[node, 1] += pod.nonzero_memory

    def unbind(self, node: int, pod: PodRequest) -> None:
        for resource, amount in pod.requests.items():
            column = self.column.get(resource)
            if column is not None:
                self.requested[node, column] -= amount
        self.nonzero[node, 0] -= pod.nonzero_cpu
        self.nonzero[node, 1] -= pod.nonzero_memory

    # --- filter ---------------------------------------------------------------------------

    def affinity_mask(self, pod: PodRequest) -> np.ndarray:
        """NodeAffinity filter: nodeSelector AND (any required term)."""
        mask = np.ones(self.count, dtype=bool)
        for key, value in pod.node_selector.items():
            mask &= self.labels.match(affinity.Requirement(key, "In", (value,)), self.names)
        if pod.required_terms is not None:
            any_term = np.zeros(self.count, dtype=bool)
            for term in pod.required_terms:
                if term:  # an empty term matches no node
                    any_term |= self._term_mask(term)
            mask &= any_term
        return mask

    def _term_mask(self, term: Sequence[affinity.Requirement]) -> np.ndarray:
        mask = np.ones(self.count, dtype=bool)
        for requirement in term:
            mask &= self.labels.match(requirement, self.names)
        return mask

    def fit_masks(self, pod: PodRequest) -> dict[str, np.ndarray]:
        """NodeResourcesFit: per requested resource, the nodes where it does NOT fit."""
        short = {}
        for resource, amount in pod.requests.items():
            column = self.column.get(resource)
            if column is None:
                short[resource] = np.ones(self.count, dtype=bool)
                continue
            free = self.allocatable[:, column] - self.requested[:, column]
            short[resource] = amount > free
        return short

    # --- score ----------------------------------------------------------------------------

    def fit_score(self, pod: PodRequest, nodes: np.ndarray, profile: Profile) -> np.ndarray:
        total = np.zeros(len(nodes), dtype=np.int64)
        weights = np.zeros(len(nodes), dtype=np.int64)
        rtcr = profile.strategy == "RequestedToCapacityRatio"
        for resource, weight in profile.resources:
            column = self.column.get(resource)
            if resource not in (CPU, MEMORY) and (column is None or pod.requests.get(resource, 0) == 0):
                continue  # an extended resource the pod does not request is left out of both sums
            if column is None:
                continue
            alloc = self.allocatable[nodes, column]
            if resource == CPU:
                requested = self.nonzero[nodes, 0] + pod.nonzero_cpu
            elif resource == MEMORY:
                requested = self.nonzero[nodes, 1] + pod.nonzero_memory
            else:
                requested = self.requested[nodes, column] + pod.requests[resource]
            present = alloc != 0
            safe = np.where(present, alloc, 1)
            if profile.strategy == "LeastAllocated":
                score = np.where(requested > alloc, 0, (alloc - requested) * MAX_NODE_SCORE // safe)
            elif profile.strategy == "MostAllocated":
                score = np.minimum(requested, alloc) * MAX_NODE_SCORE // safe
            else:
                utilization = np.where(requested > alloc, 100, requested * 100 // safe)
                score = _shape_score(utilization, profile.shape)
                present = present & (score > 0)  # RequestedToCapacityRatio leaves zero scores out
            total += np.where(present, score * weight, 0)
            weights += np.where(present, weight, 0)
        if rtcr:
            return np.where(weights > 0, np.round(total / np.maximum(weights, 1)), 0).astype(np.int64)
        return np.where(weights > 0, total // np.maximum(weights, 1), 0)

    def balanced_score(self, pod: PodRequest, nodes: np.ndarray, profile: Profile) -> np.ndarray:
        """NodeResourcesBalancedAllocation as kube-scheduler 1.37 scores it: how much the pod changes
        the node's balance. balance = (1 - std of the requested/allocatable fractions) x 100, truncated,
        with and without the pod; score = 50 + (50 + with - without) / 2 in Go's integer division. A
        pod that requests none of the resources is not scored (PreScore skips it: 0 everywhere)."""
        fractions_with = []
        fractions_without = []
        asked = False
        for resource in profile.balanced_resources:
            column = self.column.get(resource)
            if column is None:
                continue
            asked = asked or pod.requests.get(resource, 0) > 0
            alloc = self.allocatable[nodes, column]
            allocated = self.requested[nodes, column]
            ok = alloc > 0
            safe = np.where(ok, alloc, 1)
            fractions_with.append(
                np.where(ok, np.minimum((allocated + pod.requests.get(resource, 0)) / safe, 1.0), np.nan)
            )
            fractions_without.append(np.where(ok, np.minimum(allocated / safe, 1.0), np.nan))
        if not asked:
            return np.zeros(len(nodes), dtype=np.int64)
        change = _balance(np.vstack(fractions_with)) - _balance(np.vstack(fractions_without))
        half = MAX_NODE_SCORE // 2
        total = half + change
        return half + np.sign(total) * (np.abs(total) // 2)  # Go's division truncates toward zero

    def affinity_score(self, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
        """NodeAffinity score: matched preferred weights, normalised so the best node gets 100."""
        if not pod.preferred_terms:
            return np.zeros(len(nodes), dtype=np.int64)
        raw = np.zeros(len(nodes), dtype=np.int64)
        for weight, term in pod.preferred_terms:
            if term:
                raw += np.where(self._term_mask(term)[nodes], weight, 0)
        best = raw.max(initial=0)
        return raw * MAX_NODE_SCORE // best if best > 0 else raw


def _balance(fractions: np.ndarray) -> np.ndarray:
    """kube's balancedResourceScore per node (column): (1 - std of the fractions) x 100, truncated; NaN
    marks a resource the node does not have. Two fractions: |a - b| / 2, as Go computes it."""
    present = ~np.isnan(fractions)
    count = present.sum(axis=0)
    values = np.where(present, fractions, 0.0)
    mean = values.sum(axis=0) / np.maximum(count, 1)
    spread = np.sqrt(np.where(present, (values - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count, 1))
    if fractions.shape[0] == 2:
        pair = np.abs(values[0] - values[1]) / 2
        spread = np.where(count == 2, pair, spread)
    spread = np.where(count >= 2, spread, 0.0)
    return ((1.0 - spread) * MAX_NODE_SCORE).astype(np.int64)


def _shape_score(utilization: np.ndarray, shape: Sequence[tuple[int, int]]) -> np.ndarray:
    """kube's broken-linear function over (utilization, score 0..10) points, scores scaled to 0..100."""
    points = [(u, s * MAX_NODE_SCORE // 10) for u, s in shape]
    result = np.full(utilization.shape, points[-1][1], dtype=np.int64)
    done = np.zeros(utilization.shape, dtype=bool)
    first_u, first_s = points[0]
    below = utilization < first_u
    result[below] = first_s
    done |= below
    for (u0, s0), (u1, s1) in itertools.pairwise(points):
        inside = ~done & (utilization <= u1)
        step = (s1 - s0) * (utilization[inside] - u0)
        # Go's integer division truncates toward zero (numpy's // floors): matters on falling shapes.
        result[inside] = s0 + np.sign(step) * (np.abs(step) // (u1 - u0))
        done |= inside
    return result


# --- the scheduling cycle --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    node: int | None  # index into Cluster.names, None when unschedulable
    message: str = ""  # kube-scheduler's FailedScheduling summary when unschedulable
    feasible: int = 0
    score: int = 0


def nodes_to_find(count: int, percentage_of_nodes_to_score: int) -> int:
    """How many feasible nodes kube-scheduler scores out of `count` (percentageOfNodesToScore; 0
    is its adaptive default)."""
    if count < MIN_FEASIBLE_NODES_TO_FIND or percentage_of_nodes_to_score >= 100:
        return count
    percentage = percentage_of_nodes_to_score
    if percentage <= 0:
        percentage = max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND, 50 - count // 125)
    return max(MIN_FEASIBLE_NODES_TO_FIND, count * percentage // 100)


def sample_feasible(feasible: np.ndarray, next_start: int, wanted: int) -> tuple[np.ndarray, int]:
    """(the first `wanted` feasible nodes in scan order, the next cycle's start): filtering stops
    once enough feasible nodes are found, starting where the last cycle stopped."""
    count = len(feasible)
    order = (next_start + np.arange(count)) % count
    positions = np.flatnonzero(feasible[order])
    if len(positions) > wanted:
        processed = int(positions[wanted - 1]) + 1
        nodes = order[positions[:wanted]]
    else:
        processed = count
        nodes = order[positions]
    return nodes, (next_start + processed) % count


class Scheduler:
    """One scheduler profile over one Cluster; `schedule` is the filter + score + select of one cycle."""

    def __init__(self, cluster: Cluster, profile: Profile, rng: np.random.Generator) -> None:
        self.cluster = cluster
        self.profile = profile
        self.rng = rng
        self.next_start = 0  # kube-scheduler's nextStartNodeIndex: filtering starts where it stopped

    def nodes_to_find(self) -> int:
        return nodes_to_find(self.cluster.count, self.profile.percentage_of_nodes_to_score)

    def schedule(self, pod: PodRequest) -> Decision:
        cluster = self.cluster
        affinity_ok = cluster.affinity_mask(pod)
        short = cluster.fit_masks(pod)
        feasible = affinity_ok.copy()
        for mask in short.values():
            feasible &= ~mask
        if not feasible.any():
            return Decision(None, self._unschedulable(affinity_ok, short))

        nodes, self.next_start = sample_feasible(feasible, self.next_start, self.nodes_to_find())

        if len(nodes) == 1:
            return Decision(int(nodes[0]), feasible=1)
        profile = self.profile
        total = profile.fit_weight * cluster.fit_score(pod, nodes, profile)
        total = total + profile.balanced_weight * cluster.balanced_score(pod, nodes, profile)
        total = total + profile.affinity_weight * cluster.affinity_score(pod, nodes)
        best = total.max()
        top = nodes[total == best]
        chosen = int(top[self.rng.integers(len(top))]) if len(top) > 1 else int(top[0])
        return Decision(chosen, feasible=len(nodes), score=int(best))

    def _unschedulable(self, affinity_ok: np.ndarray, short: Mapping[str, np.ndarray]) -> str:
        """'0/N nodes are available: ...' as kube-scheduler words it (affinity is filtered first)."""
        reasons = []
        mismatched = int((~affinity_ok).sum())
        if mismatched:
            reasons.append(f"{mismatched} node(s) didn't match Pod's node affinity/selector")
        for resource, mask in sorted(short.items()):
            count = int((mask & affinity_ok).sum())
            if count:
                reasons.append(f"{count} Insufficient {resource}")
        return f"0/{self.cluster.count} nodes are available: " + ", ".join(sorted(reasons)) + "."
