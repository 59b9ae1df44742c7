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
are reported side by side. With `--chaos` (sim/chaos.py) a webhook replica or the controller's
leader is killed partway through the arrivals.

May import aiohttp (through sim.kube_api), PyYAML, numpy, tqdm (a run's bar), gpuslice.{config,timeouts},
gpuslice.dra.slices (DRA mode) and the other gpuslice.sim modules; the webhook runs as
`python -m gpuslice.webhook.main`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import csv
import dataclasses
import functools
import json
import operator
import os
import pathlib
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tqdm
import yaml

from gpuslice import config, timeouts
from gpuslice.dra import slices
from gpuslice.sim import chaos as chaos_
from gpuslice.sim import controlplane, kube_api, kube_dra, kube_nodes, provenance, replay, scheduler, trace
from gpuslice.sim import placements as placements_
from gpuslice.sim import progress as progress_

__all__ = [
    "Arrival",
    "KubeResult",
    "add_arguments",
    "main",
    "parse_arrival",
    "replay_on_kube",
    "sample_nodes",
    "scheduler_configuration",
    "trace_gaps",
]

NAMESPACE = "default"
WEBHOOK_NAME = "gpuslice-sim"
SCHEDULER_QPS = 5000  # kube-scheduler's own default of 50 would bound a burst at 25 binds a second
CREATE_CONCURRENCY = 32  # pod creates in flight in burst and compressed modes
# Burst and compressed arrivals: the paced model is the median of this many draws of the order the
# webhook converted the pods in (the run's own, and orders within what it cannot tell apart).
PACED_DRAWS = 9
REQUEUE_BACKOFF_SECONDS = 0.1  # the controller's first requeue delay here (x2 each time, 5 at most: 3.1 s)
QUIET_SECONDS = 3.0  # burst/compressed: done once every pod is accounted for and nothing moved this long
POD_TIMEOUT = 120.0  # sequential: longest wait for one pod's outcome
# Sends of one create whose webhook call failed (its replica died with it in flight), as a client retries.
CREATE_ATTEMPTS = 5
LEADING = b"\ngpuslice_controller_leading 1.0"  # a controller's /metrics while it leads


@dataclasses.dataclass(frozen=True)
class Arrival:
    mode: str  # sequential, burst, compressed
    factor: float = 1.0  # compressed: trace seconds per replay second

    def __str__(self) -> str:
        return f"compressed:{self.factor:g}" if self.mode == "compressed" else self.mode


def parse_modes(text: str) -> tuple[str, ...]:
    """`device-plugin`, `dra`, or both comma-separated (each once)."""
    modes = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in modes if m not in ("device-plugin", "dra")]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"--mode {text!r}: give device-plugin, dra, or device-plugin,dra")
    return modes


def parse_arrival(text: str) -> Arrival:
    """`sequential`, `burst` or `compressed:<factor>` (factor > 0)."""
    if text in ("sequential", "burst"):
        return Arrival(text)
    if text.startswith("compressed:"):
        raw = text.split(":", 1)[1]
        try:
            factor = float(raw)
        except ValueError:
            factor = 0.0
        if factor > 0:
            return Arrival("compressed", factor)
        raise ValueError(f"--arrival compressed:<factor> needs a factor greater than 0, got {raw!r}")
    raise ValueError(f"--arrival must be sequential, burst or compressed:<factor>, got {text!r}")


