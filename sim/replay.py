"""The packing replay: trace pods through the real webhook conversion, the scheduler model and
the simulated nodes' kubelet + real device-plugin allocation, with the FGD paper's protocol
(shuffle with a seed, resample to a share of cluster GPU capacity, no deletions, no retries).

For every pod of a gpuslice configuration:
  user manifest (trace.user_pod) -> webhook mutation.mutate (real) -> JSON patch applied (jsonpatch)
  -> scheduler.Scheduler.schedule -> node.SimNode.admit (kubelet model + real allocation policy)
  -> bind -> the node's new labels reach the webhook's ClusterView and the scheduler's node
     objects after the configured delay (binds and/or simulated seconds).

May import numpy, jsonpatch, gpuslice.config/contract, gpuslice.deviceplugin, gpuslice.webhook
and the other gpuslice.sim modules.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonpatch
import numpy as np

from gpuslice import config
from gpuslice import contract as contract_
from gpuslice.node import labels as node_labels_
from gpuslice.sim import node as node_
from gpuslice.sim import scheduler, trace
from gpuslice.webhook import cluster as cluster_
from gpuslice.webhook import conversions, mutation

__all__ = [
    "CONFIGURATION_NAMES",
    "Configuration",
    "LabelDelay",
    "Result",
    "allocation_curve",
    "configurations",
    "placement_record",
    "replay",
    "workload",
]

CONFIGURATION_NAMES = ("whole-gpu", "gpuslice-default", "gpuslice-binpack")
_MIB = 1024 * 1024
PROGRESS_STEP = 256  # pods between progress calls: a bar moves smoothly, the loop pays almost nothing


@dataclasses.dataclass(frozen=True)
class Configuration:
    name: str
    sharing: bool  # False: stock Kubernetes with NVIDIA's whole-GPU resource
    profile: scheduler.Profile
    settings: config.Config  # what the webhook runs with


def configurations(
    settings: config.Config, *, percentage_of_nodes_to_score: int = 0, binpack_strategy: str = "MostAllocated"
) -> dict[str, Configuration]:
    """The three compared configurations; trace pods ask for whole GPUs with nvidia.com/gpu, so the
    webhook converts them (convertWholeGpus on)."""
    gpuslice_settings = dataclasses.replace(settings, convert_whole_gpus=True)
    default = scheduler.default_profile(percentage_of_nodes_to_score=percentage_of_nodes_to_score)
    binpack = scheduler.binpack_profile(
        settings.contract.gpu_memory_resource,
        strategy=binpack_strategy,
        percentage_of_nodes_to_score=percentage_of_nodes_to_score,
    )
    return {
        "whole-gpu": Configuration("whole-gpu", False, default, settings),
        "gpuslice-default": Configuration("gpuslice-default", True, default, gpuslice_settings),
        "gpuslice-binpack": Configuration(
            "gpuslice-binpack", True, binpack, dataclasses.replace(gpuslice_settings, scheduler_name="gpuslice-binpack")
        ),
    }


@dataclasses.dataclass(frozen=True)
class LabelDelay:
    """How late a node's new labels reach the webhook and the scheduler after a bind: once at least
    `binds` further binds and `seconds` of simulated time (pods arrive `pod_interval_seconds` apart)
    have passed. Zero and zero: at once.

    `min_interval_seconds` > 0 adds the labeller's rate limit (node/labeller.py): a node's
    labels are written at most once per interval; a change inside the interval waits for its end,
    and what is written then is the node's latest state.

    `webhook_interval_seconds`: pods pass the webhook this far apart, ahead of the scheduler, as
    when they are created faster than they are scheduled (a burst); 0: all before the first is
    scheduled, with the labels the nodes had at the start. None: each right before its scheduling."""

    binds: int = 0
    seconds: float = 0.0
    pod_interval_seconds: float = 1.0
    min_interval_seconds: float = 0.0
    webhook_interval_seconds: float | None = None
    scheduled_at: tuple[float, ...] | None = None
    converted_at: tuple[float, ...] | None = None


@dataclasses.dataclass
class Result:
    name: str
    pods: int
    placed_pods: int
    failed_pods: int  # no feasible node (FailedScheduling)
    admission_failures: int  # scheduled, then refused by kubelet (Allocate / device manager)
    denied_pods: int  # refused by the webhook
    # Granted: GPU memory kubelet handed out (units x unit size / the GPU's memory, per GPU, at most
    # one GPU each), over the GPUs. The headline: a gpu-fraction pod gets floor(f x units), less than f.
    gpu_allocation_ratio: float  # 0..1 at the end of the replay
    allocation_curve: list[float]  # one value per percent of arrived GPU demand, 0..demand*100
    # Requested: sum of the placed pods' gpu_milli / (GPUs x 1000), the FGD paper's accounting; a GPU
    # can hold more than 1000 requested milli when its pods' units were rounded down.
    requested_allocation_ratio: float
    requested_allocation_curve: list[float]
    gpus_over_requested: int  # GPUs holding more than 1000 requested milli
    total_gpus: int
    unallocated_gpus: float  # GPUs minus granted GPUs (the paper's figure, counted as granted)
    fragmented_gpus: float  # unallocated share on GPUs that hold at least one pod
    idle_gpus: int  # GPUs with no pod at all
    runtime_s: float  # wall clock
    cpu_s: float  # process CPU time: steadier than wall clock on a shared machine
    failure_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    admission_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    placements: list[dict[str, Any]] | None = dataclasses.field(default=None, repr=False)  # per pod, when asked

    def at_demand(self, percent: int, *, requested: bool = False) -> float:
        curve = self.requested_allocation_curve if requested else self.allocation_curve
        return curve[min(percent, len(curve) - 1)]

    def to_json(self) -> dict[str, Any]:
        """The figures, without the per-pod placements (those go to --placements)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "placements"}
        out["failure_reasons"] = dict(self.failure_reasons)
        out["admission_reasons"] = dict(self.admission_reasons)
        out["gpu_allocation_ratio"] = round(self.gpu_allocation_ratio, 6)
        out["allocation_curve"] = [round(v, 6) for v in self.allocation_curve]
        out["requested_allocation_ratio"] = round(self.requested_allocation_ratio, 6)
        out["requested_allocation_curve"] = [round(v, 6) for v in self.requested_allocation_curve]
        out["unallocated_gpus"] = round(self.unallocated_gpus, 3)
        out["fragmented_gpus"] = round(self.fragmented_gpus, 3)
        out["runtime_s"] = round(self.runtime_s, 3)
        out["cpu_s"] = round(self.cpu_s, 3)
        return out


