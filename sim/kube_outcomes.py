"""What became of each pod of a replay on the real control plane, as its watch saw it (bound,
admitted or refused by its node, unschedulable, deleted), and the figures a run reports from it:
`KubeResult`, granted allocation, lost pods and why each unplaced pod was left.

May import numpy and the other gpuslice.sim modules.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuslice.sim import kube_nodes, replay, trace

NAMESPACE = "default"


@dataclasses.dataclass
class KubeResult:
    kube: replay.Result  # the run on the real control plane, in the model's terms
    model: replay.Result  # the Python model on the same arrivals and seed, labels seen at once
    model_paced: replay.Result | None  # the model with the labeller's rate limit at the run's pace
    arrival: str
    kubernetes: str  # version
    setup_s: float  # control plane, nodes and webhook up
    arrivals_s: float  # first create sent to last create answered
    unaccounted: list[str]  # pods with no outcome (must be empty)
    label_writes: int
    errors: list[str]
    diagnosis: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    lost_pods: int = 0  # refused by a kubelet and not recreated into a placed or waiting pod
    paced_draws: list[float] = dataclasses.field(default_factory=list)  # every draw's granted ratio
    chaos: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # what --chaos killed, and when
    create_retries: int = 0  # creates sent again after a failed webhook call
    # kube-scheduler exits, each started again (sim/keeper.py): its attempt counts are the last one's
    scheduler_restarts: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def difference_points(self) -> float:
        return 100 * (self.kube.gpu_allocation_ratio - self.model.gpu_allocation_ratio)

    def to_json(self) -> dict[str, Any]:
        return {
            "arrival": self.arrival,
            "kubernetes": self.kubernetes,
            "kube": self.kube.to_json(),
            "model": self.model.to_json(),
            "difference_points": round(self.difference_points, 3),
            "model_paced": self.model_paced.to_json() if self.model_paced else None,
            "model_paced_draws": [round(r, 6) for r in self.paced_draws],
            "pod_interval_s": round(self.kube.runtime_s / max(1, self.kube.pods), 6),
            "setup_s": round(self.setup_s, 1),
            "arrivals_s": round(self.arrivals_s, 1),
            "lost_pods": self.lost_pods,
            "chaos": self.chaos,
            "create_retries": self.create_retries,
            "scheduler_restarts": self.scheduler_restarts,
            "unaccounted": self.unaccounted,
            "label_writes": self.label_writes,
            "errors": self.errors[:20],
            "diagnosis": self.diagnosis,
        }


class Outcomes:
    """Every arrival's fate as the API server shows it: denied at create, bound and then admitted or
    refused by its node, or marked unschedulable by the scheduler (PodScheduled False)."""

    def __init__(self, fleet: kube_nodes.Fleet) -> None:
        self.fleet = fleet
        self.denied: dict[str, str] = {}  # pod key -> the API server's answer to its create
        self.unschedulable: dict[str, str] = {}  # pod key -> the scheduler's message
        self.pinned: dict[str, str] = {}  # unschedulable pod -> the GPU memory classes its affinity requires
        self.created: set[str] = set()
        self.written: set[str] = set()  # bound pods whose kubelet status the watch has shown
        self.created_at: dict[str, float] = {}  # when the create was answered (the webhook had it)
        self.stored: dict[str, int] = {}  # pod key -> resourceVersion of its create: the order it was stored in
        self.first_outcome_at: dict[str, float] = {}  # first bound or marked unschedulable (or denied)
        self.errors: list[str] = []
        self.create_retries = 0  # creates sent again after a failed webhook call
        # Refused pods the controller created again, until the new pod has an outcome: without
        # this a run could end, quiet, while a late requeue waits for its backoff or the
        # scheduler, and count the pod lost.
        self.recreated: set[str] = set()
        self.last_change = time.monotonic()
        self._waiters: dict[str, asyncio.Future[None]] = {}
        fleet.listeners.append(self._on_decision)

    def settled(self, key: str) -> bool:
        if key in self.recreated:
            return False
        return key in self.denied or key in self.fleet.decisions or key in self.unschedulable

    def seen(self, key: str) -> bool:
        """Settled as the scheduler sees it: a refused pod frees its room only once it is Failed."""
        return key in self.denied or key in self.written or key in self.unschedulable

    def waiter(self, key: str) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        if self.seen(key):
            future.set_result(None)
        else:
            self._waiters[key] = future
        return future

    def deny(self, key: str, message: str = "") -> None:
        """The create was refused: the pod never reaches the scheduler."""
        self.denied[key] = message
        self._wake(key)

    def _wake(self, key: str) -> None:
        self.last_change = time.monotonic()
        self.first_outcome_at.setdefault(key, self.last_change)
        future = self._waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _on_decision(self, decision: kube_nodes.Decision) -> None:
        self.recreated.discard(decision.pod)
        self.last_change = time.monotonic()
        self.first_outcome_at.setdefault(decision.pod, self.last_change)

    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if (pod.get("spec") or {}).get("nodeName"):
            if (pod.get("status") or {}).get("phase") in ("Running", "Failed") and key not in self.written:
                self.written.add(key)
                self._wake(key)
            return
        refused = self.fleet.decisions.get(key)
        if kind == "ADDED" and refused is not None and not refused.admitted:
            self.recreated.add(key)  # requeued (controller/requeue.py): its new outcome is awaited
            self.last_change = time.monotonic()
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") != "SchedulingGated"  # waiting for the pacer, not an outcome
            ):
                if key not in self.unschedulable or key in self.recreated:
                    self.recreated.discard(key)
                    self.unschedulable[key] = str(condition.get("message") or condition.get("reason") or "")
                    self.pinned[key] = _required_classes(pod, self.fleet.contract.label_gpu_memory_mib)
                    self._wake(key)


def _required_classes(pod: Mapping[str, Any], key: str) -> str:
    """The GPU memory classes (MiB) a pod's required node affinity allows, "" when it names none."""
    required = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    values: set[str] = set()
    for term in required.get("nodeSelectorTerms") or ():
        for expression in term.get("matchExpressions") or ():
            if expression.get("key") == key and expression.get("operator") == "In":
                values.update(expression.get("values") or ())
    return ",".join(sorted(values, key=int)) if all(v.isdigit() for v in values) else ",".join(sorted(values))