def trace_gaps(pods_file: str | os.PathLike[str]) -> list[float]:
    """Seconds between consecutive pod creations of the trace (its creation_time column, sorted)."""
    with open(pods_file, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "creation_time" not in rows[0]:
        raise trace.TraceError(f"{pods_file}: no creation_time column, needed by --arrival compressed")
    try:
        times = sorted(float(r["creation_time"] or 0) for r in rows)
    except ValueError as exc:
        raise trace.TraceError(f"{pods_file}: creation_time: {exc}") from None
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return gaps or [0.0]


def sample_nodes(nodes: Sequence[trace.TraceNode], count: int | None) -> list[trace.TraceNode]:
    """`count` of the nodes, evenly spaced through the list (so the GPU model mix stays); all without."""
    if count is None or count >= len(nodes):
        return list(nodes)
    if count < 1:
        raise ValueError(f"--node-sample must be at least 1, got {count}")
    picks = np.linspace(0, len(nodes) - 1, count).round().astype(int)
    return [nodes[i] for i in sorted(set(picks.tolist()))]


def scheduler_configuration(profile: scheduler.Profile) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the model's profile stands for."""
    entry: dict[str, Any] = {"schedulerName": profile.name}
    if profile.percentage_of_nodes_to_score:
        entry["percentageOfNodesToScore"] = profile.percentage_of_nodes_to_score
    profiles = [entry]
    if profile.name != "default-scheduler":
        strategy: dict[str, Any] = {
            "type": profile.strategy,
            "resources": [{"name": r, "weight": w} for r, w in profile.resources],
        }
        if profile.strategy == "RequestedToCapacityRatio":
            strategy["requestedToCapacityRatio"] = {
                "shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]
            }
        entry["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {"scoringStrategy": strategy}}]
        # The model scores every pod with the one profile; the webhook names this one only on the
        # pods it converts, so the others (CPU-only pods) get a default-scheduler scored the same way.
        profiles.append({**entry, "schedulerName": "default-scheduler"})
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": profiles,
    }


def settings_document(settings: config.Config) -> dict[str, Any]:
    """The Config as a config.yaml document (docs/configuration.md), for the webhook process."""
    document: dict[str, Any] = {}
    for field in config.FIELDS:
        value = operator.attrgetter(field.attr)(settings)
        if isinstance(value, tuple):
            value = list(value)
        head, _, tail = field.path.partition(".")
        if tail:
            document.setdefault(head, {})[tail] = value
        else:
            document[head] = value
    return document


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
            "unaccounted": self.unaccounted,
            "label_writes": self.label_writes,
            "errors": self.errors[:20],
            "diagnosis": self.diagnosis,
        }


class _Outcomes:
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
        self.last_change = time.monotonic()
        self._waiters: dict[str, asyncio.Future[None]] = {}
        fleet.listeners.append(self._on_decision)

    def settled(self, key: str) -> bool:
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
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") != "SchedulingGated"  # waiting for the pacer, not an outcome
            ):
                if key not in self.unschedulable:
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
    CREATE_CONCURRENCY at a time and their answers come back in any order, so the answer times are
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


def _diagnosis(outcomes: _Outcomes, fleet: kube_nodes.Fleet) -> dict[str, dict[str, int]]:
    """Where a run lost GPUs: unschedulable pods by the GPU class their affinity pins them to, and
    GPUs left without any pod by class (MiB)."""
    idle: collections.Counter[str] = collections.Counter()
    for name, sim in fleet.sims.items():
        for gpu in sim.node.memory_gpus:
            if fleet.dra:  # DRA mode: what the allocator gave, not the simulated device manager
                used = fleet.ledger.consumed.get((name, slices.device_name(gpu)), 0.0) > 0
            else:
                used = bool(sim.units_in_use.get(gpu.uuid)) or gpu.uuid in sim.whole_in_use
            if not used:
                idle[str(gpu.memory_mib)] += 1
    placed = set(k for k, d in fleet.decisions.items() if d.admitted)
    pinned = collections.Counter(
        v or "none" for k, v in outcomes.pinned.items() if k not in placed and k not in fleet.decisions
    )
    return {"unschedulable_by_class": dict(pinned.most_common()), "idle_gpus_by_class": dict(idle.most_common())}


async def _create(api: kube_api.Api, manifest: dict[str, Any], outcomes: _Outcomes) -> None:
    key = f"{NAMESPACE}/{manifest['metadata']['name']}"
    try:
        created = await _send(api, manifest, outcomes)
        outcomes.created_at[key] = time.monotonic()
        version = str((created.get("metadata") or {}).get("resourceVersion") or "")
        if version.isdigit():
            outcomes.stored[key] = int(version)
    except kube_api.ApiError as exc:
        outcomes.created_at[key] = time.monotonic()
        if "denied the request" not in exc.message:  # not the webhook's answer: named in the errors
            outcomes.errors.append(f"create {key}: {exc}")
        outcomes.deny(key, exc.message)
        return
    outcomes.created.add(key)