def gpu_capacity_milli(nodes: Sequence[trace.TraceNode]) -> int:
    return sum(n.gpus for n in nodes) * 1000


def workload(
    pods: Sequence[trace.TracePod], capacity_milli: int, demand: float, rng: np.random.Generator
) -> list[trace.TracePod]:
    """The arrival order: the trace's pods shuffled, resampled at random (with replacement) until
    their GPU demand reaches `demand` x capacity, or cut there when the trace asks for more."""
    if demand <= 0:
        raise ValueError(f"demand must be greater than 0, got {demand}")
    target = demand * capacity_milli
    chosen = [pods[i] for i in rng.permutation(len(pods))]
    total = sum(p.gpu_demand_milli for p in chosen)
    if total >= target:
        running = 0
        for cut, pod in enumerate(chosen, start=1):
            running += pod.gpu_demand_milli
            if running >= target:
                return chosen[:cut]
        return chosen
    if not any(p.gpu_demand_milli for p in pods):
        raise ValueError("the pod list asks for no GPUs: it cannot be resampled to a GPU demand")
    copies: collections.Counter[str] = collections.Counter()
    while total < target:
        pod = pods[int(rng.integers(len(pods)))]
        copies[pod.name] += 1
        chosen.append(dataclasses.replace(pod, name=f"{pod.name}-r{copies[pod.name]}"))
        total += pod.gpu_demand_milli
    return [chosen[i] for i in rng.permutation(len(chosen))]


