"""The packing replay through the real control plane (`gpuslice-sim --scheduler kube`).

Per run: etcd, kube-apiserver and kube-scheduler from the built components (sim/controlplane.py),
the trace's nodes as Node objects with kubelet and the device plugin played by sim/kube_nodes.py,
our webhook as its own process called by the API server over HTTPS (a MutatingWebhookConfiguration
with a url), then the arrivals created through the API server in one of three modes:

- `sequential`: one pod at a time; the next is created once this one is bound (and admitted or
  refused by its node) or the scheduler has marked it unschedulable;
- `burst`: all at once (as many creates in flight as the client allows), as the FGD protocol in
  effect is: the scheduler sees a queue, node labels lag behind;
- `compressed:<factor>`: the trace's own inter-arrival gaps (its creation_time column, in arrival
  order, cycled for resampled pods) divided by `factor`.

The same seed's arrivals also go through the Python model (sim/replay.py) and both sets of figures
are reported side by side. With `--chaos` (sim/chaos.py) a webhook replica, the controller's
leader or kube-scheduler is killed partway through the arrivals. kube-scheduler is started again
whenever it exits (sim/keeper.py), as kubelet would: it exits by design when its cache and the API
server disagree, which a loaded machine can bring about.

This module runs one replay: the control plane, the nodes, the components (sim/kube_components.py),
the arrivals (sim/kube_arrivals.py), until every pod is accounted for, then the figures
(sim/kube_outcomes.py) beside the model's. The command line and its report are sim/kube_cli.py.

May import aiohttp (through sim.kube_api), numpy and the other gpuslice.sim modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import pathlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from gpuslice.sim import chaos as chaos_
from gpuslice.sim import (
    controlplane,
    keeper,
    kube_api,
    kube_arrivals,
    kube_components,
    kube_dra,
    kube_nodes,
    kube_outcomes,
    profiling,
    replay,
    trace,
)

_T = TypeVar("_T")

SCHEDULER_QPS = 5000  # kube-scheduler's own default of 50 would bound a burst at 25 binds a second


# Burst and compressed arrivals: the paced model is the median of this many draws of the order the
# webhook converted the pods in (the run's own, and orders within what it cannot tell apart).
PACED_DRAWS = 9


# After the last arrival, pods still waiting for an outcome this long count as having none
# (`gpuslice-sim --settle-limit`): a full-size burst of fractions in DRA mode needs more.
SETTLE_LIMIT_SECONDS = 1800.0
QUIET_SECONDS = 3.0  # burst/compressed: done once every pod is accounted for and nothing moved this long


@dataclasses.dataclass(frozen=True)
class ModelFeed:
    """What the paced model is fed of a kube run, per arrival: when its pod was first decided (bound
    or marked unschedulable) and when the webhook converted it; `order`, the arrivals in the order
    the scheduler decided them."""

    order: tuple[int, ...]
    scheduled_at: tuple[float, ...]
    converted_at: tuple[float, ...]


def model_feed(decided_at: Sequence[float], answered_at: Sequence[float], stored: Sequence[int | None]) -> ModelFeed:
    """The moments of a kube run (seconds from its first create, per arrival) as the paced model
    takes them.

    Order matters more than the moments: a burst's class choices follow the order the webhook saw
    its pods in: moving its conversions by ±5 ms spreads the paced model of the default trace over
    0.65 points, by ±50 ms over two (docs/simulator.md, "The paced model of a burst"). Creates run
    kube_arrivals.CREATE_CONCURRENCY at a time and their answers come back in any order, so the answer times are
    handed out again in the order the API server stored the pods (`stored`: the resourceVersion of
    each create; None where it was denied, whose own time stays), which follows the webhook's. The
    scheduler's order is the order of first decisions (the pacer's, or the scheduling queue's): the
    model schedules in it."""
    if not len(decided_at) == len(answered_at) == len(stored):
        raise ValueError("model_feed: one decision moment, answer moment and version per arrival")
    stored_pods = sorted((v, i) for i, v in enumerate(stored) if v is not None)
    times = sorted(answered_at[i] for _, i in stored_pods)
    converted = list(answered_at)
    for (_, i), moment in zip(stored_pods, times, strict=True):
        converted[i] = moment
    order = tuple(sorted(range(len(decided_at)), key=decided_at.__getitem__))
    return ModelFeed(order, tuple(decided_at), tuple(converted))


async def _until_settled(
    keys: Sequence[str],
    outcomes: kube_outcomes.Outcomes,
    fleet: kube_nodes.Fleet,
    limit: float,
    progress: Callable[[int], object] | None = None,
    busy: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """Every pod accounted for and nothing moved for QUIET_SECONDS (an unschedulable pod may still be
    bound when a refusal frees room: the real scheduler retries, the model does not), and not
    `await busy()` (--chaos: a killed leader's work not yet taken over). `progress(n)`: n pods have
    an outcome now, on every look."""
    deadline = time.monotonic() + limit
    calm_from = 0.0
    while time.monotonic() < deadline:
        if fleet.failed_tasks():
            return
        settled = sum(1 for k in keys if outcomes.settled(k))
        if progress is not None:
            progress(settled)
        if busy is not None and await busy():
            calm_from = time.monotonic()  # the quiet time starts once it is not
        quiet = time.monotonic() - max(outcomes.last_change, calm_from)
        if settled == len(keys) and quiet >= QUIET_SECONDS:
            return
        await asyncio.sleep(0.2)


async def _leader_work_left(api: kube_api.Api, monkey: chaos_.Monkey, journal_label: str) -> bool:
    """After a leader's kill: no successor leads yet, or requeues it left half done are still in the
    requeue journal (controller/requeue_journal.py's ConfigMaps, labelled `journal_label`).
    The successor finishes those only once they are the journal's grace old: until then their pods
    are waiting (deleted, or Failed), not lost."""
    if not monkey.leaders_killed:
        return False
    if monkey.waiting_for_a_leader:
        return True
    path = f"/api/v1/namespaces/{kube_outcomes.NAMESPACE}/configmaps"
    listed = await api.request("GET", path, params={"labelSelector": journal_label})
    return bool(listed.get("items"))


async def _drive(
    plane: controlplane.ControlPlane,
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    configuration: replay.Configuration,
    arrival: kube_arrivals.Arrival,
    gaps: Sequence[float],
    gpu_memory_mib: Mapping[str, int],
    started: float,
    settle_limit: float,
    progress: Callable[[int], object] | None = None,
    placements: bool = False,
    webhook_replicas: int | None = None,
    monkey: chaos_.Monkey | None = None,
    prepare_seconds: float = 0.0,
    scheduler: keeper.Keeper | None = None,
) -> tuple[
    replay.Result,
    float,
    float,
    list[str],
    int,
    list[str],
    ModelFeed,
    dict[str, dict[str, int]],
    int,
    int,
]:
    settings = configuration.settings
    contract = settings.contract
    async with kube_api.Api(plane.server, plane.admin_token, plane.ca_file) as api:
        fleet = kube_nodes.Fleet(
            api,
            nodes,
            settings,
            sharing=configuration.sharing,
            namespace=kube_outcomes.NAMESPACE,
            gpu_memory_mib=gpu_memory_mib,
            dra=settings.dra.enabled,
            prepare_seconds=prepare_seconds,
        )
        await fleet.create_nodes()
        if configuration.sharing:
            port, ca_pem, replicas = await asyncio.to_thread(
                kube_components.start_webhooks, plane, settings, webhook_replicas
            )
            await api.create(
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                kube_components.webhook_configuration(
                    port, ca_pem, side_effects="NoneOnDryRun" if fleet.dra else "None"
                ),
            )
            probe = trace.user_pod(
                trace.TracePod("gpuslice-sim-probe", 0, 0, 1, 500), contract, namespace=kube_outcomes.NAMESPACE
            )
            await kube_components.webhook_in_effect(api, probe)
            controllers: list[chaos_.Target] = []
            if (settings.requeue.enabled or settings.pacing.enabled) and not fleet.dra:
                standby = monkey is not None and chaos_.needs_standby(monkey.events)
                controllers = await asyncio.to_thread(
                    kube_components.start_replay_controllers,
                    plane,
                    [r.port for r in replicas],
                    settings.pacing.enabled,
                    standby=standby,
                )
            if monkey is not None:  # a configuration without the webhook (whole GPUs) leaves it nothing to kill
                leading = functools.partial(
                    kube_components.controller_answers, path="/metrics", expected=kube_components.LEADING
                )
                monkey.arm(plane, webhooks=replicas, controllers=controllers, leading=leading)
        outcomes = kube_outcomes.Outcomes(fleet)
        watch = asyncio.create_task(
            kube_api.follow(api, f"/api/v1/namespaces/{kube_outcomes.NAMESPACE}/pods", outcomes.on_event),
            name="pods-watch",
        )
        await fleet.start()
        setup = time.monotonic() - started
        manifests = [
            trace.user_pod(p, contract, namespace=kube_outcomes.NAMESPACE, whole_gpus_only=not configuration.sharing)
            for p in arrivals
        ]
        keys = [f"{kube_outcomes.NAMESPACE}/{p.name}" for p in arrivals]
        t0 = time.monotonic()
        if scheduler is not None:
            scheduler.origin = t0
        cpu0 = time.process_time()
        chaos = None
        if monkey is not None:
            chaos = asyncio.create_task(monkey.run(len(manifests), lambda: len(outcomes.created_at), t0), name="chaos")
        try:
            await kube_arrivals.arrive(api, manifests, outcomes, arrival, gaps)
            created = time.monotonic()
            journal = f"{contract.prefix}/requeue-journal"  # the controller's journal label
            busy = functools.partial(_leader_work_left, api, monkey, journal) if monkey is not None else None
            await _until_settled(keys, outcomes, fleet, settle_limit, progress, busy)
            await fleet.settle()
            wall = max(outcomes.last_change, created) - t0  # the quiet time at the end is not counted
            cpu = time.process_time() - cpu0
        finally:
            watch.cancel()
            if chaos is not None:
                chaos.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await chaos
            failed = fleet.failed_tasks()  # before stop(), which forgets its tasks
            await fleet.stop()
            # DRA mode: an allocation past a device's memory (the allocator's promise broken) is an error.
            errors = [*failed, *fleet.errors, *fleet.ledger.overruns, *outcomes.errors]
            if watch.done() and not watch.cancelled() and watch.exception() is not None:
                errors.append(f"pods watch: {watch.exception()!r}")
        capacity = replay.gpu_capacity_milli(nodes)
        result, unaccounted, lost = kube_outcomes.figures(
            configuration.name, arrivals, outcomes, fleet, capacity, max(0.0, wall), cpu, placements=placements
        )
        end = t0 + wall
        feed = model_feed(
            [outcomes.first_outcome_at.get(k, end) - t0 for k in keys],
            [outcomes.created_at.get(k, end) - t0 for k in keys],
            [outcomes.stored.get(k) for k in keys],
        )
        diagnosis = kube_outcomes.diagnosis(outcomes, fleet, arrivals)
        try:  # how often the scheduler tried pods, and what sent them back (the scheduler still runs)
            diagnosis |= profiling.scheduling_counts(await asyncio.to_thread(plane.scheduler_metrics, "kube-scheduler"))
        except (OSError, RuntimeError) as exc:
            errors.append(f"kube-scheduler's metrics: {exc}")
        return (
            result,
            setup,
            created - t0,
            unaccounted,
            fleet.label_writes,
            errors,
            feed,
            diagnosis,
            lost,
            outcomes.create_retries,
        )


def replay_on_kube(
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    configuration: replay.Configuration,
    *,
    seed: int,
    arrival: kube_arrivals.Arrival,
    binaries: controlplane.Binaries,
    workdir: str | os.PathLike[str],
    gaps: Sequence[float] = (1.0,),
    gpu_memory_mib: Mapping[str, int] = trace.GPU_MEMORY_MIB,
    settle_limit: float = SETTLE_LIMIT_SECONDS,
    progress: Callable[[int], object] | None = None,
    placements: bool = False,
    webhook_replicas: int | None = None,
    chaos: Sequence[chaos_.Event] = (),
    profile_dir: pathlib.Path | None = None,
    prepare_seconds: float = 0.0,
) -> kube_outcomes.KubeResult:
    """Replay `arrivals` on `nodes` through a fresh control plane in `workdir`, and through the model.
    `progress(n)`: n of the pods have an outcome on the control plane (called while they settle).
    `placements`: the kube run's Result also holds every pod's --placements line.
    `webhook_replicas`: that many webhook processes behind a round-robin proxy (None: one, direct).
    `chaos`: processes to kill partway through the arrivals (sim/chaos.py; chaos.check first).
    `profile_dir`: kube-scheduler's CPU profiles, from its start to the end of the run (sim/profiling.py).
    `prepare_seconds`: in DRA mode, how long after a bind kubelet prepares the pod's claims."""
    # The model knows device-plugin mode only: in DRA mode it gives the device-plugin figure beside it.
    modelled = configuration
    if configuration.settings.dra.enabled:
        settings = configuration.settings
        modelled = dataclasses.replace(
            configuration, settings=dataclasses.replace(settings, dra=dataclasses.replace(settings.dra, enabled=False))
        )
    model = replay.replay(nodes, arrivals, modelled, seed=seed, gpu_memory_mib=gpu_memory_mib)
    started = time.monotonic()
    plane = controlplane.ControlPlane(binaries, workdir)
    profiler: profiling.SchedulerProfiler | None = None
    try:
        plane.start(scheduler=False, controllers=False)
        start_scheduler = functools.partial(
            plane.start_scheduler,
            "kube-scheduler",
            configuration=kube_components.scheduler_configuration(configuration.profile),
            qps=SCHEDULER_QPS,
            burst=2 * SCHEDULER_QPS,
        )
        scheduler = keeper.Keeper("kube-scheduler", start_scheduler(), start_scheduler)
        if profile_dir is not None:
            profiler = profiling.SchedulerProfiler(plane, profile_dir).start()
        if configuration.sharing and configuration.settings.dra.enabled:
            # Pods' claims from the webhook's templates; as fast as the scheduler binds.
            plane.start_controller_manager(kube_dra.DRA_CONTROLLERS, qps=SCHEDULER_QPS)
        version = plane.version()
        monkey = (
            chaos_.Monkey(chaos, scheduler=lambda: chaos_.Target(scheduler.name, scheduler.process)) if chaos else None
        )
        kube, setup, arrivals_s, unaccounted, writes, errors, feed, diagnosis, lost, retries = asyncio.run(
            _kept_running(
                scheduler,
                _drive(
                    plane,
                    nodes,
                    arrivals,
                    configuration,
                    arrival,
                    gaps,
                    gpu_memory_mib,
                    started,
                    settle_limit,
                    progress,
                    placements,
                    webhook_replicas,
                    monkey,
                    prepare_seconds,
                    scheduler,
                ),
            )
        )
        errors += scheduler.errors
    finally:
        if profiler is not None:
            profiler.stop()
        plane.stop()
    paced = None
    draws: list[float] = []
    settings = configuration.settings
    if configuration.sharing and settings.steering.enabled and not settings.dra.enabled and arrivals:
        count = 1 if arrival.mode == "sequential" else PACED_DRAWS  # one by one: nothing to draw
        paced, draws = paced_model(
            nodes, arrivals, configuration, feed, seed=seed, draws=count, gpu_memory_mib=gpu_memory_mib
        )
    return kube_outcomes.KubeResult(
        kube,
        model,
        paced,
        str(arrival),
        version,
        setup,
        arrivals_s,
        unaccounted,
        writes,
        errors,
        diagnosis,
        lost,
        draws,
        monkey.records if monkey is not None else [],
        retries,
        scheduler.restarts,
    )


async def _kept_running(scheduler: keeper.Keeper, drive: Awaitable[_T]) -> _T:
    """`drive` with `scheduler` started again whenever it exits."""
    async with scheduler.watching():
        return await drive


def paced_model(
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    configuration: replay.Configuration,
    feed: ModelFeed,
    *,
    seed: int,
    draws: int,
    gpu_memory_mib: Mapping[str, int] = trace.GPU_MEMORY_MIB,
) -> tuple[replay.Result, list[float]]:
    """The model with the labeller's rate limit on the run's own moments (`feed`): (the median
    draw, every draw's granted ratio in draw order).

    The first draw converts at the run's moments. A burst's packing follows the order the webhook
    converted its pods in, below what the run can record: the API server stores creates that were in
    flight together (kube_arrivals.CREATE_CONCURRENCY) in an order the webhook need not have seen them in, and
    orders that close apart spread the default trace's paced model over one to two points
    (docs/simulator.md, "The paced model of a burst"). So each further draw moves every conversion by
    up to half such a window (the answers' mean spacing times kube_arrivals.CREATE_CONCURRENCY / 2) either way, at
    random."""
    if draws < 1:
        raise ValueError(f"paced_model: at least one draw, got {draws}")
    ordered = [arrivals[i] for i in feed.order]
    scheduled = tuple(feed.scheduled_at[i] for i in feed.order)
    converted = tuple(feed.converted_at[i] for i in feed.order)
    answers = sorted(converted)
    spacing = (answers[-1] - answers[0]) / (len(answers) - 1) if len(answers) > 1 else 0.0
    reach = spacing * kube_arrivals.CREATE_CONCURRENCY / 2
    rng = np.random.default_rng(seed)
    results = []
    for draw in range(draws):
        moments = converted
        if draw:
            shifts = rng.uniform(-reach, reach, len(converted))
            moments = tuple(max(0.0, c + float(d)) for c, d in zip(converted, shifts, strict=True))
        pace = replay.LabelDelay(
            min_interval_seconds=configuration.settings.steering.label_min_interval_seconds,
            scheduled_at=scheduled,
            converted_at=moments,
        )
        results.append(
            replay.replay(nodes, ordered, configuration, seed=seed, label_delay=pace, gpu_memory_mib=gpu_memory_mib)
        )
    ratios = [r.gpu_allocation_ratio for r in results]
    median = sorted(range(draws), key=ratios.__getitem__)[(draws - 1) // 2]
    return results[median], ratios