async def _send(api: kube_api.Api, manifest: dict[str, Any], outcomes: _Outcomes) -> Any:
    """The create, sent again (as a controller would) while it fails because the API server could not
    call the webhook: the replica that had it died (--chaos), and failurePolicy Fail refused it."""
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", manifest)
        except kube_api.ApiError as exc:
            if "failed calling webhook" not in exc.message or attempt == CREATE_ATTEMPTS - 1:
                raise
            outcomes.create_retries += 1
            await asyncio.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


async def _arrive(
    api: kube_api.Api,
    manifests: Sequence[dict[str, Any]],
    outcomes: _Outcomes,
    arrival: Arrival,
    gaps: Sequence[float],
) -> None:
    if arrival.mode == "sequential":
        for manifest in manifests:
            key = f"{NAMESPACE}/{manifest['metadata']['name']}"
            waiter = outcomes.waiter(key)
            await _create(api, manifest, outcomes)
            if not await timeouts.wait_at_most(waiter, POD_TIMEOUT):
                outcomes.errors.append(f"{key}: no outcome after {POD_TIMEOUT:.0f} s")
        return
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(manifest: dict[str, Any], at: float) -> None:
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            await _create(api, manifest, outcomes)

    offsets = [0.0] * len(manifests)
    if arrival.mode == "compressed":
        elapsed = 0.0
        for i in range(len(manifests)):
            offsets[i] = elapsed / arrival.factor
            elapsed += gaps[i % len(gaps)]
    await asyncio.gather(*(one(m, at) for m, at in zip(manifests, offsets, strict=True)))