class _LabelPipe:
    """Node label updates on their way to the webhook's view and the scheduler's node objects."""

    def __init__(self, delay: LabelDelay, contract: contract_.Contract) -> None:
        self.delay = delay
        self.contract = contract
        self.last: dict[int, dict[str, str]] = {}  # node -> the labels it last wrote
        self.pending: collections.deque[tuple[int, float, int, dict[str, str]]] = collections.deque()
        self.next_write: dict[int, float] = {}  # rate limit: when a node's next write may go out
        self.held: dict[int, dict[str, str]] = {}  # node -> latest labels waiting for that moment
        self.slots: list[tuple[float, int]] = []  # heap of (moment, node) for the held labels

    def publish(self, binds: int, now: float, node: int, labels: dict[str, str]) -> None:
        interval = self.delay.min_interval_seconds
        if interval > 0:
            slot = self.next_write.get(node, float("-inf"))
            last = self.last.get(node, {})
            change = {k: v for k, v in labels.items() if last.get(k) != v}
            # The labeller writes at once, inside the interval, a change that lowers a label the
            # webhook's required affinity filters on (labels.over_promises); the rest waits.
            if now + 1e-9 < slot and not node_labels_.over_promises(last, change, self.contract):
                if node not in self.held:
                    heapq.heappush(self.slots, (slot, node))
                self.held[node] = labels
                return
            self.held.pop(node, None)  # written now; a slot still queued finds nothing held
            self.next_write[node] = now + interval
            self.last[node] = labels
        self.pending.append((binds + self.delay.binds, now + self.delay.seconds, node, labels))

    def due(self, binds: int, now: float) -> list[tuple[int, dict[str, str]]]:
        while self.slots and self.slots[0][0] <= now + 1e-9:
            slot, node = heapq.heappop(self.slots)
            if node not in self.held:
                continue
            held = self.held.pop(node)
            self.next_write[node] = slot + self.delay.min_interval_seconds
            self.last[node] = held
            self.pending.append((binds + self.delay.binds, slot + self.delay.seconds, node, held))
        out = []
        while self.pending and self.pending[0][0] <= binds and self.pending[0][1] <= now + 1e-9:
            _, _, node, labels = self.pending.popleft()
            out.append((node, labels))
        return out


