"""Keeps the steering labels of the plugin's own Node current (issue 6).

Desired labels are recomputed from kubelet's own record every time (PodResources List: device
IDs of our resources in use; GetAllocatableResources where offered: devices kubelet no longer
offers count as not free; the plugin's health record: devices of an unhealthy GPU count as not
free), never from a running tally, so a missed event or a failed write cannot make us lose track.
Kubelet never tells a plugin that a pod ended: releases are seen by polling List every
`steering.podResourcesPollSeconds`; allocations, health changes and pods starting or ending on
the node (its pod watch) call `notify()` to refresh at once.

Writes go to the API server as a merge patch of metadata.labels holding only the labels that
changed (null removes a stale one; a change of any total or free count carries all of them, see
`labels.capacity_keys`). A change that takes something (a free count or the headroom goes down,
`labels.over_promises`) is written at once (unless `takes_at_once` is off, as in DRA mode:
dra/labeller.py); others at most one per `steering.labelMinIntervalSeconds`: notifications during
that interval coalesce, and the state written when it ends is the latest one. A failed write is
retried with exponential backoff (jittered, capped), always with the then-current desired state.
`shutdown()` at the plugin's clean exit removes every label it may have published, in one patch.

Counters go to the plugin's Prometheus registry when one is given (`registry=metrics.registry`).

The node's CPU and memory headroom comes from its allocatable (one GET of the Node per refresh)
and its pods, which `KubernetesNodeApi.watch_pods` keeps by list + watch with the field selector
`spec.nodeName=<node>` (node/nodepods.py) while the labeller runs.

May import gpuslice.{backoff,config,contract,kubeclient,quantity,timeouts} and gpuslice.node.{allocation,
health (its ALL marker), inventory, labels, nodepods, podresources}; the `kubernetes` client is used only
by `KubernetesNodeApi`, in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from decimal import Decimal
from typing import Any, Protocol

import prometheus_client

from gpuslice import backoff, config, kubeclient, quantity, timeouts
from gpuslice.node import allocation, health, inventory, labels, nodepods, podresources

__all__ = ["KubernetesNodeApi", "NodeApi", "NodeApiError", "NodeLabeller", "headroom_from"]

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 60.0
# A clean exit waits at most this long for the label removal (well inside the pod's grace period).
WITHDRAW_TIMEOUT_SECONDS = 5.0


class NodeApiError(RuntimeError):
    """A label write did not reach the API server (error status, timeout, no credentials)."""


class NodeApi(Protocol):
    async def patch_labels(self, node_name: str, labels: dict[str, str | None]) -> None:
        """Merge `labels` into the Node's metadata.labels (None removes the key)."""