def diagnosis(
    outcomes: Outcomes, fleet: kube_nodes.Fleet, arrivals: Sequence[trace.TracePod] = ()
) -> dict[str, dict[str, int]]:
    """Where a run lost GPUs: unschedulable pods by the GPU class their affinity pins them to, GPUs
    left without any pod by class (MiB), and of those the ones on a node where a waiting pod (of
    `arrivals`) would fit, by its CPU, memory, GPU model and count (the rest are stranded behind
    the node's CPU or memory, which no steering can use), and of these the ones whose class such a
    pod's affinity allows (the others a different class choice would have used)."""
    idle: collections.Counter[str] = collections.Counter()
    idle_on: dict[str, list[int]] = collections.defaultdict(list)  # node -> its idle GPUs' memory
    for name, sim in fleet.sims.items():
        for gpu in sim.node.memory_gpus:
            if not fleet.gpu_in_use(name, gpu):
                idle[str(gpu.memory_mib)] += 1
                idle_on[name].append(gpu.memory_mib)
    placed = set(k for k, d in fleet.decisions.items() if d.admitted)
    pinned = collections.Counter(
        v or "none" for k, v in outcomes.pinned.items() if k not in placed and k not in fleet.decisions
    )
    waiting = [
        p
        for p in arrivals
        if p.num_gpu and f"{NAMESPACE}/{p.name}" in outcomes.unschedulable and f"{NAMESPACE}/{p.name}" not in placed
    ]
    usable: collections.Counter[str] = collections.Counter()
    as_pinned: collections.Counter[str] = collections.Counter()
    for name, memory in idle_on.items():
        cpu, host_memory = fleet.headroom(name)
        model = fleet.trace_nodes[name].model
        fitting = [
            p
            for p in waiting
            if p.cpu_milli <= cpu
            and p.memory_mib <= host_memory
            and p.num_gpu <= len(memory)
            and (not p.gpu_spec or model in p.gpu_spec)
        ]
        if fitting:
            usable.update(str(m) for m in memory)
        # The GPU classes each fitting pod's affinity allows ("" for none: any).
        allowed = [outcomes.pinned.get(f"{NAMESPACE}/{p.name}", "") for p in fitting]
        as_pinned.update(str(m) for m in memory if any(not a or str(m) in a.split(",") for a in allowed))
    return {
        "unschedulable_by_class": dict(pinned.most_common()),
        "idle_gpus_by_class": dict(idle.most_common()),
        "idle_gpus_a_waiting_pod_fits_by_class": dict(usable.most_common()),
        "idle_gpus_a_waiting_pod_fits_as_pinned_by_class": dict(as_pinned.most_common()),
    }