def replay(
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    configuration: Configuration,
    *,
    seed: int,
    label_delay: LabelDelay = LabelDelay(),
    gpu_memory_mib: Mapping[str, int] = trace.GPU_MEMORY_MIB,
    placements: bool = False,
    progress: Callable[[int], object] | None = None,
) -> Result:
    """Place `arrivals` in order on `nodes` under `configuration`; pods never leave, nothing is retried.
    `placements`: also record every pod's outcome and grant (Result.placements). `progress(n)`: n more
    pods done, called every PROGRESS_STEP pods and once at the end (a progress bar's update)."""
    started = time.perf_counter()
    started_cpu = time.process_time()
    settings = configuration.settings
    contract = settings.contract
    steering = settings.steering.enabled and configuration.sharing
    sim_nodes = [
        node_.SimNode(
            n.name,
            trace.node_inventory(n, gpu_memory_mib),
            contract,
            sharing=configuration.sharing,
            cpu_per_gpu_milli=settings.steering.cpu_per_gpu_milli,
        )
        for n in nodes
    ]
    node_labels = [
        {"kubernetes.io/hostname": n.name, **s.labels(steering=steering, headroom=(n.cpu_milli, n.memory_mib))}
        for n, s in zip(nodes, sim_nodes, strict=True)
    ]
    allocatable = [
        {scheduler.CPU: n.cpu_milli, scheduler.MEMORY: n.memory_mib * _MIB, **s.allocatable()}
        for n, s in zip(nodes, sim_nodes, strict=True)
    ]
    state = scheduler.Cluster([n.name for n in nodes], allocatable, node_labels)
    sched = scheduler.Scheduler(state, configuration.profile, np.random.default_rng(seed))
    clock = [0.0]  # simulated seconds: the clock of the webhook's promises (cluster.py)
    view = cluster_.ClusterView(
        contract, default_gpu_memory_mib=settings.default_gpu_memory_mib, clock=lambda: clock[0]
    )
    for n, labels in zip(nodes, node_labels, strict=True):
        view.update_node(n.name, labels)
    pipe = _LabelPipe(label_delay, contract)

    capacity = gpu_capacity_milli(nodes)
    granted = 0.0  # GPUs' worth of memory granted (SimNode.credit)
    requested = 0  # gpu_milli of the placed pods
    arrived = 0
    binds = 0
    arrived_after = np.zeros(len(arrivals), dtype=np.int64)
    granted_after = np.zeros(len(arrivals), dtype=np.float64)
    requested_after = np.zeros(len(arrivals), dtype=np.int64)
    requested_on: collections.Counter[tuple[int, str]] = collections.Counter()  # (node, GPU) -> milli
    records: list[dict[str, Any]] | None = [] if placements else None
    failed = admission = denied = 0
    failure_reasons: collections.Counter[str] = collections.Counter()
    admission_reasons: collections.Counter[str] = collections.Counter()

    scheduled_at, converted_at = _moments(label_delay, len(arrivals))
    # Conversions in the order the webhook saw them, each with the labels out at its own moment.
    conversion_order = sorted(range(len(arrivals)), key=converted_at.__getitem__) if converted_at else []
    converted: dict[int, tuple[dict[str, Any] | None, str, Mapping[str, Any] | None]] = {}
    next_conversion = 0
    reported = 0
    for i, pod in enumerate(arrivals):
        if progress is not None and i - reported >= PROGRESS_STEP:
            progress(i - reported)
            reported = i
        now = scheduled_at[i]
        # Every conversion due by now happens before this pod's bind changes any label.
        while converted_at and next_conversion < len(arrivals):
            j = conversion_order[next_conversion]
            if converted_at[j] > now + 1e-9 and i in converted:
                break
            next_conversion += 1
            clock[0] = min(converted_at[j], now)
            for index, labels in pipe.due(binds, clock[0]):
                state.set_labels(index, labels)
                view.update_node(state.names[index], labels)
            # Conversions ahead of the scheduler promise their units, as the webhook does.
            converted[j] = _pod_for(arrivals[j], configuration, view, promise=True)
        clock[0] = now
        for index, labels in pipe.due(binds, now):
            state.set_labels(index, labels)
            view.update_node(state.names[index], labels)
        arrived += pod.gpu_demand_milli
        arrived_after[i] = arrived
        granted_after[i] = granted
        requested_after[i] = requested
        manifest, denial, promised = converted.pop(i) if converted_at else _pod_for(pod, configuration, view)
        if manifest is None:
            denied += 1
            if records is not None:
                records.append(placement_record(pod, "denied", message=denial))
            continue
        request = scheduler.read_pod(manifest)
        decision = sched.schedule(request)
        if decision.node is None:
            # The webhook gives back the units of a conversion the scheduler found no node for
            # (webhook/waiting.py), so that a waiting pod does not hold them for PROMISE_SECONDS.
            view.ledger.release_conversion(promised)
            failed += 1
            failure_reasons[decision.message] += 1
            if records is not None:
                records.append(placement_record(pod, "unschedulable", message=decision.message))
            continue
        target = sim_nodes[decision.node]
        try:
            grants = target.admit(f"default/{pod.name}", request.container_devices)
        except node_.AdmissionFailure as exc:
            view.ledger.release_conversion(promised)  # kubelet refused it: the same
            admission += 1
            admission_reasons[_reason_kind(str(exc))] += 1
            if records is not None:
                records.append(placement_record(pod, "refused", node=target.name, message=f"kubelet: {exc}"))
            continue
        state.bind(decision.node, request)
        binds += 1
        credit = target.credit(grants)
        granted += credit
        requested += pod.gpu_demand_milli
        granted_after[i] = granted
        requested_after[i] = requested
        shares = [share for grant in grants for share in grant.shares]
        for share in shares:
            requested_on[(decision.node, share.uuid)] += pod.gpu_milli
        if records is not None:
            records.append(placement_record(pod, "placed", node=target.name, shares=shares, granted_gpus=credit))
        if steering and target.node.gpus:
            # Every bind changes the node's CPU and memory headroom, GPU pods also its free units.
            headroom = state.headroom(decision.node)
            labels = target.labels(steering=True, headroom=headroom)
            pipe.publish(binds, now, decision.node, {"kubernetes.io/hostname": target.name, **labels})
        for index, labels in pipe.due(binds, now):
            state.set_labels(index, labels)
            view.update_node(state.names[index], labels)

    if progress is not None:
        progress(len(arrivals) - reported)
    total_gpus = capacity // 1000
    gpus_in_use = sum(s.gpus_in_use() for s in sim_nodes)
    return Result(
        name=configuration.name,
        pods=len(arrivals),
        placed_pods=binds,
        failed_pods=failed,
        admission_failures=admission,
        denied_pods=denied,
        gpu_allocation_ratio=granted / total_gpus if total_gpus else 0.0,
        allocation_curve=allocation_curve(arrived_after, granted_after * 1000, capacity),
        requested_allocation_ratio=requested / capacity if capacity else 0.0,
        requested_allocation_curve=allocation_curve(arrived_after, requested_after, capacity),
        gpus_over_requested=sum(1 for milli in requested_on.values() if milli > 1000),
        total_gpus=total_gpus,
        unallocated_gpus=total_gpus - granted,
        fragmented_gpus=gpus_in_use - granted,
        idle_gpus=total_gpus - gpus_in_use,
        runtime_s=time.perf_counter() - started,
        cpu_s=time.process_time() - started_cpu,
        failure_reasons=dict(failure_reasons.most_common(5)),
        admission_reasons=dict(admission_reasons.most_common(5)),
        placements=records,
    )


