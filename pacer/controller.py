"""The pacer: releases gated pods so that no node takes a share before its labels show the last one.

Two watches (gpuslice.listwatch) feed it: every pod not finished, cluster-wide, and every node.
From them the ledger (pacer/ledger.py) knows which nodes lag. The release loop removes the gate of
the next gated pod (pacer/release.py, in order of priority and age) when fewer than
`pacing.maxInFlight` released pods are still on their way to the scheduler (neither bound nor
marked unschedulable, for at most `pacing.bindTimeoutSeconds`) and, on every node the pod could be
placed on (gpuslice.affinity), it fits beside every pod that could land there too: the pods in
flight that could be placed there and those bound there that its labels do not count yet
(pacer/room.py: GPUs touched against the GPUs the labels show free). A node that has lagged for
`pacing.lagTimeoutSeconds` holds no one back (its kubelet admits nothing). It watches
on every controller replica but releases only on the leader (`set_leading`, controller/leader.py),
whose Lease the webhook reads: it gates only while a leader renews it. A replica that takes over
counts the pods its predecessor released and the scheduler has not placed yet as in flight, where
they could be anywhere.

So pods go together wherever they cannot race: to different GPU classes, and within a class while
the nodes they could share have a free GPU for each. Where a node has no free GPU left for the
next one, that pod waits until the pods that could land there are placed and the labels count
them. A pod that asks for no device (a CPU pod the webhook gated to keep its place in line) goes as
soon as it is first.

May import gpuslice.{affinity,backoff,compact,config,contract,listwatch,timeouts}, the pacer's own
modules, prometheus_client and the kubernetes client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import kubernetes
import prometheus_client

from gpuslice import affinity, compact, config, listwatch, timeouts
from gpuslice.pacer import ledger as ledger_
from gpuslice.pacer import release, room

__all__ = ["Pacer"]

log = logging.getLogger(__name__)


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _written(pod: Mapping[str, Any]) -> int:
    """When the pod was last written, as the API server counts (its resourceVersion); 0 if unknown."""
    version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
    return int(version) if version.isdigit() else 0


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping)
        and c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


class _Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry | None) -> None:
        self.released = prometheus_client.Counter(
            "gpuslice_pacer_released_total",
            "Gated pods released, by whether they take a device",
            ["pod"],
            registry=registry,
        )
        self.failures = prometheus_client.Counter(
            "gpuslice_pacer_release_failures_total", "Releases the API server refused", ["status"], registry=registry
        )
        self.gated = prometheus_client.Gauge(
            "gpuslice_pacer_gated_pods", "Pods waiting for the pacer", registry=registry
        )
        self.lagging = prometheus_client.Gauge(
            "gpuslice_pacer_lagging_nodes",
            "Nodes whose labels do not yet count the pods bound to them",
            registry=registry,
        )


class _Pods(listwatch.PodWatch):
    def __init__(self, api: kubernetes.client.CoreV1Api, pacer: Pacer) -> None:
        super().__init__(
            lambda: api,
            "pods not finished",
            "status.phase!=Succeeded,status.phase!=Failed",
            compact=True,
            stream_lists=True,
        )
        self.pacer = pacer

    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return compact.pod(obj, self.pacer.contract)

    def listed(self, page: Sequence[Mapping[str, Any]]) -> None:
        self.pacer.listed_pods(page)

    def list_started(self) -> None:
        self.pacer.list_started()

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.pacer.replace_pods(items)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.pacer.on_pod(kind, obj)


class _Nodes(listwatch.ListWatch):
    def __init__(self, api: kubernetes.client.CoreV1Api, pacer: Pacer) -> None:
        super().__init__(lambda: api.list_node, "nodes")
        self.pacer = pacer

    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return compact.node(obj)

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.pacer.ledger.replace_nodes(items)
        self.pacer.changed.set()

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.pacer.ledger.remove_node(str((obj.get("metadata") or {}).get("name") or ""))
        else:
            name = str((obj.get("metadata") or {}).get("name") or "")
            lagged = name in self.pacer.ledger.lagging
            self.pacer.ledger.update_node(obj)
            if lagged and name not in self.pacer.ledger.lagging:
                log.debug("labels of %s caught up", name)
        self.pacer.changed.set()


@dataclasses.dataclass(frozen=True)
class _Flight:
    """A released pod on its way to the scheduler (neither bound nor found unschedulable)."""

    deadline: float  # it counts as in flight until then at most (pacing.bindTimeoutSeconds)
    demand: dict[str, int]  # what it takes (ledger.pod_demand)
    nodes: frozenset[str] | None = None  # where it could be placed, by the labels at release; None: anywhere


class Pacer:
    """`run()` until cancelled."""

    def __init__(
        self,
        api: kubernetes.client.CoreV1Api,
        settings: config.Config,
        *,
        registry: prometheus_client.CollectorRegistry | None = None,
        leading: bool = True,
    ) -> None:
        self.api = api
        self.leading = leading  # releases only while this replica leads (controller/leader.py)
        self.settings = settings
        self.contract = settings.contract
        self.ledger = ledger_.Ledger(self.contract)
        self.changed = asyncio.Event()
        self.metrics = _Metrics(registry)
        self._gated: dict[str, release.Gated] = {}  # uid -> the latest gated version seen
        self._queue: list[release.Gated] = []  # heap; entries no longer in _gated are skipped
        self._released: set[str] = set()  # released, until the pod is bound or goes
        self._in_flight: dict[str, _Flight] = {}  # released pods taking a device, not yet bound or unschedulable
        self._attempts: dict[str, int] = {}
        # uid -> when the pacer first saw it: the resourceVersion it had then (a watch brings pods in
        # the order they are written; a list, in the order they were last written)
        self._seen: dict[str, int] = {}
        self._listing: set[str] = set()  # UIDs of the list being read
        # released by anyone, taking a device, not yet bound nor unschedulable -> what it takes
        self._loose: dict[str, dict[str, int]] = {}
        self.pods = _Pods(api, self)
        self.nodes = _Nodes(api, self)

    @property
    def synced(self) -> bool:
        return self.pods.synced.is_set() and self.nodes.synced.is_set()

    # --- what the watches say ----------------------------------------------------------------
    def listed_pods(self, page: Sequence[Mapping[str, Any]]) -> None:
        """A page of a list, each pod taken at once: 100,000 pods are never held together."""
        for pod in page:
            self._listing.add(_uid(pod))
            self.ledger.update_pod(pod)
            self._track(pod)

    def list_started(self) -> None:
        """A list of the pods begins (again, if one failed part-way): only its own pods count as listed."""
        self._listing = set()

    def replace_pods(self, items: Sequence[Mapping[str, Any]]) -> None:
        """A list is whole (`items`: its pods, or none when its pages came to `listed_pods`): the
        pods it did not show went meanwhile."""
        self.listed_pods(items)
        listed, self._listing = self._listing, set()
        self.ledger.keep_only(listed)
        for uid in set(self._gated) - listed:
            del self._gated[uid]
        for uid in set(self._in_flight) - listed:
            del self._in_flight[uid]
        self._released &= listed
        for uid in set(self._loose) - listed:
            del self._loose[uid]
        for uid in set(self._seen) - listed:
            del self._seen[uid]
        self.changed.set()

    def on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        uid = _uid(pod)
        if kind == "DELETED":  # deleted, or finished (it left the watch's selection)
            self.ledger.forget_pod(uid)
            self._gated.pop(uid, None)
            self._in_flight.pop(uid, None)
            self._released.discard(uid)
            self._attempts.pop(uid, None)
            self._seen.pop(uid, None)
            self._loose.pop(uid, None)
        else:
            self.ledger.update_pod(pod)
            self._track(pod)
        self.changed.set()

    def _track(self, pod: Mapping[str, Any]) -> None:
        uid = _uid(pod)
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        if uid in self._in_flight and (bound or _unschedulable(pod)):
            del self._in_flight[uid]
            log.debug("%s %s", "bound" if bound else "unschedulable", (pod.get("metadata") or {}).get("name"))
        if bound:
            self._released.discard(uid)
            self._attempts.pop(uid, None)
        if uid not in self._seen:
            # A list comes by name: pods not seen yet are ordered by when they were last written,
            # which for a pod waiting at its gate is when it was created (or last re-gated).
            self._seen[uid] = _written(pod)
        entry = release.gated(pod, self.contract, self._seen[uid]) if uid not in self._released else None
        spec = pod.get("spec") or {}
        demand = ledger_.pod_demand(spec, self.contract) if not bound and not spec.get("schedulingGates") else {}
        if demand and not _unschedulable(pod):
            self._loose[uid] = demand
        else:
            self._loose.pop(uid, None)
        if entry is None:
            self._gated.pop(uid, None)
        elif uid not in self._gated or self._gated[uid].resource_version != entry.resource_version:
            self._gated[uid] = entry
            heapq.heappush(self._queue, entry)

    def set_leading(self, leading: bool) -> None:
        """Release (or stop releasing). Taking over, the pods released before (by the last leader)
        that the scheduler has not placed yet count as in flight, where they could be anywhere."""
        self.leading = leading
        if leading:
            until = asyncio.get_running_loop().time() + self.settings.pacing.bind_timeout_seconds
            for uid, demand in self._loose.items():
                self._in_flight.setdefault(uid, _Flight(until, demand))
        self.changed.set()

    # --- releasing -----------------------------------------------------------------------------
    def _next(self) -> release.Gated | None:
        """The first gated pod in release order (stale heap entries dropped on the way)."""
        while self._queue:
            entry = self._queue[0]
            current = self._gated.get(entry.uid)
            if current is not None and current.resource_version == entry.resource_version:
                return entry
            heapq.heappop(self._queue)
        return None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        feeds = [
            asyncio.create_task(self.pods.run(), name="pacer-pods-watch"),
            asyncio.create_task(self.nodes.run(), name="pacer-nodes-watch"),
        ]
        pacing = self.settings.pacing
        try:
            await asyncio.gather(self.pods.synced.wait(), self.nodes.synced.wait())
            log.info("pacer watching: %d gated pods, %d lagging nodes", len(self._gated), len(self.ledger.lagging))
            while True:
                self.changed.clear()
                now = loop.time()
                if not self.leading:  # a standby keeps its view current and waits to take over
                    self.metrics.gated.set(len(self._gated))
                    await self.changed.wait()
                    continue
                for uid, flight in list(self._in_flight.items()):
                    if flight.deadline <= now:
                        del self._in_flight[uid]
                while (entry := self._next()) is not None:
                    # A pod that asks for no device (a CPU pod the webhook gated to keep its place in
                    # line) cannot be refused by a device plugin: it goes as soon as it is first.
                    demand = ledger_.pod_demand(entry.spec, self.contract)
                    nodes: frozenset[str] = frozenset()
                    if demand:
                        if len(self._in_flight) >= pacing.max_in_flight:
                            break  # a binding wakes us
                        nodes = self._candidates(entry)
                        if not self._has_room(demand, nodes, loop.time()):
                            break  # a binding or a label write wakes us
                    heapq.heappop(self._queue)
                    del self._gated[entry.uid]
                    until = loop.time() + pacing.bind_timeout_seconds if demand else None
                    await self._release(entry, until, nodes, demand)
                self.metrics.gated.set(len(self._gated))
                self.metrics.lagging.set(len(self.ledger.lagging))
                # Wake for the first in-flight deadline, and for a lag about to time out.
                moments = [
                    *(flight.deadline for flight in self._in_flight.values()),
                    *(t + pacing.lag_timeout_seconds for t in self.ledger.lagging.values()),
                ]
                timeout = min((m for m in moments if m > now), default=now + 1.0) - loop.time()
                if not self.changed.is_set():
                    await timeouts.wait_at_most(self.changed.wait(), max(0.01, timeout))
        finally:
            self.pods.stop()
            self.nodes.stop()
            for task in feeds:
                task.cancel()
            await asyncio.gather(*feeds, return_exceptions=True)

    def _candidates(self, entry: release.Gated) -> frozenset[str]:
        """The nodes the pod could be placed on, by their labels now: its nodeSelector and required
        node affinity, as the scheduler's NodeAffinity filter reads them. Taints, resources and pod
        affinity are not looked at: a node they rule out is one the pod waits for needlessly,
        never one it is sent to by stale labels."""
        return frozenset(n for n in self.ledger.names() if affinity.admits(entry.spec, n, self.ledger.labels(n)))

    def _has_room(self, demand: dict[str, int], nodes: frozenset[str], now: float) -> bool:
        """Whether a pod taking `demand` fits, on each node of `nodes` (where it could be placed), beside
        every pod that could land there too: in flight and possibly placed there (anywhere, for one
        in flight since before this pacer knew where it could go), and bound there but not yet in its
        labels (pacer/room.py). A node that lags with no such pod known waits as before; one that
        has lagged for lagTimeoutSeconds admits nothing and holds no one back."""
        anywhere = [flight.demand for flight in self._in_flight.values() if flight.nodes is None]
        landing: dict[str, list[dict[str, int]]] = {}
        for flight in self._in_flight.values():
            for name in (flight.nodes or frozenset()) & nodes:
                landing.setdefault(name, []).append(flight.demand)
        limit = self.settings.pacing.lag_timeout_seconds
        for name in nodes:
            since = self.ledger.lagging.get(name)
            if since is not None and now - since >= limit:
                continue
            unlabelled = self.ledger.unlabelled(name)
            if since is not None and not unlabelled:
                return False  # lagging for a reason the ledger cannot name: wait for its labels
            others = [*anywhere, *landing.get(name, ()), *unlabelled]
            if others and not room.fit_together(
                [demand, *others], self.ledger.allocatable(name), self.ledger.labels(name), self.contract
            ):
                return False
        return True

    async def _release(
        self,
        entry: release.Gated,
        deadline: float | None,
        nodes: frozenset[str] = frozenset(),
        demand: dict[str, int] | None = None,
    ) -> None:
        """Let `entry` go; until `deadline` (None: it takes no device) it counts as in flight, with
        `nodes` where it could be placed and `demand` what it takes."""
        attempts = self._attempts.get(entry.uid, 0)
        ops = release.patch(entry, self.contract)
        try:
            await asyncio.to_thread(self.api.patch_namespaced_pod, entry.name, entry.namespace, ops)
        except kubernetes.client.ApiException as exc:
            self.metrics.failures.labels(str(exc.status)).inc()
            if exc.status == 404:
                return  # gone
            self._attempts[entry.uid] = attempts + 1
            log.warning(
                "could not release %s/%s (HTTP %s, attempt %d): %s",
                entry.namespace,
                entry.name,
                exc.status,
                attempts + 1,
                (exc.body or exc.reason or "")[:300],
            )
        except Exception as exc:  # noqa: BLE001 - the API server unreachable: try again shortly
            self.metrics.failures.labels("error").inc()
            self._attempts[entry.uid] = attempts + 1
            log.warning("could not release %s/%s: %s", entry.namespace, entry.name, exc)
        else:
            log.debug("released %s/%s", entry.namespace, entry.name)
            self._attempts.pop(entry.uid, None)
            self._released.add(entry.uid)
            if deadline is not None:
                self._in_flight[entry.uid] = _Flight(deadline, demand or {}, nodes)
            self.metrics.released.labels("device" if deadline is not None else "none").inc()
            return
        # Refused (its version moved on) or not answered: wait a little, longer each time, and take
        # the pod as the API server has it now; a conflict usually succeeds at once the next time.
        await asyncio.sleep(min(5.0, 0.05 * 2**attempts))
        await self._reread(entry)

    async def _reread(self, entry: release.Gated) -> None:
        """Queue the pod again as the API server has it now (its next watch event may be far off)."""
        try:
            response: Any = await asyncio.to_thread(
                self.api.read_namespaced_pod, entry.name, entry.namespace, _preload_content=False
            )
        except Exception as exc:  # noqa: BLE001 - gone or unreachable: the watch will tell
            log.debug("could not read %s/%s again: %s", entry.namespace, entry.name, exc)
            return
        self._track(json.loads(response.data))