async def _until_settled(
    keys: Sequence[str],
    outcomes: _Outcomes,
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
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    listed = await api.request("GET", path, params={"labelSelector": journal_label})
    return bool(listed.get("items"))


def _start_webhook(
    plane: controlplane.ControlPlane, settings: config.Config, name: str = "webhook"
) -> tuple[Any, int, bytes]:
    """The webhook process with a serving certificate from the plane's CA; (process, port, CA PEM)."""
    directory = plane.workdir / name
    directory.mkdir(exist_ok=True)
    cert, key = plane.pki.issue("gpuslice-webhook", ips=("127.0.0.1",), dns=("localhost",))
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    (directory / "tls.key").chmod(0o600)
    document = settings_document(settings)
    # The controller (which reads this file too) recreates refused pods, as in a cluster; quickly,
    # so that a burst's last recreation comes well inside the quiet time that ends the run.
    document["requeue"]["backoffSeconds"] = REQUEUE_BACKOFF_SECONDS
    (directory / "config.yaml").write_text(yaml.safe_dump(document))
    port = controlplane.free_port()
    process = plane.spawn(
        name,
        [
            sys.executable,
            "-m",
            "gpuslice.webhook.main",
            f"--config={directory / 'config.yaml'}",
            f"--tls-cert-file={directory / 'tls.crt'}",
            f"--tls-private-key-file={directory / 'tls.key'}",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--kubeconfig={plane.admin_kubeconfig}",
            "--log-level=WARNING",
        ],
        env={"PYTHONUNBUFFERED": "1"},
    )

    plane._wait(process, f"gpuslice {name}", functools.partial(_webhook_ready, plane, port), timeout=60)
    return process, port, plane.pki.ca_pem


def _webhook_ready(plane: controlplane.ControlPlane, port: int) -> bool:
    status, _ = controlplane._https_get(f"https://127.0.0.1:{port}/readyz", plane.ca_file)
    return status == 200


def _start_webhooks(
    plane: controlplane.ControlPlane, settings: config.Config, replicas: int | None
) -> tuple[int, bytes, list[chaos_.Target]]:
    """The webhook, or (`replicas`) that many webhook processes behind a round-robin TCP proxy
    (sim/rrproxy.py), as a Service spreads the API server's connections over a Deployment's pods
    (one replica behind it too, so that a comparison differs in the replicas alone); (port the API
    server calls, CA PEM, each replica with its own port)."""
    if replicas is None:
        process, port, ca_pem = _start_webhook(plane, settings)
        return port, ca_pem, [chaos_.Target("webhook", process, port)]
    started = []
    for i in range(replicas):
        name = "webhook" if i == 0 else f"webhook-{i}"
        process, backend, ca_pem = _start_webhook(plane, settings, name)
        started.append(chaos_.Target(name, process, backend))
    ports = [t.port for t in started]
    port = controlplane.free_port()
    proxy = plane.spawn(
        "webhook-proxy",
        [
            sys.executable,
            "-m",
            "gpuslice.sim.rrproxy",
            f"--listen=127.0.0.1:{port}",
            *(f"--backend=127.0.0.1:{p}" for p in ports),
        ],
    )

    plane._wait(proxy, "the webhook proxy", functools.partial(_webhook_ready, plane, port), timeout=30)
    return port, ca_pem, started


def start_controller(
    plane: controlplane.ControlPlane,
    config_file: str | os.PathLike[str],
    kubeconfig: str,
    *,
    name: str = "controller",
    env: Mapping[str, str] | None = None,
    log_level: str = "WARNING",
) -> tuple[Any, int]:
    """`gpuslice-controller` as its own process on 127.0.0.1 with `name` as its identity, once its
    watches have listed (leading or standing by); (process, HTTP port). The replay and the
    end-to-end tests both start it this way."""
    port = controlplane.free_port()
    process = plane.spawn(
        name,
        [
            sys.executable,
            "-m",
            "gpuslice.controller.main",
            f"--config={config_file}",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--kubeconfig={kubeconfig}",
            f"--identity={name}",
            f"--log-level={log_level}",
        ],
        env={"PYTHONUNBUFFERED": "1", **(env or {})},
    )
    plane._wait(process, f"gpuslice {name}", functools.partial(controller_answers, port, "/readyz"), timeout=60)
    return process, port


def controller_answers(port: int, path: str, expected: bytes = b"") -> bool:
    """Whether the controller at `port` answers `path` with 200 (and a body containing `expected`)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as answer:  # noqa: S310
            return bool(answer.status == 200) and expected in answer.read()
    except OSError:
        return False


def _start_controller(
    plane: controlplane.ControlPlane, webhook_ports: Sequence[int], pacing: bool, *, standby: bool = False
) -> list[chaos_.Target]:
    """The controller on the webhook's config.yaml, as the chart runs it, once it leads (with no
    POD_NAMESPACE its Lease and journal are in "default"); with pacing, once every webhook replica
    (`webhook_ports`, each asked directly) has seen its Lease renewed, so that the burst is gated
    from its first pod. `standby`: a second replica too, once its views are listed (for --chaos)."""
    config_file = plane.workdir / "webhook" / "config.yaml"
    start = functools.partial(
        start_controller,
        plane,
        config_file,
        str(plane.admin_kubeconfig),
        log_level=os.environ.get("GPUSLICE_SIM_CONTROLLER_LOG", "WARNING"),
    )
    process, port = start()
    leading = functools.partial(controller_answers, port, "/metrics", LEADING)
    plane._wait(process, "the controller to lead", leading, timeout=60)
    started = [chaos_.Target("controller", process, port)]
    if pacing:

        def gating() -> bool:
            for port in webhook_ports:
                status, body = controlplane._https_get(f"https://127.0.0.1:{port}/metrics", plane.ca_file)
                if status != 200 or b"\ngpuslice_webhook_pacer_alive 1.0" not in body:
                    return False
            return True

        plane._wait(process, "the webhook to see the controller's Lease", gating, timeout=60)
    if standby:
        name = "controller-standby"
        process, port = start(name=name)
        started.append(chaos_.Target(name, process, port))
    return started


def _webhook_configuration(port: int, ca_pem: bytes, *, side_effects: str = "None") -> dict[str, Any]:
    """One entry for every pod of the replay's namespace: the model hands every pod to `mutate` too.
    (The chart splits GPU pods and CPU pods into two entries by matchConditions; the webhook gives
    each pod the same answer either way.) In DRA mode the webhook creates claim templates, except on
    dry runs: `NoneOnDryRun`."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_NAME},
        "webhooks": [
            {
                "name": "pods.gpuslice.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": side_effects,
                "timeoutSeconds": 10,
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchPolicy": "Equivalent",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/mutate",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE]}
                    ]
                },
            }
        ],
    }