class KubernetesNodeApi:
    """NodeApi with the official client: in-cluster config, else the kubeconfig; calls run in a
    thread because the client is blocking."""

    def __init__(self, api_client: Any = None, *, timeout_seconds: float = 10.0) -> None:
        self._core_api = kubeclient.LazyCoreApi(api_client)  # None: the default client, on first use
        self._timeout = timeout_seconds
        self._pods: nodepods.NodePods | None = None

    async def patch_labels(self, node_name: str, labels: dict[str, str | None]) -> None:
        await asyncio.to_thread(self._patch, node_name, {"metadata": {"labels": labels}})

    async def watch_pods(self, node_name: str, on_change: Callable[[], object] | None = None) -> None:
        """Keep the node's pods current (list + watch, field-selected on spec.nodeName) until
        cancelled: `headroom` reads them from memory instead of listing on every refresh.
        `on_change()`: a pod started or ended on the node (nodepods.NodePods)."""
        self._pods = nodepods.NodePods(
            self._core_api, node_name, on_change=on_change, request_timeout_seconds=self._timeout
        )
        await self._pods.run()

    async def headroom(self, node_name: str) -> tuple[int, int]:
        """(CPU millicores, memory MiB) of the node's allocatable that its pods have not requested,
        counted as the scheduler counts them; NodeApiError until `watch_pods` has listed them."""
        pods = self._pods
        if pods is None:
            raise NodeApiError(f"the pods of node {node_name} are not watched (watch_pods is not running)")
        if pods.listing:  # the first refresh waits for the first list rather than publish nothing
            await timeouts.wait_at_most(pods.synced.wait(), self._timeout)
        if not pods.synced.is_set():
            raise NodeApiError(f"the pods of node {node_name} are not listed yet")
        allocatable = await asyncio.to_thread(self._allocatable, node_name)
        return headroom_from(allocatable, pods.pods())

    def _allocatable(self, node_name: str) -> Mapping[str, Any]:
        import kubernetes
        import urllib3

        try:
            node = self._core_api().read_node(node_name, _request_timeout=self._timeout, _preload_content=False)
            return json.loads(node.data)["status"].get("allocatable") or {}
        except kubernetes.client.ApiException as exc:
            raise NodeApiError(f"GET node {node_name}: HTTP {exc.status} {exc.reason}") from None
        except kubernetes.config.ConfigException as exc:
            raise NodeApiError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as exc:
            raise NodeApiError(f"GET node {node_name}: {type(exc).__name__}: {exc}") from None

    def _patch(self, node_name: str, body: dict[str, Any]) -> None:
        import kubernetes  # imported here: only the production path needs it
        import urllib3

        try:
            self._core_api().patch_node(
                node_name,
                body,
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            )
        except kubernetes.client.ApiException as exc:
            raise NodeApiError(f"PATCH node {node_name}: HTTP {exc.status} {exc.reason}") from None
        except kubernetes.config.ConfigException as exc:
            raise NodeApiError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            # timeouts, refused connections, an answer that is not a Node
            raise NodeApiError(f"PATCH node {node_name}: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._core_api.close()


def headroom_from(allocatable: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(CPU millicores, memory MiB) left of `allocatable` after the requests of `pods` that still
    hold resources, each pod counted as kube-scheduler counts it (gpuslice.podrequests: sidecars,
    pod-level requests, an in-place resize at its larger side, overhead)."""
    free_cpu = _quantity(allocatable.get("cpu"))
    free_mem = _quantity(allocatable.get("memory"))
    for pod in pods:
        if nodepods.holds_resources(pod):
            used = nodepods.requests(pod)
            free_cpu -= used.get("cpu", Decimal(0))
            free_mem -= used.get("memory", Decimal(0))
    return max(0, int(free_cpu * 1000)), max(0, quantity.mib_down(free_mem))


def _quantity(value: Any) -> Decimal:
    return quantity.parse(value) if value is not None else Decimal(0)


class NodeLabeller:
    """Publishes `labels.node_labels(...)` for this node, from kubelet's record, rate-limited."""

    # What pods take is written at once (labels.over_promises): in device-plugin mode a pod the
    # scheduler sends by labels that promise too much is one kubelet refuses.
    takes_at_once = True

    def __init__(
        self,
        *,
        node: inventory.NodeInventory,
        settings: config.Config,
        node_name: str,
        pod_resources_socket: str,
        api: NodeApi | None = None,
        usage: Callable[[], int | None] | None = None,
        registry: prometheus_client.CollectorRegistry | None = None,
        unhealthy: Callable[[], Collection[str]] | None = None,
    ) -> None:
        if not node_name:
            raise ValueError("the node labeller needs the node's name (--node-name, from spec.nodeName)")
        self._node = node
        self._contract = settings.contract
        self._node_name = node_name
        self._socket = pod_resources_socket
        self._own_api = api is None
        self._api: NodeApi = api if api is not None else KubernetesNodeApi()
        self._usage = usage
        self._unhealthy = unhealthy
        self._loop: asyncio.AbstractEventLoop | None = None
        self._min_interval = settings.steering.label_min_interval_seconds
        self._poll = settings.steering.pod_resources_poll_seconds
        self._cpu_per_gpu = settings.steering.cpu_per_gpu_milli
        self._units = allocation.MemoryUnits(node, self._contract.unit_mib)
        # MIG devices shared by units (migStrategy single) are down when their GPU is
        self._parent_of = {g.uuid: g.parent_uuid for g in node.gpus if g.parent_uuid}
        self._mig_ids = {m.uuid for m in node.mig_devices()}
        self._wake = asyncio.Event()
        # Keys this labeller owns: everything it may publish. Operator labels (`<prefix>/enabled`)
        # are never in here, so they are never removed.
        self._owned_keys = set(
            labels.node_labels(
                node,
                self._contract,
                placement_score=0,
                headroom=(0, 0),
                cpu_per_gpu_milli=1,  # the balance labels are ours even with the setting at 0
            )
        )
        self._capacity_keys = labels.capacity_keys(node, self._contract)
        self.desired: dict[str, str] | None = None  # None until kubelet's record has been read
        self.written: dict[str, str] | None = None  # what the API server has, as far as we know
        self.writes = 0
        self.write_errors = 0
        self.read_errors = 0
        # A failed write waits twice the rate limit, doubling to a minute (the rate limit when longer),
        # jittered: nodes recovering from the same API server outage spread out.
        self._retry = backoff.Backoff(2 * self._min_interval, max(MAX_BACKOFF_SECONDS, self._min_interval), jitter=0.5)
        self._metrics = _Metrics(registry) if registry is not None else None

    def notify(self) -> None:
        """An allocation or health change happened: refresh soon (bursts coalesce). Safe to call
        from any thread."""
        loop = self._loop
        if loop is not None and not _running_on(loop):
            loop.call_soon_threadsafe(self._wake.set)
        else:
            self._wake.set()

    async def run(self) -> None:
        """Until cancelled."""
        loop = self._loop = asyncio.get_running_loop()
        next_write_at = loop.time()
        client = podresources.Client(self._socket)
        watch = getattr(self._api, "watch_pods", None)  # KubernetesNodeApi: the node's pods for the headroom
        # A pod that starts without a device (no Allocate, no notify()) moves the CPU and memory
        # headroom all the same: the watch wakes the labeller, not only the poll.
        pods_task = (
            asyncio.create_task(watch(self._node_name, self.notify), name="deviceplugin-node-pods") if watch else None
        )
        try:
            while True:
                await self._refresh(client)
                delta = self._delta()
                if not delta:
                    await self._sleep_or_wake(self._poll)
                    continue
                wait = next_write_at - loop.time()
                # Rate limit: re-read kubelet when the slot opens, write the latest. Except when the
                # labels now promise capacity the node no longer has and the last write worked: a
                # scheduler binds a burst in milliseconds, and every pod it sends by stale labels
                # is one kubelet refuses or one packed by an old picture of the node
                # (labels.over_promises). The rate limit still holds back loosening writes.
                if wait > 0 and (
                    self._retry.failures
                    or not self.takes_at_once
                    or not labels.over_promises(self.written or {}, delta, self._contract)
                ):
                    await self._sleep_or_wake(wait)
                    continue
                if await self._write(delta):
                    next_write_at = loop.time() + self._min_interval
                else:
                    next_write_at = loop.time() + self._retry.next()
        finally:
            if pods_task is not None:
                pods_task.cancel()
                await asyncio.gather(pods_task, return_exceptions=True)
            await client.close()

    async def shutdown(self, *, withdraw: bool = True, timeout: float = WITHDRAW_TIMEOUT_SECONDS) -> bool:
        """After `run` has ended: with `withdraw`, remove every label this labeller may have
        published, totals and free counts in one patch (a node whose plugin is gone must not draw
        pods, and the webhook reads totals without free counts as a fully free node); then close
        the API client it made. Never raises; False when the labels could not be removed."""
        removed = not withdraw
        try:
            if withdraw:
                keys = self._owned_keys | (self.written or {}).keys()
                try:
                    removal: dict[str, str | None] = dict.fromkeys(sorted(keys))
                    async with asyncio.timeout(timeout):
                        await self._api.patch_labels(self._node_name, removal)
                except Exception as exc:  # noqa: BLE001 - shutting down: say so, never block the exit
                    log.warning("node %s labels not removed at exit: %s", self._node_name, exc)
                else:
                    self.written = {}
                    removed = True
                    log.info("node %s: removed %d gpuslice labels", self._node_name, len(keys))
        finally:
            if self._own_api and isinstance(self._api, KubernetesNodeApi):
                self._api.close()
        return removed

    # --- steps ------------------------------------------------------------------------------

    async def _refresh(self, client: podresources.Client) -> None:
        wanted = self._contract.is_gpuslice_resource
        try:
            in_use = await client.devices_in_use(wanted)
            allocatable = await client.allocatable_devices(wanted)
        except podresources.PodResourcesError as exc:
            self.read_errors += 1
            if self._metrics:
                self._metrics.reads.labels("error").inc()
            log.warning("node labels not refreshed: %s (retrying in %.1fs)", exc, self._poll)
            return
        if self._metrics:
            self._metrics.reads.labels("ok").inc()
        score = await self._score()
        self.desired = self._labels_for(in_use, allocatable, score, await self._headroom())

    def _labels_for(
        self,
        in_use: Mapping[str, set[str]],
        allocatable: Mapping[str, set[str]] | None,
        score: int | None,
        headroom: tuple[int, int] | None = None,
    ) -> dict[str, str]:
        """Labels from kubelet's record: units in use per GPU, MIG devices in use. Units of an
        unhealthy GPU, unhealthy MIG devices and devices kubelet does not offer as allocatable
        count as in use: a free block there would draw a pod that kubelet then cannot admit."""
        memory = self._contract.gpu_memory_resource
        taken_units = set(in_use.get(memory, ()))
        taken_mig = {d for name, ids in in_use.items() if name != memory for d in ids}
        sick = set(self._unhealthy()) if self._unhealthy is not None else set()
        if sick:
            every = health.ALL in sick
            taken_units |= {
                d for d, gpu in self._units.gpu_of.items() if every or gpu in sick or self._parent_of.get(gpu) in sick
            }
            taken_mig |= {m.uuid for m in self._node.mig_devices() if every or m.uuid in sick or m.parent_uuid in sick}
        if allocatable is not None:
            # Only trust the allocatable view for a resource kubelet reports at all: right after
            # registration it may not list ours yet, and "none allocatable" would hide the node.
            if allocatable.get(memory):
                taken_units |= set(self._units.device_ids) - allocatable[memory]
            offered_mig = {d for name, ids in allocatable.items() if name != memory for d in ids}
            if offered_mig:
                taken_mig |= self._mig_ids - offered_mig
        allocated: dict[str, int] = {}
        for device_id in taken_units:
            gpu = self._units.gpu_of.get(device_id)
            if gpu is not None:  # IDs from another unit size or node layout are not ours to count
                allocated[gpu] = allocated.get(gpu, 0) + 1
        return labels.node_labels(
            self._node,
            self._contract,
            allocated=allocated,
            allocated_mig=taken_mig & self._mig_ids,
            placement_score=score,
            headroom=headroom,
            cpu_per_gpu_milli=self._cpu_per_gpu,
        )

    async def _headroom(self) -> tuple[int, int] | None:
        """The node's CPU and memory headroom, when the API offers it (KubernetesNodeApi does).
        A failed read drops the headroom labels until the next refresh: the webhook then treats
        the node's CPU and memory as unknown rather than acting on a stale figure."""
        read = getattr(self._api, "headroom", None)
        if read is None:
            return None
        try:
            return await read(self._node_name)
        except NodeApiError as exc:
            log.warning("node CPU/memory headroom not refreshed: %s", exc)
            return None

    async def _score(self) -> int | None:
        if self._usage is None:
            return None
        try:
            return await asyncio.to_thread(self._usage)  # NVML calls block
        except Exception as exc:  # noqa: BLE001 - a broken scorer must not stop the labels
            log.warning("placement score unavailable: %s", exc)
            return None

    def _delta(self) -> dict[str, str | None]:
        if self.desired is None:
            return {}
        previous = self.written if self.written is not None else dict.fromkeys(self._owned_keys, "")
        delta: dict[str, str | None] = {k: v for k, v in self.desired.items() if previous.get(k) != v}
        for key in previous.keys() - self.desired.keys():
            delta[key] = None
        if delta.keys() & self._capacity_keys:
            # Totals and free counts travel together: the webhook reads one against the other, so
            # a patch never leaves a free count beside totals another writer removed or changed.
            delta.update({k: v for k, v in self.desired.items() if k in self._capacity_keys})
        return delta

    async def _write(self, delta: dict[str, str | None]) -> bool:
        assert self.desired is not None
        desired = dict(self.desired)
        try:
            await self._api.patch_labels(self._node_name, delta)
        except Exception as exc:  # noqa: BLE001 - any NodeApi failure is retried with backoff
            self.write_errors += 1
            if self._metrics:
                self._metrics.writes.labels("error").inc()
            log.warning(
                "node %s labels not written (attempt %d): %s",
                self._node_name,
                self._retry.failures + 1,
                exc,
            )
            return False
        self.writes += 1
        self._retry.reset()
        if self._metrics:
            self._metrics.writes.labels("ok").inc()
        self.written = desired
        self._owned_keys |= desired.keys()
        return True

    async def _sleep_or_wake(self, seconds: float) -> None:
        await timeouts.wait_at_most(self._wake.wait(), seconds)
        self._wake.clear()


class _Metrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.writes = prometheus_client.Counter(
            "gpuslice_node_label_writes",
            "Label patches of the plugin's own Node, by result (ok, error)",
            ["result"],
            registry=registry,
        )
        self.reads = prometheus_client.Counter(
            "gpuslice_pod_resources_reads",
            "Reads of kubelet's PodResources API, by result (ok, error)",
            ["result"],
            registry=registry,
        )


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # called from a thread without a loop
        return False