def figures(
    name: str,
    arrivals: Sequence[trace.TracePod],
    outcomes: Outcomes,
    fleet: kube_nodes.Fleet,
    capacity: int,
    wall: float,
    cpu: float,
    *,
    placements: bool = False,
) -> tuple[replay.Result, list[str], int]:
    """(the run in the model's terms, pods with no outcome, pods lost). `admission_failures` counts
    every refusal by a kubelet; a refused pod the controller's requeuer recreated is judged by what
    became of the new one, and only a pod whose last outcome is a refusal is lost. `placements`:
    also each pod's line of --placements (Result.placements), from what the node plugins granted."""
    placed = lost = failed = denied = 0
    requested = arrived = 0
    granted = 0.0  # GPUs' worth granted: the headline, as in the model
    arrived_after = np.zeros(len(arrivals), dtype=np.int64)
    requested_after = np.zeros(len(arrivals), dtype=np.int64)
    granted_after = np.zeros(len(arrivals), dtype=np.float64)
    failure_reasons: collections.Counter[str] = collections.Counter()
    admission_reasons: collections.Counter[str] = collections.Counter()
    unaccounted = []
    records: list[dict[str, Any]] | None = [] if placements else None
    line: dict[str, Any]  # placement_record's arguments for the pod's outcome
    for i, pod in enumerate(arrivals):
        key = f"{NAMESPACE}/{pod.name}"
        arrived += pod.gpu_demand_milli
        decision = fleet.decisions.get(key)
        if decision is not None and decision.admitted:
            placed += 1
            requested += pod.gpu_demand_milli
            granted += decision.granted
            line = {
                "outcome": "placed",
                "node": decision.node,
                "shares": decision.shares,
                "granted_gpus": decision.granted,
                "claim_requests": decision.claim_requests,
                "claim_alternatives": decision.claim_alternatives,
            }
        elif key in outcomes.unschedulable:  # waiting (a requeued pod too, once the scheduler gave up)
            failed += 1
            failure_reasons[outcomes.unschedulable[key][:160]] += 1
            line = {"outcome": "unschedulable", "message": outcomes.unschedulable[key]}
        elif decision is not None:  # refused, and not recreated (or refused every time): lost
            lost += 1
            admission_reasons[replay._reason_kind(decision.message)] += 1
            line = {"outcome": "refused", "node": decision.node, "message": f"kubelet: {decision.message}"}
        elif key in outcomes.denied:
            denied += 1
            line = {"outcome": "denied", "message": outcomes.denied[key]}
        else:
            unaccounted.append(key)
            line = {"outcome": "unaccounted", "message": "no outcome seen"}
        if records is not None:  # the line is built only when asked for (its GPUs as JSON)
            records.append(replay.placement_record(pod, **line))
        arrived_after[i] = arrived
        requested_after[i] = requested
        granted_after[i] = granted
    total_gpus = capacity // 1000
    in_use = fleet.gpus_in_use()
    result = replay.Result(
        name=name,
        pods=len(arrivals),
        placed_pods=placed,
        failed_pods=failed,
        admission_failures=fleet.refusals,
        denied_pods=denied,
        gpu_allocation_ratio=granted / total_gpus if total_gpus else 0.0,
        allocation_curve=replay.allocation_curve(arrived_after, granted_after * 1000, capacity),
        requested_allocation_ratio=requested / capacity if capacity else 0.0,
        requested_allocation_curve=replay.allocation_curve(arrived_after, requested_after, capacity),
        gpus_over_requested=0,  # not tracked by the kube replay (the model reports it)
        total_gpus=total_gpus,
        unallocated_gpus=total_gpus - granted,
        fragmented_gpus=in_use - granted,
        idle_gpus=total_gpus - in_use,
        runtime_s=wall,
        cpu_s=cpu,
        failure_reasons=dict(failure_reasons.most_common(5)),
        admission_reasons=dict(admission_reasons.most_common(5)),
        placements=records,
    )
    return result, unaccounted, lost