async def _webhook_in_effect(api: kube_api.Api, contract_probe: dict[str, Any], timeout: float = 30.0) -> None:
    """Until the API server sends pods to the webhook (it loads the configuration asynchronously):
    a dry-run create of a share comes back converted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = await api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", contract_probe, dry_run=True)
        limits = answer["spec"]["containers"][0].get("resources", {}).get("limits", {})
        if any(k not in ("cpu", "memory") for k in limits) or answer["spec"].get("resourceClaims"):
            return  # extended resources (device-plugin mode) or a claim (DRA mode)
        await asyncio.sleep(0.2)
    raise controlplane.ControlPlaneError("the API server never called the webhook (dry-run pod not converted)")


def _figures(
    name: str,
    arrivals: Sequence[trace.TracePod],
    outcomes: _Outcomes,
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
    in_use = sum(s.gpus_in_use() for s in fleet.sims.values())
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


async def _drive(
    plane: controlplane.ControlPlane,
    nodes: Sequence[trace.TraceNode],
    arrivals: Sequence[trace.TracePod],
    configuration: replay.Configuration,
    arrival: Arrival,
    gaps: Sequence[float],
    gpu_memory_mib: Mapping[str, int],
    started: float,
    settle_limit: float,
    progress: Callable[[int], object] | None = None,
    placements: bool = False,
    webhook_replicas: int | None = None,
    monkey: chaos_.Monkey | None = None,
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
            namespace=NAMESPACE,
            gpu_memory_mib=gpu_memory_mib,
            dra=settings.dra.enabled,
        )
        await fleet.create_nodes()
        if configuration.sharing:
            port, ca_pem, replicas = await asyncio.to_thread(_start_webhooks, plane, settings, webhook_replicas)
            await api.create(
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                _webhook_configuration(port, ca_pem, side_effects="NoneOnDryRun" if fleet.dra else "None"),
            )
            probe = trace.user_pod(trace.TracePod("gpuslice-sim-probe", 0, 0, 1, 500), contract, namespace=NAMESPACE)
            await _webhook_in_effect(api, probe)
            controllers: list[chaos_.Target] = []
            if (settings.requeue.enabled or settings.pacing.enabled) and not fleet.dra:
                standby = monkey is not None and chaos_.needs_standby(monkey.events)
                controllers = await asyncio.to_thread(
                    _start_controller, plane, [r.port for r in replicas], settings.pacing.enabled, standby=standby
                )
            if monkey is not None:  # a configuration without the webhook (whole GPUs) leaves it nothing to kill
                leading = functools.partial(controller_answers, path="/metrics", expected=LEADING)
                monkey.arm(plane, webhooks=replicas, controllers=controllers, leading=leading)
        outcomes = _Outcomes(fleet)
        watch = asyncio.create_task(
            kube_api.follow(api, f"/api/v1/namespaces/{NAMESPACE}/pods", outcomes.on_event), name="pods-watch"
        )
        await fleet.start()
        setup = time.monotonic() - started
        manifests = [
            trace.user_pod(p, contract, namespace=NAMESPACE, whole_gpus_only=not configuration.sharing)
            for p in arrivals
        ]
        keys = [f"{NAMESPACE}/{p.name}" for p in arrivals]
        t0 = time.monotonic()
        cpu0 = time.process_time()
        chaos = None
        if monkey is not None:
            chaos = asyncio.create_task(monkey.run(len(manifests), lambda: len(outcomes.created_at), t0), name="chaos")
        try:
            await _arrive(api, manifests, outcomes, arrival, gaps)
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
        result, unaccounted, lost = _figures(
            configuration.name, arrivals, outcomes, fleet, capacity, max(0.0, wall), cpu, placements=placements
        )
        end = t0 + wall
        feed = model_feed(
            [outcomes.first_outcome_at.get(k, end) - t0 for k in keys],
            [outcomes.created_at.get(k, end) - t0 for k in keys],
            [outcomes.stored.get(k) for k in keys],
        )
        diagnosis = _diagnosis(outcomes, fleet)
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
    arrival: Arrival,
    binaries: controlplane.Binaries,
    workdir: str | os.PathLike[str],
    gaps: Sequence[float] = (1.0,),
    gpu_memory_mib: Mapping[str, int] = trace.GPU_MEMORY_MIB,
    settle_limit: float = 1800.0,
    progress: Callable[[int], object] | None = None,
    placements: bool = False,
    webhook_replicas: int | None = None,
    chaos: Sequence[chaos_.Event] = (),
) -> KubeResult:
    """Replay `arrivals` on `nodes` through a fresh control plane in `workdir`, and through the model.
    `progress(n)`: n of the pods have an outcome on the control plane (called while they settle).
    `placements`: the kube run's Result also holds every pod's --placements line.
    `webhook_replicas`: that many webhook processes behind a round-robin proxy (None: one, direct).
    `chaos`: processes to kill partway through the arrivals (sim/chaos.py; chaos.check first)."""
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
    try:
        plane.start(scheduler=False, controllers=False)
        plane.start_scheduler(
            "kube-scheduler",
            configuration=scheduler_configuration(configuration.profile),
            qps=SCHEDULER_QPS,
            burst=2 * SCHEDULER_QPS,
        )
        if configuration.sharing and configuration.settings.dra.enabled:
            # Pods' claims from the webhook's templates; as fast as the scheduler binds.
            plane.start_controller_manager(kube_dra.DRA_CONTROLLERS, qps=SCHEDULER_QPS)
        version = plane.version()
        monkey = chaos_.Monkey(chaos) if chaos else None
        kube, setup, arrivals_s, unaccounted, writes, errors, feed, diagnosis, lost, retries = asyncio.run(
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
            )
        )
    finally:
        plane.stop()
    paced = None
    draws: list[float] = []
    settings = configuration.settings
    if configuration.sharing and settings.steering.enabled and not settings.dra.enabled and arrivals:
        count = 1 if arrival.mode == "sequential" else PACED_DRAWS  # one by one: nothing to draw
        paced, draws = paced_model(
            nodes, arrivals, configuration, feed, seed=seed, draws=count, gpu_memory_mib=gpu_memory_mib
        )
    return KubeResult(
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
    )


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
    flight together (CREATE_CONCURRENCY) in an order the webhook need not have seen them in, and
    orders that close apart spread the default trace's paced model over one to two points
    (docs/simulator.md, "The paced model of a burst"). So each further draw moves every conversion by
    up to half such a window (the answers' mean spacing times CREATE_CONCURRENCY / 2) either way, at
    random."""
    if draws < 1:
        raise ValueError(f"paced_model: at least one draw, got {draws}")
    ordered = [arrivals[i] for i in feed.order]
    scheduled = tuple(feed.scheduled_at[i] for i in feed.order)
    converted = tuple(feed.converted_at[i] for i in feed.order)
    answers = sorted(converted)
    spacing = (answers[-1] - answers[0]) / (len(answers) - 1) if len(answers) > 1 else 0.0
    reach = spacing * CREATE_CONCURRENCY / 2
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