def placement_record(
    pod: trace.TracePod,
    outcome: str,
    *,
    node: str | None = None,
    shares: Sequence[node_.GpuShare] = (),
    granted_gpus: float = 0.0,
    message: str = "",
    claim_requests: Sequence[str] = (),
    claim_alternatives: Sequence[int] = (),
) -> dict[str, Any]:
    """One pod's line of --placements: enough to recompute every figure without the simulator;
    in DRA mode, the request of each device its claims were allocated for ("gpu/m16384") and its
    position in the request's prioritized list (0: the webhook's first choice)."""
    extra = (
        {"claim_requests": list(claim_requests), "claim_alternatives": list(claim_alternatives)}
        if claim_requests
        else {}
    )
    return {
        "pod": pod.name,
        "outcome": outcome,  # placed | unschedulable | refused (by kubelet) | denied (by the webhook)
        "node": node,
        "num_gpu": pod.num_gpu,
        "gpu_milli": pod.gpu_milli,
        "requested_milli": pod.gpu_demand_milli,
        "gpus": [share.to_json() for share in shares],
        "granted_gpus": round(granted_gpus, 9),
        "message": message,
        **extra,
    }


def _moments(delay: LabelDelay, count: int) -> tuple[list[float], list[float] | None]:
    """(scheduling moment per arrival, nondecreasing; conversion moment per arrival or None: right
    before its scheduling)."""
    if delay.scheduled_at is not None:
        if len(delay.scheduled_at) != count:
            raise ValueError(f"scheduled_at has {len(delay.scheduled_at)} moments for {count} arrivals")
        scheduled = list(itertools.accumulate(delay.scheduled_at, max))
    else:
        scheduled = [i * delay.pod_interval_seconds for i in range(count)]
    if delay.converted_at is not None:
        if len(delay.converted_at) != count:
            raise ValueError(f"converted_at has {len(delay.converted_at)} moments for {count} arrivals")
        return scheduled, [min(c, s) for c, s in zip(delay.converted_at, scheduled, strict=True)]
    if delay.webhook_interval_seconds is not None:
        return scheduled, [min(i * delay.webhook_interval_seconds, s) for i, s in enumerate(scheduled)]
    return scheduled, None


def _pod_for(
    pod: trace.TracePod, configuration: Configuration, view: cluster_.ClusterView, *, promise: bool = False
) -> tuple[dict[str, Any] | None, str, Mapping[str, Any] | None]:
    """(the pod the scheduler sees: the webhook's patch applied (gpuslice) or the stock request;
    None when the webhook denies it, the webhook's message then, the decision whose units were
    promised). `promise`: record the conversion's units against its class, as the webhook does
    (only meaningful when conversions run ahead)."""
    contract = configuration.settings.contract
    if not configuration.sharing:
        return trace.user_pod(pod, contract, whole_gpus_only=True), "", None
    manifest = trace.user_pod(pod, contract)
    outcome = mutation.mutate(manifest, settings=configuration.settings, cluster=view)
    if not outcome.allowed:
        return None, f"webhook: {outcome.message}", None
    if not outcome.patch:
        return manifest, "", None
    # Mutated, as admission.promise counts it in the webhook.
    view.cpu_demand.note(outcome.pod_cpu_milli, device=outcome.kind != conversions.KIND_CPU_POD)
    promised = None
    if promise:
        view.ledger.promise_conversion(outcome.decision, outcome.cpu_milli)
        promised = outcome.decision
    # The manifest is ours and fresh: patch it in place (a deep copy per pod costs more than the rest).
    patched: dict[str, Any] = jsonpatch.apply_patch(manifest, outcome.patch, in_place=True)
    return patched, "", promised


def _reason_kind(message: str) -> str:
    """Group admission messages by kind (drop device IDs and counts) for the summary."""
    if "span" in message:
        return "units span GPUs (no single GPU had room)"
    if "unavailable" in message:
        return "requested number of devices unavailable"
    return message[:120]


def allocation_curve(arrived_after: np.ndarray, allocated_after: np.ndarray, capacity: int) -> list[float]:
    """Allocation ratio at each whole percent of arrived GPU demand (state when demand first reaches it);
    `allocated_after`: milli allocated after each arrival (granted or requested)."""
    if capacity <= 0 or len(arrived_after) == 0:
        return []
    last = int(np.floor(arrived_after[-1] * 100 / capacity + 1e-9))
    thresholds = np.arange(last + 1) * capacity / 100
    positions = np.minimum(np.searchsorted(arrived_after, thresholds - 1e-9, side="left"), len(arrived_after) - 1)
    return [float(v) for v in allocated_after[positions] / capacity]