# --- command line ----------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("replay on the real control plane (--scheduler kube)")
    group.add_argument(
        "--scheduler",
        choices=("model", "kube"),
        default="model",
        help="model: the Python scheduler model (default); kube: the real kube-apiserver, kube-scheduler and webhook",
    )
    group.add_argument(
        "--arrival",
        default="burst",
        help="kube: sequential (one pod at a time), burst (all at once; default) or compressed:<factor> "
        "(the trace's inter-arrival gaps divided by factor)",
    )
    group.add_argument(
        "--mode",
        type=parse_modes,
        default=("device-plugin",),
        help="kube: how the gpuslice configurations offer GPUs: extended resources from the device plugin "
        "(device-plugin, the default), ResourceSlices and ResourceClaims (dra, docs/dra.md), or both side by "
        "side in one run (device-plugin,dra)",
    )
    group.add_argument(
        "--node-sample", type=int, metavar="N", help="kube: replay on N of the trace's nodes, evenly spaced"
    )
    group.add_argument(
        "--webhook-replicas",
        type=_positive_int,
        metavar="N",
        help="kube: N webhook processes behind a round-robin TCP proxy, as a Service spreads connections over a "
        "Deployment's pods (default: one webhook, no proxy)",
    )
    group.add_argument(
        "--chaos",
        type=chaos_.parse,
        action="append",
        default=[],
        metavar="ACTION@FRACTION",
        help=f"kube: kill a process with SIGKILL once FRACTION (0-1] of the arrivals have been created; ACTION is "
        f"{chaos_.KILL_WEBHOOK_REPLICA} (needs --webhook-replicas 2 or more) or {chaos_.KILL_CONTROLLER_LEADER} "
        "(a standby controller then runs beside the leader); may be given once for each",
    )
    group.add_argument("--kube-bin", metavar="DIR", help=f"the built Kubernetes components [{controlplane.BIN_ENV}]")
    group.add_argument("--kube-workdir", metavar="DIR", help="keep the components' logs here (default: a temp dir)")


def main(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """`gpuslice-sim --scheduler kube`: prints the side-by-side report (or JSON); exit 2 on bad input."""
    try:
        arrival = parse_arrival(args.arrival)
        binaries = controlplane.find_binaries(args.kube_bin or environ.get(controlplane.BIN_ENV))
        if binaries is None:
            raise ValueError(
                f"--scheduler kube needs the built Kubernetes components ({', '.join(controlplane.BINARIES)}) "
                f"in --kube-bin or ${controlplane.BIN_ENV} (`make e2e` builds them)"
            )
        settings = config.from_args(args, environ)
        chaos_.check(
            args.chaos,
            webhook_replicas=args.webhook_replicas or 1,
            controller=settings.requeue.enabled or settings.pacing.enabled,
            dra="dra" in args.mode,
        )
        nodes_file, pods_file = trace.trace_files(args.nodes, args.pods, args.trace_dir, environ, provenance.SOURCE)
        nodes = sample_nodes(trace.load_nodes(nodes_file), args.node_sample)
        pods = trace.load_pods(pods_file)
        gaps = trace_gaps(pods_file) if arrival.mode == "compressed" else [1.0]
        capacity = replay.gpu_capacity_milli(nodes)
        if capacity == 0:
            raise trace.TraceError(f"{nodes_file}: no GPU nodes")
        if args.placements:  # a path that cannot be written is said now, not after the replays
            try:
                pathlib.Path(args.placements).open("w", encoding="utf-8").close()
            except OSError as exc:
                raise ValueError(f"--placements {args.placements}: {exc.strerror or exc}") from None
    except (ValueError, config.ConfigError) as exc:  # TraceError is a ValueError
        print(f"gpuslice-sim: {exc}", file=sys.stderr)
        return 2
    commit = provenance.source_commit()  # now: the code the replays run, not what is there after them
    chosen = {}
    for mode in args.mode:
        enabled = dataclasses.replace(settings, dra=dataclasses.replace(settings.dra, enabled=mode == "dra"))
        if mode == "dra":  # nothing to pace: the scheduler allocates from ResourceSlices (docs/steering.md)
            enabled = dataclasses.replace(enabled, pacing=dataclasses.replace(enabled.pacing, enabled=False))
        configurations = replay.configurations(
            enabled,
            percentage_of_nodes_to_score=args.percentage_of_nodes_to_score,
            binpack_strategy=args.binpack_strategy,
        )
        for name, configuration in configurations.items():
            if name in args.config_names and (mode == "device-plugin" or configuration.sharing):
                key = f"{name}-dra" if mode == "dra" else name  # whole-gpu is the same in both modes
                chosen[key] = dataclasses.replace(configuration, name=key)
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        arrivals = replay.workload(pods, capacity, args.demand, np.random.default_rng(seed))
        for name in chosen:
            workdir = pathlib.Path(args.kube_workdir or tempfile.mkdtemp(prefix="gpuslice-kube-"))
            try:
                with progress_.bar(len(arrivals), f"{name} seed {seed}") as shown:
                    result = replay_on_kube(
                        nodes,
                        arrivals,
                        chosen[name],
                        seed=seed,
                        arrival=arrival,
                        binaries=binaries,
                        workdir=workdir / f"{name}-{seed}",
                        gaps=gaps,
                        progress=functools.partial(_show_settled, shown),
                        placements=bool(args.placements),
                        webhook_replicas=args.webhook_replicas,
                        chaos=args.chaos,
                    )
            finally:
                if not args.kube_workdir:
                    shutil.rmtree(workdir, ignore_errors=True)
            runs.append((seed, result))
    meta = {
        "pods_file": pods_file.name,
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "demand": args.demand,
        "arrival": str(arrival),
        "mode": ",".join(args.mode),
        "pacing": settings.pacing.enabled,  # device-plugin mode only (DRA has nothing to pace)
        "webhook_replicas": args.webhook_replicas or 1,
        "chaos": [str(e) for e in args.chaos],
        "commit": commit,
    }
    if args.placements:
        try:
            with pathlib.Path(args.placements).open("w", encoding="utf-8") as handle:
                placements_.write(handle, ((r.kube.name, s, pods_file.name, r.kube) for s, r in runs))
        except OSError as exc:
            print(f"gpuslice-sim: --placements {args.placements}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps({**meta, "runs": [{"seed": s, **r.to_json()} for s, r in runs]}, indent=2))
    else:
        print(text_report(meta, runs))
    return 0


def _show_settled(shown: tqdm.tqdm[Any], settled: int) -> None:
    shown.update(settled - shown.n)


def _chaos_line(kill: Mapping[str, Any]) -> str:
    """One --chaos kill as the text report says it."""
    if kill.get("killed") is None:
        return f"{kill['event']}: nothing of that kind in this run, nothing killed"
    line = f"{kill['event']}: killed {kill['killed']} {kill['at_s']:.1f} s in, after {kill['after_creates']} creates"
    if "standby_leading_after_s" in kill:
        took = kill["standby_leading_after_s"]
        line += "; no standby led by the end" if took is None else f"; the standby led {took:.1f} s later"
    return line


def text_report(meta: Mapping[str, Any], runs: Sequence[tuple[int, KubeResult]]) -> str:
    lines = [
        f"gpuslice-sim --scheduler kube: {meta['pods_file']} on {meta['nodes']} nodes / {meta['gpus']} GPUs, "
        f"demand {meta['demand']:.0%}, arrival {meta['arrival']}, mode {meta.get('mode', 'device-plugin')}, "
        f"webhook replicas {meta.get('webhook_replicas', 1)}"
        + (f", Kubernetes {runs[0][1].kubernetes}" if runs else ""),
        "",
        f"{'configuration':<18}{'seed':>5} {'run':<6}{'pods':>7}{'alloc@100%':>11}{'alloc@end':>10}"
        f"{'placed':>8}{'unsched':>8}{'refused':>8}{'denied':>7}{'wall':>9}",
    ]
    for seed, run in runs:
        rows = [("kube", run.kube), ("model", run.model)]
        if run.model_paced is not None:
            rows.append(("paced", run.model_paced))
        for label, r in rows:
            lines.append(
                f"{r.name:<18}{seed:>5} {label:<6}{r.pods:>7}{r.at_demand(100):>11.2%}{r.gpu_allocation_ratio:>10.2%}"
                f"{r.placed_pods:>8}{r.failed_pods:>8}{r.admission_failures:>8}{r.denied_pods:>7}{r.runtime_s:>8.1f}s"
            )
        if len(run.paced_draws) > 1:
            lines.append(
                f"{'':<18}{'':>5} paced: the median of {len(run.paced_draws)} draws of the conversion order, "
                f"{min(run.paced_draws):.2%} to {max(run.paced_draws):.2%}"
            )
        lines.append(
            f"{'':<18}{'':>5} kube - model: {run.difference_points:+.2f} points; set-up {run.setup_s:.0f} s, "
            f"creates done after {run.arrivals_s:.1f} s, "
            f"{run.label_writes} label writes, {run.lost_pods} pods lost"
        )
        for reason, count in run.kube.admission_reasons.items():
            lines.append(f"{'':<24}lost x{count}: {reason}")
        for kill in run.chaos:
            lines.append(f"{'':<24}chaos: {_chaos_line(kill)}")
        if run.create_retries:
            lines.append(f"{'':<24}{run.create_retries} creates sent again after a failed webhook call")
        if run.unaccounted:
            lines.append(f"{'':<24}UNACCOUNTED: {len(run.unaccounted)} pods, e.g. {run.unaccounted[:3]}")
        for error in run.errors[:5]:
            lines.append(f"{'':<24}error: {error}")
    lines += [
        "",
        "unsched = the scheduler found no node (PodScheduled False); refused = refusals by a node's kubelet "
        "(UnexpectedAdmissionError; the controller's requeuer recreates a refused pod, which counts by what became "
        "of it, and a pod refused at its last attempt is lost); wall = first create to last outcome (model: its "
        "run time);",
        "model = labels seen at once; paced = the model with each node's labels written at most once per "
        "steering.labelMinIntervalSeconds, each pod converted and scheduled at the moments the kube run",
        "showed (its create answered; its first binding or unschedulable mark), converted in the order the API "
        "server stored the pods and scheduled in the order they were decided; with pods created ahead of the "
        f"scheduler, the median of {PACED_DRAWS} draws of the conversion order within what the run cannot tell apart.",
    ]
    return "\n".join(lines)
